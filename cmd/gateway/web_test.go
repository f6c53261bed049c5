package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/log"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/sandgate/sandgate/internal/testkit"
)

// The browser terminal page, driven in a real headless Chromium (Debian's
// chromium) against a real gateway. The page is loaded through a
// testkit.Proxy the test can sever, so a WebSocket drop is a real one.

// findChromium returns the browser to drive. Without one the test skips,
// except in CI (CI=true), where a missing browser is a failure.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testkit.Need(t, "chromium (apt-get install chromium)", errors.New("not installed"))
	return ""
}

// artifactDir is where screenshots go: $TEST_ARTIFACTS if set, else the
// test's temp dir.
func artifactDir(t *testing.T) string {
	if d := os.Getenv("TEST_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// tab is one browser tab with the page open; it records console errors.
type tab struct {
	name string
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

func newTab(t *testing.T, parent context.Context, name string) *tab {
	ctx, cancel := chromedp.NewContext(parent)
	t.Cleanup(cancel)
	tb := &tab{name: name, ctx: ctx}
	chromedp.ListenTarget(ctx, func(ev any) {
		var msg string
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			msg = "exception: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				msg += " " + ev.ExceptionDetails.Exception.Description
			}
		case *runtime.EventConsoleAPICalled:
			if ev.Type != runtime.APITypeError && ev.Type != runtime.APITypeAssert {
				return
			}
			msg = "console." + string(ev.Type) + ":"
			for _, a := range ev.Args {
				msg += " " + string(a.Value) + a.Description
			}
		case *log.EventEntryAdded:
			if ev.Entry.Level != log.LevelError {
				return
			}
			msg = "log: " + ev.Entry.Text + " " + ev.Entry.URL
		default:
			return
		}
		tb.mu.Lock()
		tb.errs = append(tb.errs, msg)
		tb.mu.Unlock()
	})
	return tb
}

func (tb *tab) consoleErrors() []string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]string(nil), tb.errs...)
}

func (tb *tab) run(t *testing.T, what string, actions ...chromedp.Action) {
	t.Helper()
	if err := chromedp.Run(tb.ctx, actions...); err != nil {
		t.Fatalf("%s: %s: %v\nstate: %s\nconsole errors: %q\nscreen:\n%s", tb.name, what, err, tb.debugEval(`(document.querySelector('#conn-state')||{}).textContent + ' | ' + (document.querySelector('#term-notice')||{}).textContent`),
			tb.consoleErrors(), tb.debugEval(jsScreenText))
	}
}

// debugEval evaluates expr for a failure message.
func (tb *tab) debugEval(expr string) string {
	var s string
	ctx, cancel := context.WithTimeout(tb.ctx, 2*time.Second)
	defer cancel()
	if err := chromedp.Run(ctx, chromedp.Evaluate(expr, &s)); err != nil {
		return err.Error()
	}
	return s
}

// waitFor polls a JS expression until it is truthy and stores it in res.
func (tb *tab) waitFor(t *testing.T, what, expr string, res any, timeout time.Duration) {
	t.Helper()
	if res == nil {
		res = new(any)
	}
	tb.run(t, "wait for "+what, chromedp.Poll(expr, res, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
}

// typeKeys types into the terminal as a user would: text as inserted
// text, each "\r" as an Enter key press. (chromedp.KeyEvent sends a
// keyDown with text and a char event, which xterm.js takes as two
// keystrokes; a real keyboard makes one.)
func (tb *tab) typeKeys(t *testing.T, s string) {
	t.Helper()
	actions := []chromedp.Action{chromedp.Focus(".xterm-helper-textarea", chromedp.ByQuery)}
	for i, chunk := range strings.Split(s, "\r") {
		if i > 0 {
			actions = append(actions,
				input.DispatchKeyEvent(input.KeyRawDown).WithKey("Enter").WithCode("Enter").WithWindowsVirtualKeyCode(13),
				input.DispatchKeyEvent(input.KeyUp).WithKey("Enter").WithCode("Enter").WithWindowsVirtualKeyCode(13))
		}
		if chunk != "" {
			actions = append(actions, input.InsertText(chunk))
		}
	}
	tb.run(t, "type "+s, actions...)
}

// jsBufferLines is the terminal's whole buffer (scrollback included) as
// lines, wrapped rows joined.
const jsBufferLines = `(() => {
  const b = window.sandgate.term.buffer.active, out = [];
  for (let i = 0; i < b.length; i++) {
    const l = b.getLine(i);
    if (l.isWrapped && out.length) out[out.length - 1] += l.translateToString(true);
    else out.push(l.translateToString(true));
  }
  return out;
})()`

// jsScreenText is what the terminal's DOM shows, one row per line.
const jsScreenText = `Array.from(document.querySelectorAll('#terminal .xterm-rows > div')).map(r => r.textContent).join('\n')`

func (tb *tab) bufferLines(t *testing.T) []string {
	t.Helper()
	var lines []string
	tb.run(t, "read the terminal buffer", chromedp.Evaluate(jsBufferLines, &lines))
	return lines
}

func (tb *tab) screenshot(t *testing.T, dir, name string) string {
	t.Helper()
	var png []byte
	tb.run(t, "screenshot", chromedp.CaptureScreenshot(&png))
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestBrowserTerminal(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	gw := startGateway(t, t.TempDir(), nil)
	proxy := testkit.NewProxy(t, "tcp", strings.TrimPrefix(gw.URL, "http://"))
	artifacts := artifactDir(t)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	actx, acancel := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		// Chromium keeps its singleton socket in a directory of its own
		// under TMPDIR, which a killed browser leaves behind.
		chromedp.Env("TMPDIR="+t.TempDir()),
		chromedp.WindowSize(1100, 750),
	)
	defer acancel()
	// The first tab owns the browser; closing it ends the browser.
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	if err := chromedp.Run(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}

	page := newTab(t, bctx, "page 1")
	page.run(t, "open the page", cdppage.BringToFront(), chromedp.Navigate("http://"+proxy.Addr()+"/"), chromedp.WaitVisible("#list-view", chromedp.ByQuery))

	// Create a sandbox with the page and open a terminal on it.
	page.run(t, "create a sandbox", chromedp.Click("#btn-create", chromedp.ByQuery))
	var id string
	page.waitFor(t, "the new sandbox in the list",
		`(() => { const r = document.querySelector('#sandboxes tbody tr'); return r && r.querySelector('.state-running') && r.dataset.id; })()`,
		&id, time.Minute)
	t.Logf("sandbox %s", id)
	page.run(t, "open a terminal", chromedp.Click(`tr[data-id="`+id+`"] button.open-terminal`, chromedp.ByQuery))
	page.waitFor(t, "connected", `document.querySelector('#conn-state').dataset.state === 'connected'`, nil, 30*time.Second)
	page.waitFor(t, "a prompt", `window.sandgate.term.buffer.active.getLine(0).translateToString(true).trim() !== ''`, nil, 30*time.Second)
	if !regexp.MustCompile(`#/sandboxes/` + id + `\?session=pty-`).MatchString(evalString(t, page, `location.hash`)) {
		t.Errorf("the address does not name the new session: %s", evalString(t, page, `location.hash`))
	}

	t.Run("echo", func(t *testing.T) {
		page.typeKeys(t, "echo hello-$RANDOM\r")
		var line string
		page.waitFor(t, "hello-N in the terminal's DOM",
			`(`+jsScreenText+`).split('\n').map(s => s.trim()).find(s => /^hello-\d+$/.test(s))`, &line, 20*time.Second)
		t.Logf("terminal shows %q", line)
	})

	t.Run("resize", func(t *testing.T) {
		size := func(tag string) (rows, cols int) {
			page.typeKeys(t, "echo "+tag+" $(stty size)\r")
			var got string
			page.waitFor(t, tag, `(`+jsBufferLines+`).find(s => /^`+tag+` \d+ \d+$/.test(s.trim()))`, &got, 20*time.Second)
			if _, err := fmt.Sscanf(strings.TrimSpace(got), tag+" %d %d", &rows, &cols); err != nil {
				t.Fatalf("stty size: %q: %v", got, err)
			}
			var term []int
			page.run(t, "terminal size", chromedp.Evaluate(`[window.sandgate.term.rows, window.sandgate.term.cols]`, &term))
			if rows != term[0] || cols != term[1] {
				t.Errorf("%s: stty size says %dx%d, the page's terminal is %dx%d", tag, rows, cols, term[0], term[1])
			}
			return rows, cols
		}
		r1, c1 := size("SIZE1")
		page.run(t, "shrink the window", chromedp.EmulateViewport(700, 500))
		page.waitFor(t, "the terminal to refit", fmt.Sprintf(`window.sandgate.term.cols !== %d && window.sandgate.term.rows !== %d`, c1, r1), nil, 10*time.Second)
		r2, c2 := size("SIZE2")
		t.Logf("stty size %dx%d -> %dx%d", r1, c1, r2, c2)
		if r2 >= r1 || c2 >= c1 {
			t.Errorf("stty size did not shrink: %dx%d -> %dx%d", r1, c1, r2, c2)
		}
		// A phone-sized screen: nothing overflows sideways.
		page.run(t, "phone viewport", chromedp.EmulateViewport(380, 700))
		page.waitFor(t, "the terminal to refit", fmt.Sprintf(`window.sandgate.term.cols < %d`, c2), nil, 10*time.Second)
		var overflow bool
		page.run(t, "overflow", chromedp.Evaluate(`document.documentElement.scrollWidth > window.innerWidth`, &overflow))
		if overflow {
			t.Errorf("the page overflows a 380px-wide screen")
		}
		page.screenshot(t, artifacts, "terminal-phone.png")
		page.run(t, "desktop viewport", chromedp.EmulateViewport(1100, 750))
	})

	t.Run("reconnect", func(t *testing.T) {
		const n = 3000
		page.typeKeys(t, fmt.Sprintf("for i in $(seq 1 %d); do echo L$i; case $i in *00) sleep 0.05;; esac; done; echo SEQ-DONE\r", n))
		page.waitFor(t, "seq to be printing", `(`+jsBufferLines+`).some(s => /^L[3-9]\d\d$/.test(s.trim()))`, nil, 30*time.Second)
		cut := proxy.Sever()
		t.Logf("cut %d connections while seq printed", cut)
		if cut == 0 {
			t.Fatal("no connection to cut")
		}
		page.waitFor(t, "a re-attach", `window.sandgate.conn.attaches >= 2 && document.querySelector('#conn-state').dataset.state === 'connected'`, nil, 30*time.Second)
		page.waitFor(t, "seq to finish", `(`+jsBufferLines+`).some(s => s.trim() === 'SEQ-DONE')`, nil, time.Minute)
		var seen []int
		for _, l := range page.bufferLines(t) {
			l = strings.TrimSpace(l)
			if len(l) > 1 && l[0] == 'L' {
				if v, err := strconv.Atoi(l[1:]); err == nil {
					seen = append(seen, v)
				}
			}
		}
		if len(seen) != n {
			t.Errorf("the terminal holds %d L-lines, want %d", len(seen), n)
		}
		for i, v := range seen {
			if v != i+1 {
				t.Fatalf("line %d is L%d, want L%d (lines around it: %v)", i, v, i+1, seen[max(0, i-3):min(len(seen), i+4)])
			}
		}
		if notice := evalString(t, page, `document.querySelector('#term-notice').hidden ? '' : document.querySelector('#term-notice').textContent`); notice != "" {
			t.Errorf("unexpected notice after the reconnect: %q", notice)
		}
	})

	t.Run("takeover", func(t *testing.T) {
		hash := evalString(t, page, `location.hash`)
		second := newTab(t, bctx, "page 2")
		second.run(t, "open the same session", cdppage.BringToFront(), chromedp.Navigate("http://"+proxy.Addr()+"/"+hash))
		second.waitFor(t, "the session to be busy", `document.querySelector('#conn-state').dataset.state === 'busy' && !document.querySelector('#btn-takeover').hidden`, nil, 30*time.Second)
		second.run(t, "take over", chromedp.Click("#btn-takeover", chromedp.ByQuery))
		second.waitFor(t, "connected", `document.querySelector('#conn-state').dataset.state === 'connected'`, nil, 30*time.Second)
		page.waitFor(t, "the first page to say it was taken over",
			`document.querySelector('#conn-state').dataset.state === 'taken-over' && document.querySelector('#conn-state').textContent.includes('taken over by another client')`, nil, 10*time.Second)
		// The second page got the whole session replayed ...
		second.waitFor(t, "the replay", `(`+jsBufferLines+`).some(s => s.trim() === 'SEQ-DONE')`, nil, 10*time.Second)
		// ... and works, and the first page does not fight back.
		second.typeKeys(t, "echo second-$((6*7))\r")
		second.waitFor(t, "second-42", `(`+jsScreenText+`).includes('second-42')`, nil, 20*time.Second)
		if s := evalString(t, page, `document.querySelector('#conn-state').dataset.state`); s != "taken-over" {
			t.Errorf("first page state %q after the take-over, want taken-over", s)
		}
		if s := evalString(t, second, `document.querySelector('#conn-state').dataset.state`); s != "connected" {
			t.Errorf("second page state %q, want connected", s)
		}
		page.run(t, "show the first page", cdppage.BringToFront())
		p := page.screenshot(t, artifacts, "terminal-taken-over.png")
		t.Logf("screenshot: %s", p)

		second.run(t, "show the second page", cdppage.BringToFront())
		second.typeKeys(t, "exit 7\r")
		second.waitFor(t, "the exit code", `document.querySelector('#conn-state').textContent === 'process exited with code 7'`, nil, 20*time.Second)
		p = second.screenshot(t, artifacts, "terminal-exited.png")
		t.Logf("screenshot: %s", p)
		if errs := second.consoleErrors(); len(errs) > 0 {
			t.Errorf("page 2 console errors: %q", errs)
		}
	})

	if errs := page.consoleErrors(); len(errs) > 0 {
		t.Errorf("page 1 console errors: %q", errs)
	}
}

func evalString(t *testing.T, tb *tab, expr string) string {
	t.Helper()
	var s string
	if err := chromedp.Run(tb.ctx, chromedp.Evaluate(expr, &s)); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return s
}
