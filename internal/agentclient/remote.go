package agentclient

import (
	"context"
	"crypto/rand"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// StartProcess starts spec as a session of the agent c is connected to
// and returns it as a providers.Process: its output streamed from the
// agent's ring (from the first byte), its input, resize and signals sent
// on the attachment, Kill deleting the session.
func StartProcess(ctx context.Context, c *Client, spec providers.ProcessSpec) (providers.Process, error) {
	id := "proc-" + rand.Text()[:16]
	if _, err := c.StartSession(ctx, id, spec, false, agentwire.DefaultRing); err != nil {
		return nil, err
	}
	a, err := c.Attach(ctx, id, 0, nil, agentwire.DefaultRing)
	if err != nil {
		c.DeleteSession(context.WithoutCancel(ctx), id)
		return nil, err
	}
	p := &remoteProcess{c: c, id: id, a: a, tty: spec.TTY, done: make(chan struct{})}
	p.outR, p.outW = io.Pipe()
	if !spec.TTY {
		p.errR, p.errW = io.Pipe()
	}
	go p.pump()
	return p, nil
}

type remoteProcess struct {
	c   *Client
	id  string
	a   *Attachment
	tty bool

	outR, errR *io.PipeReader
	outW, errW *io.PipeWriter

	done chan struct{} // closed when pump has the exit (or lost it)
	code int
	err  error

	killOnce sync.Once
}

// pump moves the attachment's replay and events into the pipes until the
// exit.
func (p *remoteProcess) pump() {
	defer close(p.done)
	if len(p.a.Replay) > 0 {
		p.outW.Write(p.a.Replay)
		p.a.Replay = nil
	}
	for {
		ev, err := p.a.Next()
		switch {
		case err != nil:
			p.code, p.err = -1, providers.Wrap(providers.ErrConflict, err, "the process was lost with its sandbox's agent")
		case ev.Exited && ev.Lost:
			p.code, p.err = -1, providers.Errorf(providers.ErrConflict, "the process ended without an exit status")
		case ev.Exited:
			p.code = ev.Code
		case ev.Chan == 0x02 && p.errW != nil:
			p.errW.Write(ev.Data)
			continue
		default:
			p.outW.Write(ev.Data)
			continue
		}
		p.outW.Close()
		if p.errW != nil {
			p.errW.Close()
		}
		return
	}
}

func (p *remoteProcess) Stdout() io.Reader { return p.outR }

func (p *remoteProcess) Stderr() io.Reader {
	if p.errR == nil {
		return nil
	}
	return p.errR
}

func (p *remoteProcess) Stdin() io.WriteCloser { return remoteStdin{p} }

type remoteStdin struct{ p *remoteProcess }

func (s remoteStdin) Write(b []byte) (int, error) {
	if err := s.p.a.Input(b); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (s remoteStdin) Close() error {
	if s.p.tty {
		return nil
	}
	return s.p.a.CloseStdin()
}

func (p *remoteProcess) Resize(rows, cols uint16) error {
	if !p.tty {
		return providers.Errorf(providers.ErrUnsupported, "resize needs a terminal")
	}
	return p.a.Resize(rows, cols)
}

func (p *remoteProcess) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return providers.Errorf(providers.ErrConflict, "the process has exited")
	default:
	}
	return p.a.Signal(sig)
}

func (p *remoteProcess) Wait() (int, error) {
	<-p.done
	return p.code, p.err
}

// Kill deletes the session (its process tree is killed), ends the
// attachment and the pipes.
func (p *remoteProcess) Kill() error {
	var err error
	p.killOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if derr := p.c.DeleteSession(ctx, p.id); derr != nil && providers.Kind(derr) != providers.ErrNotFound {
			select {
			case <-p.c.Done():
			default:
				err = derr
			}
		}
		p.outR.CloseWithError(io.EOF)
		if p.errR != nil {
			p.errR.CloseWithError(io.EOF)
		}
		// The exit (137) follows the delete; a lost agent ends it too.
		t := time.AfterFunc(10*time.Second, func() { p.a.Close() })
		<-p.done
		t.Stop()
		p.a.Close()
	})
	return err
}

// Provider is implemented by providers whose sandboxes run the agent:
// Agent returns the connection to sandbox id's.
type Provider interface {
	Agent(ctx context.Context, id string) (*Client, error)
}
