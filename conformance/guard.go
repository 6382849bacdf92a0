package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
)

// guard wraps every backend the suite gets from the harness and watches
// each call: one still running long after its context ended means a
// backend that ignores its context, which would otherwise hang the case
// until go test's global timeout and end in a goroutine dump. The guard
// then stops the run at once, naming the call and the case: a panic, since
// the case's own goroutine is the one stuck in the call.
type guard struct {
	b      backend.Backend
	kase   string
	grace  time.Duration
	locked chan struct{} // receives (buffered one) when an Acquire returned ErrLocked

	mu    sync.Mutex
	hooks interceptors
}

// interceptors are a case's hooks into the calls through one guard, to put
// an event of its own at an exact point of package lock's requests. Each
// runs in the caller's goroutine, before the call is forwarded (or after it
// returned), and must return once ctx ends.
type interceptors struct {
	// transfer runs before a Transfer is forwarded.
	transfer func(ctx context.Context, opt backend.TransferOptions)
	// waiting runs when a waiter starts to wait: before a Watch is
	// forwarded, and after a Queue.Acquire returned ErrLocked (the store
	// queued the waiter, which then waits on its place).
	waiting func(ctx context.Context)
}

// intercept sets the hooks of the guard of b (a backend from
// suite.backend) until the case ends.
func intercept(t *testing.T, b backend.Backend, hooks interceptors) {
	g := b.(interface{ guardOf() *guard }).guardOf()
	g.mu.Lock()
	g.hooks = hooks
	g.mu.Unlock()
	t.Cleanup(func() {
		g.mu.Lock()
		g.hooks = interceptors{}
		g.mu.Unlock()
	})
}

func (g *guard) guardOf() *guard { return g }

func (g *guard) interceptors() interceptors {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.hooks
}

// call starts watching one call of op; the returned function ends it.
func (g *guard) call(ctx context.Context, op string) func() {
	if ctx.Done() == nil {
		return func() {} // a context that never ends
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		t := time.NewTimer(g.grace)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			panic(fmt.Sprintf("conformance: case %s: backend %s ignores its context: still running %v after the context ended (%v); a backend call must return promptly with an error wrapping ctx.Err()", g.kase, op, g.grace, context.Cause(ctx)))
		}
	}()
	return func() { close(done) }
}

func (g *guard) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	defer g.call(ctx, "Acquire")()
	gr, err := g.b.Acquire(ctx, key, token, ttl)
	if errors.Is(err, backend.ErrLocked) {
		select {
		case g.locked <- struct{}{}:
		default:
		}
	}
	return gr, err
}

func (g *guard) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	defer g.call(ctx, "Renew")()
	return g.b.Renew(ctx, key, token, ttl)
}

func (g *guard) Release(ctx context.Context, key, token string) error {
	defer g.call(ctx, "Release")()
	return g.b.Release(ctx, key, token)
}

func (g *guard) Close() error { return g.b.Close() }

// Capabilities forwards the backend's, or reports none, as package lock
// sees a backend without a Describer.
func (g *guard) Capabilities() backend.Capabilities {
	if d, ok := g.b.(backend.Describer); ok {
		return d.Capabilities()
	}
	return backend.Capabilities{}
}

// The forwarding types below give a guard one optional interface each;
// withInterfaces (guard_gen.go, written by conformance/internal/guardgen)
// combines them into a backend with exactly the optional interfaces of
// the wrapped one.
//go:generate go run ./internal/guardgen -o guard_gen.go

type guardWatch struct{ g *guard }

func (w guardWatch) Watch(ctx context.Context, key string) (backend.Watch, error) {
	defer w.g.call(ctx, "Watch")()
	if f := w.g.interceptors().waiting; f != nil {
		f(ctx)
	}
	return w.g.b.(backend.Notifier).Watch(ctx, key)
}

// guardQueue forwards a backend.Queuer, whose places' calls it watches.
type guardQueue struct{ g *guard }

func (q guardQueue) Watch(ctx context.Context, key string) (backend.Watch, error) {
	return guardWatch(q).Watch(ctx, key)
}

func (q guardQueue) Queue(key string) (backend.Queue, error) {
	p, err := q.g.b.(backend.Queuer).Queue(key)
	if err != nil {
		return nil, err
	}
	return guardPlace{p, q.g}, nil
}

type guardPlace struct {
	backend.Queue
	g *guard
}

func (p guardPlace) Acquire(ctx context.Context, token string, ttl time.Duration) (backend.Grant, error) {
	defer p.g.call(ctx, "Queue.Acquire")()
	gr, err := p.Queue.Acquire(ctx, token, ttl)
	if errors.Is(err, backend.ErrLocked) {
		select {
		case p.g.locked <- struct{}{}:
		default:
		}
		if f := p.g.interceptors().waiting; f != nil {
			f(ctx)
		}
	}
	return gr, err
}

type guardInspect struct{ g *guard }

func (i guardInspect) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	defer i.g.call(ctx, "Inspect")()
	return i.g.b.(backend.Inspector).Inspect(ctx, key)
}

type guardTransfer struct{ g *guard }

func (x guardTransfer) Transfer(ctx context.Context, key, from, to string, ttl time.Duration, opt backend.TransferOptions) (backend.Transferred, error) {
	defer x.g.call(ctx, "Transfer")()
	if f := x.g.interceptors().transfer; f != nil {
		f(ctx, opt)
	}
	return x.g.b.(backend.Transferer).Transfer(ctx, key, from, to, ttl, opt)
}

type guardLoss struct{ g *guard }

func (l guardLoss) NotifyLoss(key, token string, fence uint64, lost func(error)) (stop func()) {
	return l.g.b.(backend.LossNotifier).NotifyLoss(key, token, fence, lost)
}

type guardBatch struct{ g *guard }

func (r guardBatch) RenewBatch(ctx context.Context, rs []backend.Renewal) []backend.RenewResult {
	defer r.g.call(ctx, "RenewBatch")()
	return r.g.b.(backend.BatchRenewer).RenewBatch(ctx, rs)
}

type guardPrefix struct{ g *guard }

func (p guardPrefix) TokenPrefix(ttl time.Duration) (string, error) {
	return p.g.b.(backend.TokenPrefixer).TokenPrefix(ttl)
}

// guarded wraps b in a guard that keeps b's optional interfaces visible.
// Every suite run checks that it did, on the real backend.
func guarded(b backend.Backend, kase string, grace time.Duration) backend.Backend {
	w := withInterfaces(&guard{b: b, kase: kase, grace: grace, locked: make(chan struct{}, 1)})
	if interfacesOf(w) != interfacesOf(b) {
		panic(fmt.Sprintf("conformance: the guard of %T has the optional interfaces %v of %v; want those of the backend (%v)", b, interfacesOf(w), optionalInterfaces, interfacesOf(b)))
	}
	return w
}

// unguarded returns the backend the harness made, for its hooks.
func unguarded(b backend.Backend) backend.Backend {
	type inner interface{ harnessBackend() backend.Backend }
	if u, ok := b.(inner); ok {
		return u.harnessBackend()
	}
	return b
}

func (g *guard) harnessBackend() backend.Backend { return g.b }

// lockedReplies returns a channel that receives when an Acquire through b
// found the key held (the store has seen the caller wait).
func lockedReplies(b backend.Backend) <-chan struct{} {
	type observed interface{ lockedC() <-chan struct{} }
	return b.(observed).lockedC()
}

func (g *guard) lockedC() <-chan struct{} { return g.locked }
