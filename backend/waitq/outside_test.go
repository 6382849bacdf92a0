package waitq_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/backend/waitq"
	"github.com/distlock/lock/conformance"
)

// This file is the proof that an outside backend gets FIFO handover from
// waitq by implementing only the store's primitives: see outsideBackend.

// deadFor is how long a released token stays dead: an Acquire with it
// fails with backend.ErrInvalid.
const deadFor = 15 * time.Second

var outsideCaps = backend.Capabilities{MinTTL: 10 * time.Millisecond, ExpiryFactor: 1, FIFO: true}

// memStore is the store the outsideBackends share; it is also the
// conformance harness.
type memStore struct {
	mu    sync.Mutex
	keys  map[string]*entry
	dead  map[[2]string]tomb // {key, released token} -> its tombstone
	later []func()           // handoffs to report outside the mutex

	requests, attempts atomic.Int64
	queued             chan struct{} // receives (buffered one) when an Attempt queued
}

type entry struct {
	holder string
	expiry time.Time
	fence  uint64
	queue  []*record // waiters' records, in arrival order
	watch  map[chan struct{}]bool
}

// record is a waiter's place: the record is its own carrier, and expires
// unless refreshed.
type record struct {
	p      *place
	token  string
	ttl    time.Duration
	expiry time.Time
}

func newStore() *memStore {
	return &memStore{keys: map[string]*entry{}, dead: map[[2]string]tomb{}, queued: make(chan struct{}, 1)}
}

func (s *memStore) NewBackend(context.Context) (backend.Backend, error) {
	return &outsideBackend{s: s, places: waitq.NewGroup()}, nil
}

func (s *memStore) Capabilities() backend.Capabilities { return outsideCaps }
func (s *memStore) Requests() int64                    { return s.requests.Load() }

// do runs f on key's entry, with its expired records gone, under the
// mutex at the store's time; then it reports the handoffs f left.
func (s *memStore) do(key string, f func(e *entry, now time.Time) error) error {
	s.requests.Add(1)
	s.mu.Lock()
	now := time.Now()
	e := s.keys[key]
	if e == nil {
		e = &entry{watch: map[chan struct{}]bool{}}
		s.keys[key] = e
	}
	e.queue = slices.DeleteFunc(e.queue, func(r *record) bool { return !now.Before(r.expiry) })
	err := f(e, now)
	later := s.later
	s.later = nil
	s.mu.Unlock()
	for _, handoff := range later {
		handoff()
	}
	return err
}

// tomb is a released token's tombstone: until when it is dead, and
// whether its release freed the lock (a release sent again answers the
// same).
type tomb struct {
	until time.Time
	held  bool
}

func (s *memStore) isDead(key, token string, now time.Time) bool {
	t, ok := s.dead[[2]string{key, token}]
	return ok && now.Before(t.until)
}

// release frees key, held by token: the oldest live record gets the lock,
// with its expiry and a new fence, and its place hears of it once the
// mutex is released; with no record, the key's watchers are woken.
func (s *memStore) release(key string, e *entry, token string, now time.Time) {
	s.dead[[2]string{key, token}] = tomb{until: now.Add(deadFor), held: true}
	if len(e.queue) == 0 {
		e.holder = ""
		for ch := range e.watch {
			wake(ch)
		}
		return
	}
	r := e.queue[0]
	e.queue = e.queue[1:]
	g := e.grant(r.token, r.expiry)
	g.TTL = r.ttl
	q, tok := r.p.q, r.token
	s.later = append(s.later, func() { q.Handoff(tok, g) })
}

func (e *entry) held(now time.Time) bool { return e.holder != "" && now.Before(e.expiry) }

func (e *entry) remaining(now time.Time) time.Duration {
	if !e.held(now) {
		return 0
	}
	return e.expiry.Sub(now)
}

func (e *entry) grant(token string, expiry time.Time) backend.Grant {
	e.holder, e.expiry = token, expiry
	e.fence++
	return backend.Grant{Fence: e.fence}
}

// wakeHead wakes the first waiter when the key is free (its holder expired).
func (e *entry) wakeHead(now time.Time) {
	if !e.held(now) && len(e.queue) > 0 {
		e.queue[0].p.q.Wake()
	}
}

func (e *entry) index(p *place) int {
	return slices.IndexFunc(e.queue, func(r *record) bool { return r.p == p })
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func invalid(token string) error {
	return fmt.Errorf("%w: token %s was released before", backend.ErrInvalid, token)
}

// outsideBackend is one client of a memStore, written as an author
// outside this module would write it: the proof that a backend gets FIFO
// handover from waitq by implementing only the store's primitives
// (waitq.Store: Attempt, Refresh, Leave, Stop, in place below) and calling
// the place's hooks (Handoff, Wake). It passes the conformance suite
// through package lock, which puts every waiting Acquire in its queue (it
// declares FIFO, and not InProcess). The store keeps the guarantees of
// waitq's package doc: a key's state and its waiters' records change under
// one mutex, each request in one step.
type outsideBackend struct {
	s      *memStore
	places *waitq.Group
	closed atomic.Bool
}

var (
	_ backend.Queuer    = (*outsideBackend)(nil)
	_ backend.Describer = (*outsideBackend)(nil)
	_ backend.Inspector = (*outsideBackend)(nil)
)

// do is memStore.do for an open backend whose caller still waits.
func (b *outsideBackend) do(ctx context.Context, key string, f func(e *entry, now time.Time) error) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.s.do(key, f)
}

// Acquire takes a free key only when nobody queues.
func (b *outsideBackend) Acquire(ctx context.Context, key, token string, ttl time.Duration) (g backend.Grant, err error) {
	err = b.do(ctx, key, func(e *entry, now time.Time) error {
		switch {
		case b.s.isDead(key, token, now):
			return invalid(token)
		case e.held(now) || len(e.queue) > 0:
			e.wakeHead(now)
			return backend.Locked(e.remaining(now))
		}
		g = e.grant(token, now.Add(ttl))
		return nil
	})
	return g, err
}

func (b *outsideBackend) Renew(ctx context.Context, key, token string, ttl time.Duration) (g backend.Grant, err error) {
	err = b.do(ctx, key, func(e *entry, now time.Time) error {
		if !e.held(now) || e.holder != token {
			return backend.ErrNotHeld
		}
		e.expiry, g.Fence = now.Add(ttl), e.fence
		return nil
	})
	return g, err
}

func (b *outsideBackend) Release(ctx context.Context, key, token string) error {
	return b.do(ctx, key, func(e *entry, now time.Time) error {
		switch {
		case b.s.isDead(key, token, now):
			if b.s.dead[[2]string{key, token}].held {
				return nil // a release sent again after it freed the lock
			}
			return backend.ErrNotHeld
		case !e.held(now) || e.holder != token:
			// A release that finds nothing kills the token too.
			b.s.dead[[2]string{key, token}] = tomb{until: now.Add(deadFor)}
			return backend.ErrNotHeld
		}
		b.s.release(key, e, token, now)
		return nil
	})
}

func (b *outsideBackend) Inspect(ctx context.Context, key string) (h backend.Holder, err error) {
	err = b.do(ctx, key, func(e *entry, now time.Time) error {
		if e.held(now) {
			h = backend.Holder{Held: true, Token: e.holder, Fence: e.fence, Remaining: e.remaining(now)}
		}
		return nil
	})
	return h, err
}

func (b *outsideBackend) Capabilities() backend.Capabilities { return outsideCaps }

func (b *outsideBackend) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.places.Close()
	}
	return nil
}

// Watch wakes every watcher of key when a release frees it.
func (b *outsideBackend) Watch(ctx context.Context, key string) (backend.Watch, error) {
	w := &watch{s: b.s, ch: make(chan struct{}, 1)}
	if err := b.do(ctx, key, func(e *entry, _ time.Time) error { w.e = e; e.watch[w.ch] = true; return nil }); err != nil {
		return nil, err
	}
	return w, nil
}

type watch struct {
	s  *memStore
	e  *entry
	ch chan struct{}
}

func (w *watch) C() <-chan struct{} { return w.ch }

func (w *watch) Close(bool) error {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	delete(w.e.watch, w.ch)
	return nil
}

func (b *outsideBackend) Queue(key string) (backend.Queue, error) {
	if b.closed.Load() {
		return nil, backend.ErrClosed
	}
	p := &place{b: b, key: key}
	p.q = b.places.New(p)
	return p.q, nil
}

// place is the store side of one waiter's place (waitq.Store).
type place struct {
	b   *outsideBackend
	key string
	q   *waitq.Place
}

// Attempt takes over a lock handed to a.Prev, or takes the key when it is
// free with no live record before the place's; else it writes the place's
// record with a.Token, where it lives, or at the back.
func (p *place) Attempt(ctx context.Context, a waitq.Attempt) (res waitq.Result, err error) {
	sent := time.Now()
	err = p.b.do(ctx, p.key, func(e *entry, now time.Time) error {
		p.b.s.attempts.Add(1)
		if p.b.s.isDead(p.key, a.Token, now) {
			return invalid(a.Token)
		}
		i := e.index(p)
		if e.held(now) && a.Prev != "" && e.holder == a.Prev || !e.held(now) && (i == 0 || len(e.queue) == 0) {
			if i >= 0 {
				e.queue = slices.Delete(e.queue, i, i+1)
			}
			res.Grant = e.grant(a.Token, now.Add(a.TTL))
			return nil
		}
		if i < 0 {
			i = len(e.queue)
			e.queue = append(e.queue, &record{p: p})
		}
		r := e.queue[i]
		r.token, r.ttl, r.expiry = a.Token, a.TTL, now.Add(a.TTL)
		res = waitq.Result{Queued: true, Refreshed: sent}
		if i == 0 {
			res.RetryIn = e.remaining(now) + time.Millisecond // an expiry hands nothing over
		}
		e.wakeHead(now)
		wake(p.b.s.queued)
		return backend.Locked(e.remaining(now))
	})
	return res, err
}

// Refresh extends the record's life; the first place learns when the
// holder expires.
func (p *place) Refresh(ctx context.Context, ttl time.Duration) (r waitq.Refreshed, err error) {
	err = p.b.do(ctx, p.key, func(e *entry, now time.Time) error {
		switch i := e.index(p); {
		case i < 0:
			r.Gone = true
		case i == 0:
			r.RetryIn = e.remaining(now) + time.Millisecond
			fallthrough
		default:
			e.queue[i].expiry = now.Add(ttl)
		}
		return nil
	})
	return r, err
}

// Leave deletes the record and releases a lock handed to the waiter; it
// runs even after Close, which waits for it.
func (p *place) Leave(ctx context.Context, l waitq.Leaving) error {
	return p.b.s.do(p.key, func(e *entry, now time.Time) error {
		e.queue = slices.DeleteFunc(e.queue, func(r *record) bool { return r.p == p })
		tokens := []string{l.Token}
		if l.Handed != nil {
			tokens = append(tokens, l.Handed.Token)
		}
		for _, tok := range tokens {
			if tok != "" && e.held(now) && e.holder == tok {
				p.b.s.release(p.key, e, tok, now)
			}
		}
		e.wakeHead(now)
		return nil
	})
}

// Stop has nothing to stop: the store keeps no watch or timer per place,
// and a record goes with its handover, its grant, or Leave.
func (p *place) Stop(bool, *backend.Handover) {}

// TestOutsideConformance runs the suite on the outside-style store, in
// virtual time (it is all in this process).
func TestOutsideConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness { return newStore() }, conformance.VirtualTime())
}

// TestOutsideHandoverInOrder: three waiters of separate clients, queued in
// turn behind a holder, are served in arrival order, each by a handover:
// each sent one Attempt, the one that queued it, and asked no more.
func TestOutsideHandoverInOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newStore()
	client := func() *lock.Client {
		b, _ := s.NewBackend(ctx)
		c, err := lock.New(b, lock.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	prev, err := client().TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	type turn struct {
		waiter int
		l      *lock.Lease
	}
	served := make(chan turn)
	for i := range 3 {
		c := client()
		go func() {
			l, err := c.Acquire(ctx, "k")
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			served <- turn{i, l}
		}()
		select {
		case <-s.queued: // the store queued waiter i
		case <-ctx.Done():
			t.Fatalf("waiter %d never queued", i)
		}
	}
	for i := range 3 {
		if err := prev.Release(ctx); err != nil {
			t.Fatal(err)
		}
		got := <-served
		if got.l == nil {
			t.FailNow()
		}
		if got.waiter != i || got.l.Fence() <= prev.Fence() {
			t.Fatalf("waiter %d served in turn %d with fence %d after %d; want arrival order, fences increasing", got.waiter, i, got.l.Fence(), prev.Fence())
		}
		prev = got.l
	}
	if err := prev.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := s.attempts.Load(); n != 3 {
		t.Errorf("%d Attempts for 3 waiters; want 3: each served by a handover, without asking again", n)
	}
}
