package hostfw

import (
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testConfig is a set of rules of the test's own; it needs root and
// iptables (a skip outside CI, a failure in CI).
func testConfig(t *testing.T) Config {
	t.Helper()
	testkit.RequireRoot(t)
	_, err := findTool()
	testkit.Need(t, "iptables", err)
	b := make([]byte, 2)
	rand.Read(b)
	n := hex.EncodeToString(b)
	return Config{Chain: "SGT-" + strings.ToUpper(n), Prefix: "sgt" + n + "-", LockDir: t.TempDir()}
}

func installed(t *testing.T, cfg Config) bool {
	t.Helper()
	ok, err := Installed(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestLastCloseRemoves: two gateways hold the rules; the first to close
// leaves them, the last removes them; a sandbox bridge left behind keeps
// them until it goes (RemoveUnused then removes them).
func TestLastCloseRemoves(t *testing.T) {
	cfg := testConfig(t)
	t.Cleanup(func() {
		if _, err := RemoveUnused(cfg); err != nil {
			t.Error(err)
		}
	})
	f1, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f1.Close() })
	f2, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f2.Close() })
	if !installed(t, cfg) {
		t.Fatal("not installed after Open")
	}
	// Both hooks once: the second Open found them.
	out, err := f1.ipt.run("-S", "INPUT")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, cfg.inputChain()); n != 1 {
		t.Fatalf("%d INPUT hooks:\n%s", n, out)
	}
	if err := f1.Close(); err != nil {
		t.Fatal(err)
	}
	if !installed(t, cfg) {
		t.Fatal("the first Close removed the rules another gateway holds")
	}

	// A bridge of the prefix: a sandbox that outlives its gateway.
	br := cfg.BridgeName("left-behind")
	if out, err := exec.Command("ip", "link", "add", br, "type", "bridge").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v %s", err, out)
	}
	linkUp := true
	t.Cleanup(func() {
		if linkUp {
			exec.Command("ip", "link", "del", br).Run()
		}
	})
	if err := f2.Close(); err != nil {
		t.Fatal(err)
	}
	if !installed(t, cfg) {
		t.Fatal("the last Close removed the rules while a sandbox bridge is left")
	}
	if out, err := exec.Command("ip", "link", "del", br).CombinedOutput(); err != nil {
		t.Fatalf("ip link del: %v %s", err, out)
	}
	linkUp = false
	if removed, err := RemoveUnused(cfg); !removed || err != nil {
		t.Fatalf("RemoveUnused with no gateway and no bridge: %v %v", removed, err)
	}
	if installed(t, cfg) {
		t.Fatal("rules left after RemoveUnused")
	}
}

// TestBridgeName: 15 characters (IFNAMSIZ-1), the prefix, stable per key.
func TestBridgeName(t *testing.T) {
	c := Config{}
	a, b := c.BridgeName("inst/sbx-1"), c.BridgeName("inst/sbx-2")
	if len(a) != 15 || !strings.HasPrefix(a, DefaultPrefix) || a == b || a != c.BridgeName("inst/sbx-1") {
		t.Fatalf("bridge names %q %q", a, b)
	}
	if _, err := (Config{Prefix: "x"}).withDefaults(); err == nil {
		t.Fatal("a 1-character prefix was accepted")
	}
}
