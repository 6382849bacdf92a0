package netstore_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/memory"
	"github.com/distlock/lock/memory/netstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// serve starts a Server over store on a free loopback port, closed at the
// end of the test.
func serve(t testing.TB, store *memory.Store) *netstore.Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := netstore.Serve(ln, store)
	t.Cleanup(func() { srv.Close() })
	return srv
}

func newBackend(t *testing.T, addr string, opts ...netstore.Option) *netstore.Backend {
	t.Helper()
	b, err := netstore.New(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

const token = "0123456789abcdef0123456789abcdef"

// An acquire that reaches the server after the release that undid it (sent
// on another connection) takes nothing: the release killed its token.
func TestAcquireAfterItsRelease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := serve(t, memory.NewStore())
	px := faultproxy.Start(t, srv.Addr().String())
	slow := newBackend(t, px.Addr, netstore.WithConns(1))
	fast := newBackend(t, srv.Addr().String())

	if _, err := slow.Inspect(ctx, "k"); err != nil { // the proxy has accepted slow's connection
		t.Fatal(err)
	}
	px.Freeze(faultproxy.ToServer) // slow's one connection holds its requests
	actx, acancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := slow.Acquire(actx, "k", token, time.Minute)
	acancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire held on the wire: %v; want an error wrapping DeadlineExceeded", err)
	}
	if err := fast.Release(ctx, "k", token); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("the cleanup's Release, overtaking the acquire: %v; want ErrNotHeld", err)
	}
	px.Thaw(faultproxy.ToServer)
	// Inspect goes out after the acquire on the same connection: its
	// reply comes after the acquire ran.
	h, err := slow.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if h.Held {
		t.Fatalf("the late acquire took the key: %+v", h)
	}
	if _, err := fast.Acquire(ctx, "k", token, time.Minute); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("Acquire with the released token: %v; want ErrInvalid", err)
	}
}

// A watch whose connection is lost is registered again on a new one, and
// a release after that wakes it; the server keeps no registration of the
// lost connection.
func TestWatchAfterConnectionLoss(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store := memory.NewStore()
	srv := serve(t, store)
	px := faultproxy.Start(t, srv.Addr().String())
	waiter := newBackend(t, px.Addr)
	holder := newBackend(t, srv.Addr().String())

	if _, err := holder.Acquire(ctx, "k", token, time.Minute); err != nil {
		t.Fatal(err)
	}
	w, err := waiter.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(false)
	if n := store.Watchers(); n != 1 {
		t.Fatalf("%d watches on the server; want 1", n)
	}
	px.Reset()
	receive(t, "the wake-up for the lost connection", w.C())
	// A second watch goes out on the new connection after w's
	// registration: once it is registered, so is w, and the wake-up
	// that confirms it has come.
	probe, err := waiter.Watch(ctx, "probe")
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close(false)
	select {
	case <-w.C():
	default:
	}
	eventually(t, "the server drops the lost connection's watch", func() bool { return store.Watchers() == 2 })
	if err := holder.Release(ctx, "k", token); err != nil {
		t.Fatal(err)
	}
	receive(t, "the wake-up for the release", w.C())
	w.Close(false)
	probe.Close(false)
	eventually(t, "the server drops the closed watches", func() bool { return store.Watchers() == 0 })
}

// A release that overtakes the unwatch of the watch it woke (the client
// took the key, closed its watch and released the key, the release on
// another connection) does not lose its wake-up: the unwatch passes it on to
// the next watch, since the key is free.
func TestUnwatchAfterRelease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := serve(t, memory.NewStore())
	px := faultproxy.Start(t, srv.Addr().String())
	x := newBackend(t, px.Addr)
	direct := newBackend(t, srv.Addr().String())
	const holder, taker = "0000000000000000000000000000000a", "0000000000000000000000000000000b"

	if _, err := direct.Acquire(ctx, "k", holder, time.Minute); err != nil {
		t.Fatal(err)
	}
	wx, err := x.Watch(ctx, "k") // first in line
	if err != nil {
		t.Fatal(err)
	}
	wy, err := direct.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer wy.Close(false)
	if err := direct.Release(ctx, "k", holder); err != nil {
		t.Fatal(err)
	}
	receive(t, "x's wake-up", wx.C())
	if _, err := x.Acquire(ctx, "k", taker, time.Minute); err != nil {
		t.Fatal(err)
	}
	px.Freeze(faultproxy.ToServer) // x's unwatch waits on the wire
	wx.Close(true)
	if err := direct.Release(ctx, "k", taker); err != nil { // wakes x's watch, still registered
		t.Fatal(err)
	}
	px.Thaw(faultproxy.ToServer)
	receive(t, "the next watch's wake-up, passed on by the late unwatch", wy.C())
}

// Every call returns when its context ends, also while the server hangs;
// Server.Close ends the calls it holds; calls after Close fail with
// ErrClosed.
func TestCancelAndClose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store := memory.NewStore()
	srv := serve(t, store)
	b := newBackend(t, srv.Addr().String())

	store.Pause()
	defer store.Resume()
	start := time.Now()
	actx, acancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := b.Acquire(actx, "k", token, time.Minute)
	acancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire on a paused store: %v; want an error wrapping DeadlineExceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Acquire returned %v after it started; its context ended after 50ms", d)
	}
	if _, err := b.Watch(actx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Watch with an ended context: %v; want an error wrapping DeadlineExceeded", err)
	}

	failed := make(chan error, 1)
	go func() { failed <- b.Release(ctx, "k", token) }()
	if err := srv.Close(); err != nil {
		t.Errorf("Server.Close: %v", err)
	}
	if err := receive(t, "the release held by the closed server", failed); err == nil {
		t.Error("Release through a closed server: nil error")
	}
	b.Close()
	if _, err := b.Acquire(ctx, "k", token, time.Minute); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Acquire after Close: %v; want ErrClosed", err)
	}
	if _, err := netstore.New(srv.Addr().String(), netstore.WithDialTimeout(time.Second)); err == nil {
		t.Error("New with the server closed: nil error")
	}
}

// A new Server over the same Store carries on with its locks and fences.
func TestServerRestartKeepsStore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store := memory.NewStore()
	srv := serve(t, store)
	b := newBackend(t, srv.Addr().String())
	g, err := b.Acquire(ctx, "k", token, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	srv2 := serve(t, store)
	b2 := newBackend(t, srv2.Addr().String())
	if _, err := b2.Acquire(ctx, "k", "fedcba9876543210fedcba9876543210", time.Minute); !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("Acquire of a key held before the restart: %v; want ErrLocked", err)
	}
	if err := b2.Release(ctx, "k", token); err != nil {
		t.Fatalf("Release by the holder from before the restart: %v", err)
	}
	g2, err := b2.Acquire(ctx, "k", "fedcba9876543210fedcba9876543210", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if g2.Fence <= g.Fence {
		t.Errorf("fence %d after a restart, %d before", g2.Fence, g.Fence)
	}
}
