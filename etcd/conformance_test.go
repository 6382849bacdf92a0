package etcd_test

import (
	"context"
	"sync"
	"testing"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/conformance/serverproc"
	"github.com/distlock/lock/etcd"
)

// harness is one etcd member in a process of its own; every backend reaches
// it through a fault proxy of its own.
type harness struct {
	t   *testing.T
	srv *serverproc.Process

	mu      sync.Mutex
	proxies map[backend.Backend]*faultproxy.Proxy
}

var (
	_ conformance.Pauser       = (*harness)(nil)
	_ conformance.Disconnecter = (*harness)(nil)
	_ conformance.ReplyHolder  = (*harness)(nil)
	_ conformance.Restarter    = (*harness)(nil)
)

// owned is a backend that closes its etcd client and its proxy with it, as
// the exit of its process would: the suite checks that a closed client
// leaves no goroutines.
type owned struct {
	*etcd.Backend
	h *harness
	proxiedClient
}

func (o *owned) Close() error {
	err := o.Backend.Close()
	o.proxiedClient.close()
	o.h.mu.Lock()
	delete(o.h.proxies, o)
	o.h.mu.Unlock()
	return err
}

func (h *harness) NewBackend(context.Context) (backend.Backend, error) {
	px := faultproxy.Start(h.t, h.srv.Addr)
	cli := newClient(h.t, px.Addr)
	b, err := etcd.New(cli, etcd.WithElectionTimeout(electionTimeout))
	if err != nil {
		cli.Close()
		px.Close()
		return nil, err
	}
	o := &owned{Backend: b, h: h, proxiedClient: proxiedClient{cli, px}}
	h.mu.Lock()
	h.proxies[o] = px
	h.mu.Unlock()
	return o, nil
}

func (h *harness) Capabilities() backend.Capabilities {
	cli := newClient(h.t, h.srv.Addr)
	defer cli.Close()
	b, err := etcd.New(cli, etcd.WithElectionTimeout(electionTimeout))
	if err != nil {
		h.t.Fatalf("etcd.New: %v", err)
	}
	defer b.Close()
	return b.Capabilities()
}

func (h *harness) proxy(b backend.Backend) *faultproxy.Proxy {
	h.mu.Lock()
	defer h.mu.Unlock()
	px := h.proxies[b]
	if px == nil {
		h.t.Fatalf("harness: a backend it did not make: %T", b)
	}
	return px
}

func (h *harness) Pause(context.Context) error  { h.srv.Stop(); return nil }
func (h *harness) Resume(context.Context) error { h.srv.Continue(); return nil }

func (h *harness) Disconnect(_ context.Context, b backend.Backend) error {
	h.proxy(b).Cut()
	return nil
}

func (h *harness) Reconnect(_ context.Context, b backend.Backend) error {
	h.proxy(b).Heal()
	return nil
}

// HoldReplies, DeliverReplies and DropReplies act on the server-to-client
// direction of b's proxy: requests still reach the server.
func (h *harness) HoldReplies(_ context.Context, b backend.Backend) error {
	h.proxy(b).Hold(faultproxy.ToClient)
	return nil
}

func (h *harness) DeliverReplies(_ context.Context, b backend.Backend) error {
	h.proxy(b).Deliver(faultproxy.ToClient)
	return nil
}

func (h *harness) DropReplies(_ context.Context, b backend.Backend) error {
	px := h.proxy(b)
	px.Reset() // held replies go with the connections
	px.Deliver(faultproxy.ToClient)
	return nil
}

// Restart kills the member with SIGKILL and starts it again on the same
// data directory; the clients reconnect on their own.
func (h *harness) Restart(_ context.Context, keepData bool) error {
	if !keepData {
		h.t.Fatal("harness: the suite restarts the store keeping its data only")
	}
	h.srv.Restart()
	return nil
}

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		return &harness{t: t, srv: startEtcd(t), proxies: map[backend.Backend]*faultproxy.Proxy{}}
	}, conformance.RequireHooks())
}
