// A worked conformance harness for a networked store, using only exported
// API: each backend reaches the server through a fault proxy of its own,
// which gives every hook in a few lines.
package netstore_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/memory"
	"github.com/distlock/lock/memory/netstore"
)

// harness gives every backend its own fault proxy in front of one server;
// faultproxy.Hooks turns the proxies into the network hooks. Its
// connections are TCP on loopback, or, with pipes, in-memory ones
// (net.Pipe): what the suite needs to run under virtual time.
type harness struct {
	faultproxy.Hooks
	t     *testing.T
	store *memory.Store
	srv   *netstore.Server
	pipes *pipeNet // nil: TCP
}

// pipeLatency is the in-memory network's latency each way, about
// loopback TCP's through the proxy: a round trip takes time, as on any
// network, also under virtual time. Without it a reply could wake its
// goroutine before the caller of the request had gone on: a handover's
// background transfer, say, could confirm the new lease before the case
// looked at the deadline it was handed (DeadlineWithinStore then missed
// the handover-prev-deadline flaw in about one run in twelve).
const pipeLatency = 50 * time.Microsecond

// newHarness starts a server over a new store, on loopback TCP, or on an
// in-memory network with pipes.
func newHarness(t *testing.T, pipes bool) *harness {
	h := &harness{t: t, store: memory.NewStore(memory.WithMaxTTL(longestTTL))}
	if !pipes {
		h.srv = serve(t, h.store)
		return h
	}
	h.pipes = newPipeNet()
	h.srv = netstore.Serve(h.pipes.Listen(), h.store)
	t.Cleanup(func() { h.srv.Close() })
	return h
}

// dialTo returns the proxy's dialer of the server and the backend's
// options (the store's maximum TTL; the dialer), for the harness's
// network.
func (h *harness) dialTo(addr string) (func(ctx context.Context) (net.Conn, error), []netstore.Option) {
	opts := []netstore.Option{netstore.WithMaxTTL(longestTTL)}
	if h.pipes == nil {
		return nil, opts
	}
	return func(ctx context.Context) (net.Conn, error) { return h.pipes.Dial(ctx, addr) },
		append(opts, netstore.WithDialer(h.pipes.Dial))
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
	var px *faultproxy.Proxy
	dial, opts := h.dialTo(h.srv.Addr().String())
	if dial != nil {
		px = faultproxy.StartOn(h.t, h.pipes.Listen(), dial)
		px.Latency(pipeLatency)
	} else {
		px = faultproxy.Start(h.t, h.srv.Addr().String())
	}
	b, err := netstore.New(px.Addr, opts...)
	if err != nil {
		px.Close()
		return nil, err
	}
	p := &proxied{Backend: b, h: h, px: px}
	h.Add(p, px)
	return p, nil
}

func (h *harness) Capabilities() backend.Capabilities {
	_, opts := h.dialTo(h.srv.Addr().String())
	b, err := netstore.New(h.srv.Addr().String(), opts...)
	if err != nil {
		h.t.Fatalf("netstore.New: %v", err)
	}
	defer b.Close()
	return b.Capabilities()
}

func (h *harness) Pause(context.Context) error  { h.store.Pause(); return nil }
func (h *harness) Resume(context.Context) error { h.store.Resume(); return nil }

// Evict drops the lock from the store, as its expiry would.
func (h *harness) Evict(_ context.Context, key string) error {
	h.store.Evict(key)
	return nil
}

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

// TestConformance runs the suite under virtual time
// (conformance.VirtualTime): every case in a bubble of its own, with a
// store, a server and proxies of its own on an in-memory network, so that
// its waits for TTLs to run out cost no wall time. CancelUnderLoad runs in
// real time (see conformance.Run), on the same kind of network.
// netstore_test.go and handover_test.go test the server and the backend
// over TCP.
func TestConformance(t *testing.T) {
	logLibFlaw(t) // see flaws_test.go
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		h := newHarness(t, true)
		t.Cleanup(func() { storeLeftClean(t, h.store) })
		return h
	}, conformance.RequireHooks(), conformance.VirtualTime())
}

// longestTTL is the longest TTL the suite grants (ManyKeys'), and the
// maximum TTL of the harness's store, raised from memory.DefaultMaxTTL
// for it.
const longestTTL = 2 * time.Minute

// storeLeftClean checks, after a case's own cleanups closed its clients
// (the server still runs), that it left no watch open on the server once
// the server saw the connections close, and no lock held once every TTL
// the suite grants has run out: a case may leave a lock to expire. (The
// store was once the suite's, and this ran after the whole suite.)
func storeLeftClean(t *testing.T, store *memory.Store) {
	eventually(t, "no watch is left open on the server after the case", func() bool { return store.Watchers() == 0 })
	if store.Len() != 0 {
		time.Sleep(longestTTL + time.Second) // waiting out a TTL
	}
	if n := store.Len(); n != 0 {
		t.Errorf("%d locks still held %v after the case; want 0", n, longestTTL+time.Second)
	}
}

// Seeded randomized fault runs (conformance.RunFaults) against the
// reference store, with every hook, under virtual time: each run in a
// bubble of its own, on an in-memory network.
func TestFaultRuns(t *testing.T) {
	conformance.RunFaults(t, func(t *testing.T) conformance.Harness {
		return newHarness(t, true)
	}, conformance.FaultVirtualTime())
}
