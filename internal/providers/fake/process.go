package fake

import (
	"context"
	"io"
	"sync"
	"syscall"

	"github.com/sandgate/sandgate/internal/providers"
)

var _ providers.ProcessStarter = (*Provider)(nil)

// StartProcess starts a fake process whatever the command: it echoes its
// input to its output, as cat does, until the input ends (exit 0), it is
// signalled (128+N) or killed (137). In pipe mode its stderr stays empty.
func (p *Provider) StartProcess(ctx context.Context, id string, spec providers.ProcessSpec) (providers.Process, error) {
	p.mu.Lock()
	_, err := p.get(id)
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &Process{tty: spec.TTY, in: inW, inR: inR, out: outR, outW: outW, done: make(chan struct{})}
	if !spec.TTY {
		c.errR, c.errW = io.Pipe()
	}
	go c.run()
	return c, nil
}

// Process is the fake's process (see StartProcess).
type Process struct {
	tty        bool
	in         *io.PipeWriter
	inR        *io.PipeReader
	out        *io.PipeReader
	outW       *io.PipeWriter
	errR       *io.PipeReader
	errW       *io.PipeWriter
	once       sync.Once
	code       int
	done       chan struct{}
	rows, cols uint16
}

func (c *Process) run() {
	if _, err := io.Copy(c.outW, c.inR); err == nil {
		c.exit(0) // the input ended
	}
}

// exit ends the process with code (the first exit counts) and closes its
// output.
func (c *Process) exit(code int) {
	c.once.Do(func() {
		c.code = code
		c.inR.CloseWithError(io.ErrClosedPipe)
		c.outW.Close()
		if c.errW != nil {
			c.errW.Close()
		}
		close(c.done)
	})
}

func (c *Process) Stdout() io.Reader { return c.out }

func (c *Process) Stderr() io.Reader {
	if c.errR == nil {
		return nil
	}
	return c.errR
}

// Stdin is the process's input; in TTY mode Close does nothing, as on a
// terminal.
func (c *Process) Stdin() io.WriteCloser {
	if c.tty {
		return ttyInput{c.in}
	}
	return c.in
}

type ttyInput struct{ w io.Writer }

func (t ttyInput) Write(p []byte) (int, error) { return t.w.Write(p) }
func (ttyInput) Close() error                  { return nil }

func (c *Process) Resize(rows, cols uint16) error {
	if !c.tty {
		return providers.Errorf(providers.ErrUnsupported, "resize needs a terminal")
	}
	c.rows, c.cols = rows, cols
	return nil
}

func (c *Process) Signal(sig syscall.Signal) error {
	select {
	case <-c.done:
		return providers.Errorf(providers.ErrConflict, "the process has exited")
	default:
	}
	c.exit(128 + int(sig))
	return nil
}

func (c *Process) Wait() (int, error) {
	<-c.done
	return c.code, nil
}

func (c *Process) Kill() error {
	c.exit(128 + int(syscall.SIGKILL))
	return nil
}
