package kubernetes

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
)

// Metrics come from the agent (agentclient.Via).
var _ providers.MetricsReader = (*Kubernetes)(nil)

// openAgent opens a connection to sandbox id's agent (agentclient.Links.Open):
// one exec of the agent's bridge through the pod's exec subresource,
// WebSocket first, SPDY when the API server cannot upgrade to it. With
// start (a new sandbox) the bridge starts the agent daemon; without, a
// missing daemon means the agent died. The stream outlives ctx.
func (k *Kubernetes) openAgent(ctx context.Context, id string, start bool) (io.ReadWriteCloser, func() string, error) {
	cmd := []string{agentBin, "connect"}
	if k.opts.RunAsNonRoot {
		cmd = append(cmd, "--socket", nonRootRunDir+"/agent.sock")
	}
	if start {
		cmd = append(cmd, "--start")
	}
	ex, err := k.executor(id, containerSandbox, cmd)
	if err != nil {
		return nil, nil, err
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	stderr := &agentclient.Stderr{Max: 4 << 10}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &streamConn{r: outR, w: inW, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		err := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: stderr})
		if err == nil {
			err = io.EOF
		} else if stderr.String() == "" {
			stderr.Write([]byte(err.Error()))
		}
		outW.CloseWithError(err)
		inR.CloseWithError(err)
	}()
	return c, stderr.String, nil
}

// executor runs cmd in container of sandbox id's pod through the exec
// subresource, with stdin, stdout and stderr: WebSocket first, SPDY when
// the API server cannot upgrade to it.
func (k *Kubernetes) executor(id, container string, cmd []string) (remotecommand.Executor, error) {
	req := k.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(k.ns).Name(id).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(k.cfg, http.MethodGet, req.URL().String())
	if err != nil {
		return nil, k.kind(err, "exec in %s", id)
	}
	spdy, err := remotecommand.NewSPDYExecutor(k.cfg, http.MethodPost, req.URL())
	if err != nil {
		return nil, k.kind(err, "exec in %s", id)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, k.kind(err, "exec in %s", id)
	}
	return ex, nil
}

// streamConn is an exec stream as one byte stream: the bridge's stdout
// and stdin.
type streamConn struct {
	r      *io.PipeReader
	w      *io.PipeWriter
	cancel context.CancelFunc
	done   chan struct{} // the exec ended
	once   sync.Once
}

func (c *streamConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *streamConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// Close ends the exec the way a client ends it: stdin's EOF, on which
// the bridge exits and the API server closes the stream. One that does
// not end within closeWait is cut.
func (c *streamConn) Close() error {
	c.once.Do(func() {
		c.w.Close()
		t := time.NewTimer(closeWait)
		select {
		case <-c.done:
		case <-t.C:
		}
		t.Stop()
		c.r.Close()
		c.cancel()
		<-c.done
	})
	return nil
}

const closeWait = 2 * time.Second
