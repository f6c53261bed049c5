package kubernetes

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
)

// A declared port is reached through the API server's port-forward: on
// first use the gateway listens on a random 127.0.0.1 port and forwards
// each connection into the pod (WebSocket tunnelling, SPDY as the
// fallback), never to the pod's address. The forward lasts until the
// sandbox is deleted (or it broke: the next Endpoint makes a new one).

type fwdKey struct {
	id   string
	port int
}

type forward struct {
	url    string
	cancel context.CancelFunc
	done   chan struct{} // the forwarder stopped
}

type forwards struct {
	mu sync.Mutex
	m  map[fwdKey]*forward
}

var _ providers.Endpointer = (*Kubernetes)(nil)

// Endpoint returns a 127.0.0.1 URL on the gateway's machine that reaches
// port of sandbox id (declared at create: the service checks).
func (k *Kubernetes) Endpoint(ctx context.Context, id string, port int) (providers.Endpoint, error) {
	if err := k.running(ctx, id); err != nil {
		return providers.Endpoint{}, err
	}
	k.fw.mu.Lock()
	defer k.fw.mu.Unlock()
	key := fwdKey{id, port}
	if f := k.fw.m[key]; f != nil {
		select {
		case <-f.done:
			delete(k.fw.m, key)
		default:
			return providers.Endpoint{URL: f.url}, nil
		}
	}
	f, err := k.startForward(ctx, id, port)
	if err != nil {
		return providers.Endpoint{}, err
	}
	if k.fw.m == nil {
		k.fw.m = map[fwdKey]*forward{}
	}
	k.fw.m[key] = f
	return providers.Endpoint{URL: f.url}, nil
}

func (k *Kubernetes) startForward(ctx context.Context, id string, port int) (*forward, error) {
	req := k.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(k.ns).Name(id).SubResource("portforward")
	tunnel, err := portforward.NewSPDYOverWebsocketDialer(req.URL(), k.cfg)
	if err != nil {
		return nil, k.kind(err, "forward port %d of %s", port, id)
	}
	rt, upgrader, err := spdy.RoundTripperFor(k.cfg)
	if err != nil {
		return nil, k.kind(err, "forward port %d of %s", port, id)
	}
	dialer := portforward.NewFallbackDialer(tunnel, spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, req.URL()),
		func(err error) bool { return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err) })
	fctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	errOut := &agentclient.Stderr{Max: 4 << 10}
	pf, err := portforward.NewOnAddressesWithContext(fctx, dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, ready, io.Discard, errOut)
	if err != nil {
		cancel()
		return nil, k.kind(err, "forward port %d of %s", port, id)
	}
	f := &forward{cancel: cancel, done: make(chan struct{})}
	ferr := make(chan error, 1)
	go func() {
		defer close(f.done)
		ferr <- pf.ForwardPorts()
	}()
	select {
	case <-ready:
	case err := <-ferr:
		cancel()
		return nil, providers.Wrap(providers.ErrUnavailable, err, fmt.Sprintf("forward port %d of sandbox %s: %v %s", port, id, err, errOut))
	case <-ctx.Done():
		cancel()
		<-f.done
		return nil, ctx.Err()
	}
	ports, err := pf.GetPorts()
	if err != nil || len(ports) != 1 {
		cancel()
		<-f.done
		return nil, providers.Errorf(providers.ErrUnavailable, "forward port %d of sandbox %s: no local port", port, id)
	}
	f.url = "http://127.0.0.1:" + strconv.Itoa(int(ports[0].Local))
	return f, nil
}

// stopForwards stops sandbox id's forwards (every sandbox's when id is
// "") and waits for them.
func (k *Kubernetes) stopForwards(id string) {
	k.fw.mu.Lock()
	var stop []*forward
	for key, f := range k.fw.m {
		if id == "" || key.id == id {
			stop = append(stop, f)
			delete(k.fw.m, key)
		}
	}
	k.fw.mu.Unlock()
	for _, f := range stop {
		f.cancel()
		<-f.done
	}
}
