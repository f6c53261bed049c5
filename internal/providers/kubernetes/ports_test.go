package kubernetes

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// A declared port is reached on 127.0.0.1 through the API server's
// port-forward (never the pod's address), again after the forward's
// server restarts, and not at all after the delete.
func TestPortForward(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{Ports: []int{8080}})
	ctx := ctxT(t, 2*time.Minute)
	res, err := p.Exec(ctx, id, providers.ExecRequest{Command: "echo served-from-the-pod > /var/www/index.html && httpd -p 8080 -h /var/www", PreserveBackground: true})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("start httpd: %v %+v", err, res)
	}
	ep, err := p.Endpoint(ctx, id, 8080)
	if err != nil {
		t.Fatal(err)
	}
	get := func() (string, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", ep.URL+"/index.html", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return string(b), err
	}
	if body, err := get(); err != nil || body != "served-from-the-pod\n" {
		t.Fatalf("GET %s: %q %v", ep.URL, body, err)
	}
	if again, err := p.Endpoint(ctx, id, 8080); err != nil || again.URL != ep.URL {
		t.Fatalf("second Endpoint: %v %v, want the same forward %s", again, err, ep.URL)
	}
	if err := p.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := get(); err == nil {
		t.Fatal("the forward still answers after the delete")
	}
	if _, err := p.Endpoint(ctx, id, 8080); providers.Kind(err) != providers.ErrNotFound {
		t.Fatalf("Endpoint after the delete: %v, want not found", err)
	}
	http.DefaultClient.CloseIdleConnections()
}
