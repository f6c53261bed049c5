package main

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestPreAuthBodiesBoundedRSS: 12 requests with a forged lease and a
// 60 MiB JSON body each, sent at once (half with a declared length, half
// chunked), are each refused 401 before their body is read (or their
// connection closed), and the gateway's peak RSS stays under 300 MiB.
// A create without a key is refused the same way; a create with a key
// and a 2 MiB body gets 413.
func TestPreAuthBodiesBoundedRSS(t *testing.T) {
	t.Parallel()
	const size = 60 << 20
	g := startGateway(t, t.TempDir(), []string{"SANDGATE_API_KEYS=preauth-key"})
	forged := "sgl1.c2J4LWFhYWFhYWFhYWFhYWFhYWFhYWFhfGxzLXh8b3duZXJ8MA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	exec := g.URL + "/v1/sandboxes/sbx-aaaaaaaaaaaaaaaaaaaa/exec"
	send := func(url string, hdr map[string]string, n int64, chunked bool) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		body := io.MultiReader(strings.NewReader(`{"command": "`), &patternReader{n: int(n)})
		req, err := http.NewRequestWithContext(ctx, "POST", url, body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = n + int64(len(`{"command": "`))
		if chunked {
			req.ContentLength = -1
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		res.Body.Close()
		return res.StatusCode, nil
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, err := send(exec, map[string]string{"X-Sandbox-Lease": forged}, size, i%2 == 1)
			// A connection the gateway closed while the client was still
			// sending is a refusal too; anything else is not.
			if err != nil && !strings.Contains(err.Error(), "connection reset") && !strings.Contains(err.Error(), "broken pipe") {
				t.Errorf("forged request %d: %v", i, err)
			} else if err == nil && status != http.StatusUnauthorized {
				t.Errorf("forged request %d: %d, want 401", i, status)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if status, err := send(g.URL+"/v1/sandboxes", nil, size, false); err == nil && status != http.StatusUnauthorized {
		t.Errorf("keyless 60 MiB create: %d, want 401", status)
	}
	if status, err := send(g.URL+"/v1/sandboxes", map[string]string{"Authorization": "Bearer preauth-key"}, 2<<20, false); err == nil && status != http.StatusRequestEntityTooLarge {
		t.Errorf("2 MiB create with a key: %d, want 413", status)
	} else if err != nil {
		t.Errorf("2 MiB create with a key: %v", err)
	}
	hwm := peakRSS(t, g.cmd.Process.Pid)
	t.Logf("gateway peak RSS %d MiB after 12 forged 60 MiB bodies (refused in %v)", hwm>>20, took)
	if hwm >= 300<<20 {
		t.Fatalf("gateway peak RSS %d MiB, want < 300", hwm>>20)
	}
}

// TestHelpPrintsNoSecret: the usage texts of every command, with the
// secrets' environment twins set, print none of their values.
func TestHelpPrintsNoSecret(t *testing.T) {
	secrets := map[string]string{
		"SANDGATE_LEASE":        "sgl1.lease-value-that-must-not-show",
		"SANDGATE_API_KEYS":     "api-key-value-that-must-not-show",
		"SANDGATE_LEASE_SECRET": "lease-secret-value-that-must-not-show",
		"SANDGATE_URL":          "http://127.0.0.1:9",
	}
	for _, args := range [][]string{{"--help"}, {"serve", "--help"}, {"shell", "--help"}, {"exec", "--help"}, {"healthcheck", "--help"}} {
		cmd := exec.Command(gatewayBin, args...)
		for k, v := range secrets {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), "-") {
			t.Fatalf("%v printed no usage: %s", args, out)
		}
		for k, v := range secrets {
			if k != "SANDGATE_URL" && strings.Contains(string(out), v) {
				t.Errorf("%v prints the value of %s:\n%s", args, k, out)
			}
		}
	}
}
