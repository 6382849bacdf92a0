// A worked conformance harness for a networked store, using only exported
// API: each backend reaches the server through a fault proxy of its own,
// which gives every hook in a few lines.
package netstore_test

import (
	"context"
	"testing"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/memory"
	"github.com/distlock/lock/memory/netstore"
)

// harness gives every backend its own fault proxy in front of one server;
// faultproxy.Hooks turns the proxies into the network hooks.
type harness struct {
	faultproxy.Hooks
	t     *testing.T
	store *memory.Store
	srv   *netstore.Server
}

var (
	_ conformance.Pauser       = (*harness)(nil)
	_ conformance.Disconnecter = (*harness)(nil)
	_ conformance.ReplyHolder  = (*harness)(nil)
	_ conformance.Restarter    = (*harness)(nil)
)

// proxied is a Backend that closes its proxy with it, as the exit of its
// process would: the suite checks that a closed client leaves no
// goroutines.
type proxied struct {
	*netstore.Backend
	h  *harness
	px *faultproxy.Proxy
}

func (p *proxied) Close() error {
	err := p.Backend.Close()
	p.px.Close()
	p.h.Forget(p)
	return err
}

func (h *harness) NewBackend(context.Context) (backend.Backend, error) {
	px := faultproxy.Start(h.t, h.srv.Addr().String())
	b, err := netstore.New(px.Addr)
	if err != nil {
		px.Close()
		return nil, err
	}
	p := &proxied{Backend: b, h: h, px: px}
	h.Add(p, px)
	return p, nil
}

func (h *harness) Capabilities() backend.Capabilities {
	b, err := netstore.New(h.srv.Addr().String())
	if err != nil {
		h.t.Fatalf("netstore.New: %v", err)
	}
	defer b.Close()
	return b.Capabilities()
}

func (h *harness) Pause(context.Context) error  { h.store.Pause(); return nil }
func (h *harness) Resume(context.Context) error { h.store.Resume(); return nil }

// Restart restarts the store, keeping its data or losing it, and resets
// every client's connections, as a restarted server process would.
func (h *harness) Restart(_ context.Context, keepData bool) error {
	mode := memory.LoseData
	if keepData {
		mode = memory.KeepData
	}
	h.store.Restart(mode)
	h.All((*faultproxy.Proxy).Reset)
	return nil
}

func TestConformance(t *testing.T) {
	logLibFlaw(t) // see flaws_test.go
	var store *memory.Store
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		store = memory.NewStore()
		return &harness{t: t, store: store, srv: serve(t, store)}
	}, conformance.RequireHooks())
	if n := store.Watchers(); n != 0 {
		t.Errorf("%d watches left open on the server after the suite; want 0", n)
	}
	if n := store.Len(); n != 0 {
		t.Errorf("%d locks left held after the suite; want 0", n)
	}
}

// Seeded randomized fault runs (conformance.RunFaults) against the
// reference store, with every hook.
func TestFaultRuns(t *testing.T) {
	conformance.RunFaults(t, func(t *testing.T) conformance.Harness {
		store := memory.NewStore()
		return &harness{t: t, store: store, srv: serve(t, store)}
	})
}
