package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// waiterTTLShorterThanWait: two waiters of other clients, each with the
// short TTL, wait longer than the store's latest expiry of that TTL for a
// key held with the long one. When the holder releases, one takes the key within the slack, and
// the other once the first releases: what the store keeps of a waiter (a
// queue record, a watch) must live as long as the waiter waits, not as
// long as its TTL. Each holds the lock it got.
func (s *suite) waiterTTLShorterThanWait(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	h, err := s.client(t, lock.WithTTL(s.long)).TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	took := make(chan stamped, 2)
	for range 2 {
		b := s.backend(t)
		if _, ok := b.(backend.Notifier); !ok {
			b.Close()
			t.Skip("the backend offers no backend.Notifier: waiters poll")
		}
		c := s.clientOver(t, b, lock.WithTTL(s.short))
		wait := acquireStamped(ctx, t, c, key)
		go func() { took <- <-wait }()
		select {
		case <-lockedReplies(b):
		case <-time.After(s.slack + time.Second):
			t.Fatal("a waiter did not find the key held")
		}
	}
	// The waiters wait out their TTL, as late as the store may expire it,
	// and as long again.
	time.Sleep(s.caps.LatestExpiry(s.short) + s.short + s.caps.Granularity)
	released := time.Now()
	if err := h.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for i := range 2 {
		var g stamped
		select {
		case g = <-took:
		case <-time.After(s.slack + time.Second):
			t.Fatalf("waiter %d of 2, whose TTL %v is shorter than its wait, did not get the key within %v of its release", i+1, s.short, s.slack+time.Second)
		}
		if g.l == nil {
			t.FailNow()
		}
		if d := g.at.Sub(released); d > s.slack {
			t.Errorf("waiter %d of 2, whose TTL %v is shorter than its wait, got the key %v after its release; want within %v: what the store kept of the waiter did not outlive its TTL", i+1, s.short, d.Round(time.Millisecond), s.slack)
		}
		if o, err := s.client(t).TryAcquire(ctx, key, lock.WithTTL(s.long)); !errors.Is(err, lock.ErrLocked) {
			if err == nil {
				o.Release(ctx)
			}
			t.Fatalf("another client's TryAcquire while waiter %d holds the key: %v; want ErrLocked", i+1, err)
		}
		released = time.Now()
		if err := g.l.Release(ctx); err != nil {
			t.Errorf("Release: %v", err)
		}
	}
}

// cancelledWaiterRetakes: a waiter is cancelled while it waits, and its
// client at once waits for the key again; the holder then releases. The
// new wait takes the key within the slack and keeps it: what the
// cancelled wait left (a queue record, a watch, a lock the store handed to
// it, and their cleanup in the background) neither swallows the release
// nor takes the key from the new wait.
func (s *suite) cancelledWaiterRetakes(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	b := s.backend(t)
	if _, ok := b.(backend.Notifier); !ok {
		b.Close()
		t.Skip("the backend offers no backend.Notifier: waiters poll")
	}
	// A TTL a few slacks long: the new wait's lock is checked near its
	// deadline, with automatic renewal off.
	c := s.clientOver(t, b, lock.WithTTL(s.roundTTL(3*s.slack)), lock.WithAutoRenew(false))
	h, err := s.client(t, lock.WithTTL(s.long)).TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		l, err := c.Acquire(wctx, key)
		if err == nil {
			l.Release(ctx)
		}
		errc <- err
	}()
	select {
	case <-lockedReplies(b):
	case <-time.After(s.slack + time.Second):
		t.Fatal("the waiter did not find the key held")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled Acquire: %v; want context.Canceled", err)
	}
	took := acquireStamped(ctx, t, c, key)
	select {
	case <-lockedReplies(b):
	case g := <-took:
		if g.l != nil {
			g.l.Release(ctx)
		}
		t.Fatal("the new wait took the key while the holder held it")
	case <-time.After(s.slack + time.Second):
		t.Fatal("the new wait did not find the key held")
	}
	released := time.Now()
	if err := h.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	var g stamped
	select {
	case g = <-took:
	case <-time.After(s.slack + time.Second):
		t.Fatalf("the new wait of the client whose waiter was cancelled did not get the key within %v of its release: the cancelled wait swallowed it", s.slack+time.Second)
	}
	if g.l == nil {
		t.FailNow()
	}
	if d := g.at.Sub(released); d > s.slack {
		t.Errorf("the new wait got the key %v after its release; want within %v", d.Round(time.Millisecond), s.slack)
	}
	// The cancelled wait's cleanup runs in the background, with no
	// signal of its own: the new lease must stay held until close to its
	// deadline, and renew then.
	s.heldNearDeadline(ctx, t, g.l, "the lease of the new wait", "the cancelled wait's cleanup must not free a lock of another token")
	if err := g.l.Renew(ctx); err != nil {
		t.Errorf("Renew of the new wait's lease: %v", err)
	}
	if err := g.l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// stamped is a lease with the time it reached its caller.
type stamped struct {
	at time.Time
	l  *lock.Lease
}

// acquireStamped is acquireLater, whose lease comes with the time it
// arrived (nil when the Acquire failed).
func acquireStamped(ctx context.Context, t *testing.T, c *lock.Client, key string, opts ...lock.Option) <-chan stamped {
	got := acquireLater(ctx, t, c, key, opts...)
	out := make(chan stamped, 1)
	go func() {
		l := <-got
		out <- stamped{time.Now(), l}
	}()
	return out
}
