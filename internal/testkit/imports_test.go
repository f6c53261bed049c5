package testkit

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// pkgInfo is what TestImportRules reads of `go list -json`.
type pkgInfo struct {
	ImportPath string
	Imports    []string
}

// importGraph lists every package of the module and its dependencies
// (non-test code only) with their direct imports.
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-e", "-deps", "-json=ImportPath,Imports", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	g := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkgInfo
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		g[p.ImportPath] = p.Imports
	}
	return g
}

// chain returns the import path from pkg to a package forbidden reports
// true for (shortest first), or nil if pkg reaches none.
func chain(g map[string][]string, pkg string, forbidden func(string) bool) []string {
	prev := map[string]string{pkg: ""}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p != pkg && forbidden(p) {
			var path []string
			for ; p != ""; p = prev[p] {
				path = append(path, p)
			}
			slices.Reverse(path)
			return path
		}
		for _, q := range g[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}

func isTestKit(pkg string) bool {
	return strings.HasSuffix(pkg, "test") || pkg == Module+"/internal/testkit" || strings.HasPrefix(pkg, Module+"/internal/testkit/")
}

// TestImportRules keeps the layering of the tree (STYLE.md 1): each rule
// names the packages it binds and what they must not reach, directly or
// through any dependency; a failure prints the import chain.
func TestImportRules(t *testing.T) {
	g := importGraph(t)
	m := func(p string) string { return Module + "/" + p }
	in := func(prefix string) func(string) bool {
		return func(p string) bool { return p == m(prefix) || strings.HasPrefix(p, m(prefix)+"/") }
	}
	is := func(names ...string) func(string) bool {
		return func(p string) bool { return slices.Contains(names, p) }
	}
	concrete := func(p string) bool {
		return in("internal/providers/local")(p) || in("internal/providers/docker")(p) || in("internal/providers/kubernetes")(p)
	}
	rules := []struct {
		name      string
		applies   func(string) bool
		forbidden func(string) bool
	}{
		// Handlers speak to providers through the contract only.
		{"handlers import no concrete provider", in("internal/handlers"), concrete},
		// A backend knows nothing of the service that drives it. Test
		// kits are exempt: the terminal suite runs the whole stack.
		{"providers import not the service", func(p string) bool { return in("internal/providers")(p) && !isTestKit(p) }, is(m("internal/sandbox"))},
		// The agent runs in every sandbox: it links neither the gateway's
		// service nor an HTTP stack.
		{"the agent imports neither the service nor net/http", is(m("cmd/sandgate-agent"), m("internal/agent")), is(m("internal/sandbox"), "net/http")},
	}
	for _, r := range rules {
		for pkg := range g {
			if !strings.HasPrefix(pkg, Module+"/") || !r.applies(pkg) {
				continue
			}
			if c := chain(g, pkg, r.forbidden); c != nil {
				t.Errorf("%s: %s", r.name, strings.Join(c, " -> "))
			}
		}
	}
	// Only test kits import testing outside _test.go files (a direct
	// import is the one to blame).
	for pkg, imports := range g {
		if strings.HasPrefix(pkg, Module+"/") && !isTestKit(pkg) && slices.Contains(imports, "testing") {
			t.Errorf("non-test code imports testing: %s (only test kits, *test and internal/testkit/..., may)", pkg)
		}
	}
}

// The rules' machinery finds a chain through an indirect import, and none
// where there is none.
func TestImportChain(t *testing.T) {
	g := map[string][]string{"a": {"b", "c"}, "b": {"d"}, "c": {"b"}, "d": nil}
	if got := chain(g, "a", func(p string) bool { return p == "d" }); !slices.Equal(got, []string{"a", "b", "d"}) {
		t.Fatalf("chain a->d: %v", got)
	}
	if got := chain(g, "c", func(p string) bool { return p == "a" }); got != nil {
		t.Fatalf("chain c->a: %v", got)
	}
}
