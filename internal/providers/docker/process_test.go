package docker

import (
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// drain copies r into a buffer until EOF; the returned wait joins it.
func drain(r io.Reader) (*lockedBuffer, func()) {
	b := &lockedBuffer{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(b, r)
	}()
	return b, wg.Wait
}

func waitOutput(t *testing.T, b *lockedBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(b.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the output; have %q", want, b.String())
		}
		tick := time.NewTimer(20 * time.Millisecond)
		<-tick.C
	}
}

// TestStartProcessNoMarker: the wrapper's start marker never reaches the
// terminal. (The terminal process behaviour itself is in the conformance
// suite, providertest.)
func TestStartProcessNoMarker(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	proc, err := p.StartProcess(ctxFor(t, time.Minute), id, providers.ProcessSpec{TTY: true})
	if err != nil {
		t.Fatal(err)
	}
	out, join := drain(proc.Stdout())
	defer join()
	defer proc.Kill()
	io.WriteString(proc.Stdin(), "echo rea\"\"dy\n")
	waitOutput(t, out, "ready")
	if strings.Contains(out.String(), "<<sandgate") {
		t.Errorf("start marker leaked: %q", out.String())
	}
}
