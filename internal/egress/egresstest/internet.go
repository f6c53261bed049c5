// Package egresstest is a test "internet": HTTP and HTTPS servers on
// documentation addresses inside a network namespace the test makes and
// tears down, for the egress point's tests and benchmarks.
package egresstest

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Hosts are the internet's names and addresses; CIDRHost has no name.
var (
	A        = netip.MustParseAddr("198.51.100.1")
	B        = netip.MustParseAddr("198.51.100.2")
	CIDRHost = netip.MustParseAddr("203.0.113.5")
	Names    = map[string]netip.Addr{"a.test": A, "b.test": B}
)

// Internet is a running test internet. Every server answers
// GET /who with "<server name> <local address>" (the name is the TLS SNI
// on HTTPS, the Host on HTTP) and GET /bytes?n=N with N zero bytes.
type Internet struct {
	// NetnsPath is the namespace's file (/proc/PID/ns/net), for
	// --egress-netns.
	NetnsPath string
	// CertPEM is the self-signed certificate every HTTPS server presents
	// (SANs a.test, b.test and the three addresses).
	CertPEM []byte

	cmd     *exec.Cmd
	ns      netns.NsHandle
	servers []*http.Server
	wg      sync.WaitGroup
}

// ResolveFlag is the --egress-resolve value naming a.test and b.test.
func ResolveFlag() string { return "a.test=" + A.String() + ",b.test=" + B.String() }

// Start makes the namespace (a sleeping child in its own CLONE_NEWNET,
// killed by Close), its loopback holding the three addresses, and the
// servers on ports 80 and 443 of each. Close is registered with t.Cleanup.
func Start(t testing.TB) *Internet {
	t.Helper()
	cmd, path := Netns(t)
	in := &Internet{cmd: cmd, NetnsPath: path, ns: -1}
	t.Cleanup(in.Close)
	ns, err := netns.GetFromPath(in.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	in.ns = ns
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	// The addresses sit on lo: the namespace has no other link, and
	// connections dialled from it (the egress point's) reach them there.
	for _, a := range []netip.Addr{A, B, CIDRHost} {
		if err == nil {
			err = h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}})
		}
	}
	if err != nil {
		t.Fatalf("internet links: %v", err)
	}
	cert, pemBytes := selfSigned(t)
	in.CertPEM = pemBytes
	var lns []net.Listener
	err = point.InNetns(ns, func() error {
		for _, port := range []int{80, 443} {
			ln, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port))
			if err != nil {
				return err
			}
			lns = append(lns, ln)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("internet listeners: %v", err)
	}
	plain := &http.Server{Handler: handler(func(r *http.Request) string { return r.Host }), ReadHeaderTimeout: 10 * time.Second}
	secure := &http.Server{
		Handler:           handler(func(r *http.Request) string { return r.TLS.ServerName }),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}},
	}
	in.servers = []*http.Server{plain, secure}
	in.wg.Add(2)
	go func() { defer in.wg.Done(); _ = plain.Serve(lns[0]) }()
	go func() { defer in.wg.Done(); _ = secure.ServeTLS(lns[1], "", "") }()
	return in
}

// Who is ServeWho's servers.
type Who struct {
	HTTP, HTTPS int // ports

	mu    sync.Mutex
	hello []string // guarded by mu: the SNIs of ClientHellos the HTTPS server read
}

// Hellos are the server names of the TLS ClientHellos the HTTPS server
// read so far (a client whose handshake then fails, as busybox's
// ssl_client with Go's server, still got through to it).
func (w *Who) Hellos() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.hello)
}

// ServeWho serves the internet's HTTP and HTTPS handlers on two new
// listeners at addr (an address of the test's host, e.g. one pods reach)
// until t ends.
func ServeWho(t testing.TB, addr netip.Addr) *Who {
	t.Helper()
	cert, _ := selfSigned(t)
	w := &Who{}
	serve := func(srv *http.Server, secure bool) int {
		ln, err := net.Listen("tcp4", net.JoinHostPort(addr.String(), "0"))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if secure {
				_ = srv.ServeTLS(ln, "", "")
			} else {
				_ = srv.Serve(ln)
			}
		}()
		t.Cleanup(func() { _ = srv.Close(); <-done })
		return ln.Addr().(*net.TCPAddr).Port
	}
	w.HTTP = serve(&http.Server{Handler: handler(func(r *http.Request) string { return r.Host }), ReadHeaderTimeout: 10 * time.Second}, false)
	w.HTTPS = serve(&http.Server{
		Handler:           handler(func(r *http.Request) string { return r.TLS.ServerName }),
		ReadHeaderTimeout: 10 * time.Second,
		// Busybox's TLS 1.2 client fails every handshake (see Hellos).
		ErrorLog: log.New(io.Discard, "", 0),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			w.mu.Lock()
			w.hello = append(w.hello, h.ServerName)
			w.mu.Unlock()
			return nil, nil
		}},
	}, true)
	return w
}

// Netns starts a sleeping child in a new network namespace (only lo, down)
// and returns it and its namespace file. The caller kills and waits for it
// (Start's Close does); it also dies with the test process.
func Netns(t testing.TB) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command("sleep", "3600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("netns: %v", err)
	}
	return cmd, "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net"
}

// OpenNetns is Netns for a test: the child is killed and the namespace's
// handle closed when the test ends. It returns the handle and the file.
func OpenNetns(t testing.TB) (netns.NsHandle, string) {
	t.Helper()
	cmd, path := Netns(t)
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns, path
}

func handler(name func(*http.Request) string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /who", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s\n", name(r), r.Context().Value(http.LocalAddrContextKey).(net.Addr).String())
	})
	mux.HandleFunc("GET /bytes", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		_, _ = io.CopyN(w, zeros{}, n)
	})
	return mux
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// Close stops the servers and kills the namespace's process; the namespace
// goes with it. Safe to call twice.
func (in *Internet) Close() {
	for _, s := range in.servers {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.Shutdown(ctx)
		_ = s.Close()
		cancel()
	}
	in.servers = nil
	in.wg.Wait()
	if in.ns >= 0 {
		in.ns.Close()
		in.ns = -1
	}
	if in.cmd != nil {
		_ = in.cmd.Process.Kill()
		_ = in.cmd.Wait()
		in.cmd = nil
	}
}

func selfSigned(t testing.TB) (tls.Certificate, []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "sandgate egress test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		DNSNames:     []string{"a.test", "b.test"},
		IPAddresses:  []net.IP{A.AsSlice(), B.AsSlice(), CIDRHost.AsSlice()},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// Resolve is Names in the form point.Options.Resolve takes.
func Resolve() map[string][]netip.Addr {
	out := make(map[string][]netip.Addr, len(Names))
	for n, a := range Names {
		out[n] = []netip.Addr{a}
	}
	return out
}

// Links are the names of the links in the test process's network
// namespace (the host's).
func Links(t testing.TB) []string {
	t.Helper()
	ls, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range ls {
		names = append(names, l.Attrs().Name)
	}
	return names
}

// NewLinks are the names in after that were not in before, but for the
// links other tests' containers and networks make and remove on a shared
// host while a test runs: docker's container veths (veth…), its network
// bridges (br-…) and sandbox bridges (sgbr-…, and sgt<nonce>-… of the
// docker provider's tests). None of them can be an egress point's link
// (sg<hex>, and those are never in the host's namespace).
func NewLinks(before, after []string) []string {
	var added []string
	for _, n := range after {
		if !slices.Contains(before, n) && !otherTests(n) {
			added = append(added, n)
		}
	}
	return added
}

func otherTests(link string) bool {
	for _, p := range []string{"veth", "br-", "sgbr-"} {
		if strings.HasPrefix(link, p) {
			return true
		}
	}
	return strings.HasPrefix(link, "sgt") && strings.Contains(link, "-")
}

// DialFrom dials addr from network namespace ns (a sandbox's stand-in).
func DialFrom(ctx context.Context, ns netns.NsHandle, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := point.InNetns(ns, func() (err error) {
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// LookupFrom asks server (host:port) from network namespace ns for name's
// A records, and returns the answer's rcode and addresses.
func LookupFrom(t testing.TB, ns netns.NsHandle, server, name string) (int, []netip.Addr) {
	t.Helper()
	var resp *dns.Msg
	err := point.InNetns(ns, func() (err error) {
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), dns.TypeA)
		resp, err = dns.Exchange(q, server)
		return err
	})
	if err != nil {
		t.Fatalf("resolve %s: %v", name, err)
	}
	var out []netip.Addr
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			addr, _ := netip.AddrFromSlice(a.A)
			out = append(out, addr)
		}
	}
	return resp.Rcode, out
}

// GetFrom fetches url from network namespace ns and returns the body,
// trimmed; addr, when set, is dialled instead of the URL's host (as curl
// --resolve does). Certificates are not checked.
func GetFrom(ns netns.NsHandle, url, addr string) (string, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, hostport string) (net.Conn, error) {
			if addr != "" {
				_, port, _ := net.SplitHostPort(hostport)
				hostport = net.JoinHostPort(addr, port)
			}
			return DialFrom(ctx, ns, "tcp4", hostport)
		},
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(body)), err
}

// FetchOn sends GET path naming a.test on c (Connection: close) and reads
// the whole answer; it returns the body's size. Benchmarks' round trip.
func FetchOn(c net.Conn, path string) (int64, error) {
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n", path); err != nil {
		return 0, err
	}
	res, err := http.ReadResponse(bufio.NewReaderSize(c, 64<<10), nil)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	return io.Copy(io.Discard, res.Body)
}
