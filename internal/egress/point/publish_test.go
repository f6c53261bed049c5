package point_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/egress/point"
)

// readTag dials addr (in the test's namespace) and returns what it says
// before closing, "" when the dial or read fails.
func readTag(addr string) string {
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	return string(b)
}

// TestPublish: a port of an attached sandbox (policy none: no way out) is
// served on 127.0.0.1 in the gateway's namespace, one listener per port; a
// port nothing listens on is reset; detaching closes the listener; a
// sandbox that is not attached is refused.
func TestPublish(t *testing.T) {
	p, err := point.New(point.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	sb := newBox(t)
	if _, err := p.Attach("sbx-pub", sb.path, mustRules(t, nil, nil)); err != nil {
		t.Fatal(err)
	}
	sb.serve(t, "in the box")

	ap, err := p.Publish("sbx-pub", 7000)
	if err != nil {
		t.Fatal(err)
	}
	if !ap.Addr().IsLoopback() || ap.Port() == 7000 || ap.Port() == 0 {
		t.Fatalf("published at %s: want 127.0.0.1 and a random port", ap)
	}
	if got := readTag(ap.String()); got != "in the box" {
		t.Errorf("through the published port: %q", got)
	}
	if again, err := p.Publish("sbx-pub", 7000); err != nil || again != ap {
		t.Errorf("Publish again: %s %v, want %s", again, err, ap)
	}
	closed, err := p.Publish("sbx-pub", 7001)
	if err != nil {
		t.Fatal(err)
	}
	// Reset: at the dial or at the first read (never bytes, never a hang).
	if c, err := net.DialTimeout("tcp4", closed.String(), 5*time.Second); err == nil {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n > 0 || isTimeout(err) {
			t.Errorf("a port nothing serves: read %d bytes, %v; want a reset or EOF", n, err)
		}
		c.Close()
	}
	if _, err := p.Publish("sbx-other", 7000); err == nil {
		t.Error("published a port of a sandbox that is not attached")
	}

	p.Detach("sbx-pub")
	if c, err := net.DialTimeout("tcp4", ap.String(), 5*time.Second); err == nil {
		c.Close()
		t.Error("the listener outlived the detach")
	}
}
