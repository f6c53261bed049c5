package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/client"
)

const shellUsage = "--url URL --lease TOKEN [--session SID] [--takeover] SANDBOX\n       gateway shell --url URL [--key KEY] [--image IMAGE] [--keep]   (in a new sandbox)"

// runShell is `gateway shell`: the local terminal attached to a terminal
// session in a sandbox (a new interactive shell unless --session names
// one), in raw mode, with window-size changes forwarded and dropped
// connections re-attached without losing output. It returns the remote
// process's exit code, or exitUsage / exitFailed. The terminal mode is
// restored on every return path; SIGTERM, SIGHUP and SIGINT end it too.
func runShell(ctx context.Context, args []string, env func(string) (string, bool), stdin *os.File, stdout, stderr io.Writer) int {
	fs := clientFlagSet("shell", shellUsage, stderr)
	var cf clientFlags
	cf.register(fs, env)
	session := fs.String("session", "", "attach to this session instead of starting a new shell")
	takeover := fs.Bool("takeover", false, "evict a client that holds the session")
	cf.registerKey(fs)
	var sc scratch
	sc.define(fs)
	pos, rest, err := parseInterleaved(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) > 1 || len(rest) > 0 || (len(pos) == 0 && *session != "") {
		fs.Usage()
		return exitUsage
	}
	if len(pos) == 0 {
		id, done, err := sc.make(ctx, &cf, "shell", stderr)
		if err != nil {
			fmt.Fprintln(stderr, "gateway shell:", err)
			return exitFailed
		}
		defer done()
		pos = []string{id}
	}
	sandboxID := pos[0]
	cl, err := cf.client()
	if err != nil {
		fmt.Fprintln(stderr, "gateway shell:", err)
		return exitUsage
	}

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)
	defer stop()

	fd := int(stdin.Fd())
	isTerm := term.IsTerminal(fd)
	size := func() (client.Size, bool) {
		if !isTerm {
			return client.Size{}, false
		}
		cols, rows, err := term.GetSize(fd)
		if err != nil || rows <= 0 || cols <= 0 || rows > 0xffff || cols > 0xffff {
			return client.Size{}, false
		}
		return client.Size{Rows: uint16(rows), Cols: uint16(cols)}, true
	}

	sid := *session
	if sid == "" {
		req := api.PtyCreateRequest{}
		if s, ok := size(); ok {
			rows, cols := int(s.Rows), int(s.Cols)
			req.Rows, req.Cols = &rows, &cols
		}
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		sid, err = cl.CreateSession(cctx, sandboxID, req)
		cancel()
		if err != nil {
			fmt.Fprintln(stderr, "gateway shell: start a shell:", err)
			return exitFailed
		}
		fmt.Fprintf(stderr, "sandgate: session %s (re-attach with --session %s)\n", sid, sid)
	}

	// nl is the line end for messages: raw mode does not add the \r.
	nl := "\n"
	if isTerm {
		old, err := term.MakeRaw(fd)
		if err != nil {
			fmt.Fprintln(stderr, "gateway shell: raw mode:", err)
			return exitFailed
		}
		defer term.Restore(fd, old)
		nl = "\r\n"
	}

	// Window-size changes: SIGWINCH -> the latest size, dropped if the
	// attachment is busy (the next change or re-attach sends a fresh one).
	resize := make(chan client.Size, 1)
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	var wg sync.WaitGroup
	wctx, wcancel := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-wctx.Done():
				return
			case <-winch:
				if s, ok := size(); ok {
					select {
					case <-resize:
					default:
					}
					resize <- s
				}
			}
		}
	}()
	defer func() {
		signal.Stop(winch)
		wcancel()
		wg.Wait()
	}()

	attaches := 0 // Notify runs on Attach's goroutine only
	code, err := cl.Attach(ctx, sandboxID, sid, client.AttachOptions{
		Takeover: *takeover,
		Output:   stdout,
		Input:    readChunks(stdin),
		Resize:   resize,
		Size:     size,
		Notify: func(e client.Event) {
			switch e.Kind {
			case client.Reconnecting:
				fmt.Fprintf(stderr, "%s[sandgate: connection lost (%v); reconnecting in %.1fs, Ctrl-C to give up]%s", nl, e.Err, e.Delay.Seconds(), nl)
			case client.Connected:
				if attaches++; attaches > 1 {
					fmt.Fprintf(stderr, "[sandgate: reconnected]%s", nl)
				}
			case client.Lost:
				fmt.Fprintf(stderr, "%s[sandgate: %d bytes of output were lost: the gateway no longer retained them]%s", nl, e.Bytes, nl)
			case client.Notice:
				fmt.Fprintf(stderr, "%s[sandgate: %v]%s", nl, e.Err, nl)
			}
		},
	})
	switch {
	case err == nil:
		return code
	case errors.Is(err, client.ErrTakenOver):
		fmt.Fprintf(stderr, "%ssandgate: the session was taken over by another client%s", nl, nl)
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		fmt.Fprintf(stderr, "%ssandgate: detached; the session keeps running (--session %s)%s", nl, sid, nl)
	default:
		var e *client.Error
		if errors.As(err, &e) && e.Code == "ALREADY_CONNECTED" {
			fmt.Fprintf(stderr, "gateway shell: another client is attached to %s; use --takeover to take it over%s", sid, nl)
		} else {
			fmt.Fprintf(stderr, "%sgateway shell: %v%s", nl, err, nl)
		}
	}
	return exitFailed
}

// readChunks copies r into a channel, chunk by chunk, until r fails. The
// goroutine has no stop signal: a read of a terminal cannot be cancelled,
// so it ends with the process (the CLI's only reader of stdin).
func readChunks(r io.Reader) <-chan []byte {
	ch := make(chan []byte)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 4096)
			n, err := r.Read(buf)
			if n > 0 {
				ch <- buf[:n]
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}
