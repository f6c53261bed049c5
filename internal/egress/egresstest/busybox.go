package egresstest

import (
	"fmt"
	"regexp"
)

// whoAnswer is a server's answer to GET /who.
var whoAnswer = regexp.MustCompile(`(?m)^[a-z0-9.]+ [0-9.]+:[0-9]+$`)

// WhoAnswer is the first answer to GET /who in a command's output ("<name>
// <address>:<port>"), or "" when there is none.
func WhoAnswer(out []byte) string { return whoAnswer.FindString(string(out)) }

// BusyboxWho is a shell command for a busybox sandbox (the docker test
// image) that sends GET /who to addr (a name or an address), naming host:
// as the Host of HTTP on port 80, or as the SNI and Host of HTTPS on 443.
// Debian's static busybox wget crashes, so it goes through nc, and
// ssl_client (wget's own TLS helper) for HTTPS. Its output holds the
// answer (WhoAnswer) when the request got through.
func BusyboxWho(tls bool, addr, host string) string {
	port := 80
	if tls {
		port = 443
	}
	return BusyboxWhoPort(tls, addr, port, host)
}

// BusyboxWhoPort is BusyboxWho to another port.
func BusyboxWhoPort(tls bool, addr string, port int, host string) string {
	req := fmt.Sprintf(`GET /who HTTP/1.0\r\nHost: %s\r\n\r\n`, host)
	if !tls {
		return fmt.Sprintf(`printf '%s' | timeout 8 nc -w 4 %s %d`, req, addr, port)
	}
	// nc -e runs the rest with the connection on stdin and stdout.
	return fmt.Sprintf(`timeout 8 nc -w 4 %s %d -e sh -c 'exec 3<&0; printf "%s" | ssl_client -s 3 -n %s >&2' 2>&1`, addr, port, req, host)
}
