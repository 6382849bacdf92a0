package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
)

// The cases of this file catch, on any backend, the classes of bugs that
// once let two holders be valid at once: a lease whose deadline is later
// than the store's expiry for its token; a lost signal delayed behind
// renewals; an acquire cancelled under load that leaves its lock; a reply
// lost or late after the store acted.

// inspector returns an Inspector over a new client of the store, or skips
// the case.
func (s *suite) inspector(t *testing.T) backend.Inspector {
	t.Helper()
	b := s.backend(t)
	t.Cleanup(func() { b.Close() })
	in, ok := b.(backend.Inspector)
	if !ok {
		t.Skip("the backend offers no backend.Inspector: the store's expiry cannot be read")
	}
	return in
}

// withinStore fails t when l is valid past the store's expiry of its lock:
// the store must hold key for l's token, for at least until l's deadline.
func (s *suite) withinStore(ctx context.Context, t *testing.T, in backend.Inspector, key string, l *lock.Lease, when string) {
	t.Helper()
	h, err := in.Inspect(ctx, key)
	after := time.Now()
	if err != nil {
		t.Fatalf("Inspect %s: %v", when, err)
	}
	if l.Err() != nil {
		return // lost: it claims nothing
	}
	if !h.Held || (h.Token != "" && h.Token != l.Token()) {
		t.Fatalf("%s: the lease is valid for %v more, but the store holds the key for %+v, not for its token", when, time.Until(l.Deadline()), h)
	}
	if h.Remaining <= 0 {
		return // the store does not say
	}
	latest := after.Add(h.Remaining + s.caps.Granularity + 2*time.Millisecond)
	if l.Deadline().After(latest) {
		t.Fatalf("%s: the lease is valid for %v more, the store expires its lock in %v: the deadline is later than the store's expiry", when, time.Until(l.Deadline()).Round(time.Millisecond), h.Remaining)
	}
}

// deadlineWithinStore: a lease's deadline is never later than the store's
// expiry for its token, after an acquire, a renewal, and a handoff between
// goroutines of one client waiting with different TTLs (a lock passed on
// ahead of the store must not outlive what the store grants its new owner).
func (s *suite) deadlineWithinStore(t *testing.T) {
	in := s.inspector(t)
	ctx := s.ctx(t)
	key := s.key(t)
	c := s.client(t)
	l, err := c.TryAcquire(ctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	s.withinStore(ctx, t, in, key, l, "after an acquire")
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	s.withinStore(ctx, t, in, key, l, "after a renewal")

	// Goroutines of c queue for the key: B with a long TTL, then C with a
	// short one and no renewals; the lock passes l -> B -> C.
	gotB := acquireLater(ctx, t, c, key, lock.WithTTL(s.long))
	waitWaiting(ctx, t, c, key, 1)
	gotC := acquireLater(ctx, t, c, key, lock.WithTTL(s.short), lock.WithAutoRenew(false))
	waitWaiting(ctx, t, c, key, 2)
	got := make(chan *lock.Lease, 2)
	go func() { got <- <-gotB }()
	go func() { got <- <-gotC }()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// The lock passes to one waiter, then the other; the short lease is
	// the one to check (in the client's queue, B comes first).
	first := <-got
	if first == nil {
		t.FailNow()
	}
	cl := first
	if first.TTL() != s.short {
		if err := first.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if cl = <-got; cl == nil {
			t.FailNow()
		}
	}
	if left := time.Until(cl.Deadline()); left > s.short {
		t.Fatalf("a lease of TTL %v passed on from a holder of TTL %v is valid for %v", s.short, s.long, left)
	}
	if err := cl.Renew(ctx); err != nil && !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the short lease: %v", err)
	}
	s.withinStore(ctx, t, in, key, cl, "after a handoff to a shorter TTL")
	if err := cl.Release(ctx); err != nil && !errors.Is(err, lock.ErrLost) {
		t.Errorf("Release: %v", err)
	}
	if cl == first {
		if b := <-got; b != nil {
			b.Release(ctx)
		}
	}
}

// acquireLater runs c.Acquire(ctx, key, opts...) on a goroutine of its own
// and sends its lease (nil on error, reported to t) on the returned channel.
// The case's end (t's cleanup, also after FailNow) cancels the Acquire and
// waits for the goroutine, so that it never reports to a finished test.
func acquireLater(ctx context.Context, t *testing.T, c *lock.Client, key string, opts ...lock.Option) <-chan *lock.Lease {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
	})
	got := make(chan *lock.Lease, 1)
	go func() {
		defer close(done)
		l, err := c.Acquire(ctx, key, opts...)
		if err != nil && ctx.Err() == nil { // not when the case is over
			t.Errorf("Acquire: %v", err)
		}
		got <- l
	}()
	return got
}

// waitWaiting waits until n goroutines of c queue for key. Stores in the
// process (InProcess) keep no queue in package lock: it returns at once.
func waitWaiting(ctx context.Context, t *testing.T, c *lock.Client, key string, n int) {
	t.Helper()
	if c.Capabilities().InProcess {
		return // no queue in package lock; the cases do not depend on the order
	}
	for c.Waiting(key) < n {
		if ctx.Err() != nil {
			t.Fatalf("%d goroutines never queued for %s", n, key)
		}
		time.Sleep(time.Millisecond) // poll the queue
	}
}

// retriedAcquire: an acquire sent again with the same token (a client
// library's retry after a lost reply) either reports the key as held or
// grants it again with the store's expiry counted from this request: a
// grant that keeps the first request's expiry would give the caller a
// deadline later than the store's. And a release sent again after it took
// effect succeeds.
func (s *suite) retriedAcquire(t *testing.T) {
	in := s.inspector(t)
	ctx := s.ctx(t)
	key := s.key(t)
	b := s.backend(t)
	defer b.Close()
	const token = "0123456789abcdef0123456789abcdef"
	first, err := b.Acquire(ctx, key, token, s.long)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer func() {
		// A release sent again after it took effect (a retry after a
		// lost reply) succeeds: package lock would otherwise report a
		// lease held until its release as lost.
		if err := b.Release(ctx, key, token); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := b.Release(ctx, key, token); err != nil {
			t.Errorf("the same release sent again: %v; want nil", err)
		}
	}()
	time.Sleep(s.short) // the first grant ages: its expiry is now well before a new one's
	sent := time.Now()
	again, err := b.Acquire(ctx, key, token, s.long)
	if err != nil {
		if !errors.Is(err, backend.ErrLocked) {
			t.Fatalf("the same acquire sent again: %v; want a grant or ErrLocked", err)
		}
		return
	}
	if again.Fence < first.Fence {
		t.Errorf("the same acquire sent again was granted with fence %d; the first got %d: a grant again keeps the fence it was granted, or takes a greater one (backend.Backend.Acquire)", again.Fence, first.Fence)
	}
	h, err := in.Inspect(ctx, key)
	if err != nil || !h.Held {
		t.Fatalf("Inspect: %+v, %v", h, err)
	}
	if h.Remaining > 0 {
		if least := s.long - time.Since(sent) - s.caps.Granularity - 2*time.Millisecond; h.Remaining < least {
			t.Fatalf("the same acquire sent again was granted, but the store expires the lock in %v: want at least %v (TTL from the second request)", h.Remaining, least)
		}
	}
}

// lostSignalWhileRenewalsHang: a client holds many leases renewed
// automatically and one lease that is not; its store hangs, and a pause
// makes every renewal and that lease's deadline fall due at once (a fake
// clock advanced in one step). The lease must be told at once, not after
// the renewals give up.
func (s *suite) lostSignalWhileRenewalsHang(t *testing.T) {
	d, ok := s.h.(Disconnecter)
	if !ok {
		t.Skip("the harness offers no Disconnecter: one client cannot be cut off")
	}
	ctx := s.ctx(t)
	fake := clock.NewFake(time.Now())
	bb := s.backend(t)
	c := s.clientOver(t, bb, lock.WithClock(fake), lock.WithTTL(s.long))
	const renewed = 70
	var held []*lock.Lease
	for i := range renewed {
		l, err := c.TryAcquire(ctx, fmt.Sprintf("%s/%d", s.key(t), i))
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		held = append(held, l)
	}
	// Renewals fall due at long/3; z's deadline just after.
	fake.AdvanceWait(s.long/3 - s.short/2)
	z, err := c.TryAcquire(ctx, s.key(t), lock.WithTTL(s.short), lock.WithAutoRenew(false))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	done := z.Done() // before the pause: Done checks the deadline itself
	if err := d.Disconnect(ctx, unguarded(bb)); err != nil {
		t.Fatalf("harness Disconnect: %v", err)
	}
	reconnect := sync.OnceFunc(func() {
		if err := d.Reconnect(ctx, unguarded(bb)); err != nil {
			t.Errorf("harness Reconnect: %v", err)
		}
	})
	defer reconnect()
	fake.Advance(s.short) // the renewals and z's deadline, at once
	select {
	case <-done:
	case <-time.After(s.slack + 500*time.Millisecond):
		// The renewals hang until Reconnect or their client's timeout;
		// z's deadline does not depend on them.
		t.Fatalf("z's deadline passed, but its lost signal waits behind %d renewals hanging on a cut-off store", renewed)
	}
	if !errors.Is(z.Err(), lock.ErrLost) {
		t.Errorf("Err: %v; want ErrLost", z.Err())
	}
	reconnect()
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release of a lease with time left: %v", err)
		}
	}
}

// cancelUnderLoad: acquires whose contexts end after 0-3ms, on goroutines
// each with keys of their own, leave no lock behind once the client is
// closed, whatever order their requests and cleanups reach the store in.
func (s *suite) cancelUnderLoad(t *testing.T) {
	in := s.inspector(t)
	ctx := s.ctx(t)
	c := s.client(t, lock.WithTTL(s.long))
	const goroutines = 16
	var keys []string
	for range goroutines {
		keys = append(keys, s.key(t))
	}
	stop := time.Now().Add(time.Second)
	var cancelled, held int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				actx, cancel := context.WithTimeout(ctx, time.Duration(i%4)*time.Millisecond)
				l, err := c.Acquire(actx, keys[g])
				cancel()
				mu.Lock()
				if err != nil {
					cancelled++
				} else {
					held++
				}
				mu.Unlock()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("Acquire: %v", err)
						return
					}
					continue
				}
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := c.Close(); err != nil { // waits for the cleanups
		t.Fatalf("Close: %v", err)
	}
	left := 0
	for _, k := range keys {
		h, err := in.Inspect(ctx, k)
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		if h.Held {
			left++
		}
	}
	t.Logf("%d acquires cancelled, %d held; %d keys left locked", cancelled, held, left)
	if cancelled == 0 {
		t.Fatal("no acquire was cancelled: the case tested nothing")
	}
	if left > 0 {
		t.Fatalf("%d of %d keys still locked after %d cancelled acquires and Close", left, goroutines, cancelled)
	}
}

// replyLost: replies lost or late after the store acted. A release whose
// reply is lost after it freed the key never reports the lease as lost (a
// lease held until its release did not overlap anyone); a release whose
// reply comes after the caller gave up leaves the next goroutine of the
// client a lease whose deadline is within the store's expiry, and lost
// before another client takes the key.
func (s *suite) replyLost(t *testing.T) {
	rh := s.replyHolder(t)
	in := s.inspector(t)
	s.subtest(t, "ReleaseReplyDropped", func(t *testing.T) {
		ctx := s.ctx(t)
		bb, _, key, l := s.acquiredOver(ctx, t, s.long)
		released := releaseHeld(ctx, ctx, t, in, rh, bb, l, key)
		replies(ctx, t, rh, bb).drop()
		if err := <-released; errors.Is(err, lock.ErrLost) {
			t.Fatalf("Release of a lease held until the store freed the key, after its reply was lost: %v; it must not report the lease as lost", err)
		}
	})
	s.subtest(t, "ReleaseReplyLate", func(t *testing.T) {
		ctx := s.ctx(t)
		ttl := max(5*s.short, time.Second)
		bb, c, key, a := s.acquiredOver(ctx, t, ttl)
		got := acquireLater(ctx, t, c, key)
		waitWaiting(ctx, t, c, key, 1)
		replies(ctx, t, rh, bb).hold()
		rctx, cancel := context.WithTimeout(ctx, ttl*3/10)
		a.Release(rctx) // gives up before its reply comes: the outcome is unknown
		cancel()
		replies(ctx, t, rh, bb).deliver()
		w := <-got
		if w == nil {
			t.FailNow()
		}
		s.withinStore(ctx, t, in, key, w, "the next goroutine's lease after a late release reply")
		o, err := s.client(t).Acquire(ctx, key, lock.WithTTL(s.long))
		if err != nil {
			t.Fatalf("Acquire by another client: %v", err)
		}
		if w.Err() == nil {
			t.Errorf("another client holds the key while the lease reports Err nil, valid %v more", time.Until(w.Deadline()))
		}
		o.Release(ctx)
	})
}

// releaseHeld holds bb's replies, starts l.Release(rctx) and returns once
// the store has freed key (the release ran; its reply is held); the
// channel carries what Release returns.
func releaseHeld(ctx, rctx context.Context, t *testing.T, in backend.Inspector, rh ReplyHolder, bb backend.Backend, l *lock.Lease, key string) <-chan error {
	t.Helper()
	replies(ctx, t, rh, bb).hold()
	released := make(chan error, 1)
	go func() { released <- l.Release(rctx) }()
	for { // until the store ran the release
		h, err := in.Inspect(ctx, key)
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		if !h.Held {
			return released
		}
		time.Sleep(time.Millisecond) // poll the store
	}
}

// releaseSentAgain: a release whose deadline passes while its reply is held
// (the store freed the key) reports its outcome unknown, and package lock
// sends it again in the background. Its client is cut off before the copy
// sent again can leave, and another client takes the key meanwhile; when
// the partition heals, that copy reaches the store after the new owner's
// acquire, and must leave its lock alone (a release is token-checked, and
// a release sent again changes nothing).
func (s *suite) releaseSentAgain(t *testing.T) {
	rh := s.replyHolder(t)
	d, ok := s.h.(Disconnecter)
	if !ok {
		t.Skip("the harness offers no Disconnecter: a release sent again cannot be held back")
	}
	in := s.inspector(t)
	ctx := s.ctx(t)
	bb, c, key, l := s.acquiredOver(ctx, t, s.long)
	// The caller gives up at the deadline, after the store acted and the
	// client was cut off (a cancel before the deadline may not end a call
	// before the client library's own timeouts: see the redis package).
	rctx, cancel := context.WithTimeout(ctx, max(s.short, 500*time.Millisecond))
	defer cancel()
	released := releaseHeld(ctx, rctx, t, in, rh, bb, l, key)
	if err := d.Disconnect(ctx, unguarded(bb)); err != nil {
		t.Fatalf("harness Disconnect: %v", err)
	}
	healed := false
	defer func() {
		if !healed {
			d.Reconnect(ctx, unguarded(bb))
		}
	}()
	if rctx.Err() != nil {
		t.Fatal("the release's deadline passed before its client was cut off: the store or this machine stalled; the copy sent again may have gone first")
	}
	if err := <-released; err == nil {
		t.Fatal("Release returned nil while its reply was held; want the context's error")
	}
	o, err := s.client(t).TryAcquire(ctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("TryAcquire by another client once the store freed the key: %v", err)
	}
	defer o.Release(ctx)
	healed = true
	if err := d.Reconnect(ctx, unguarded(bb)); err != nil {
		t.Fatalf("harness Reconnect: %v", err)
	}
	replies(ctx, t, rh, bb).deliver()
	c.Close() // waits for the release sent again
	h, err := in.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if !h.Held || (h.Fence != 0 && h.Fence != o.StoreFence()) {
		t.Fatalf("after the first owner's release was sent again, the store has %+v; want the new owner's lock, store fence %d", h, o.StoreFence())
	}
}

// acquiredOver takes a new key with a lease of ttl that is not renewed,
// through a warmed-up client of its own over a backend of its own; it
// returns the backend (to hold its replies or cut it off) and the client.
func (s *suite) acquiredOver(ctx context.Context, t *testing.T, ttl time.Duration) (backend.Backend, *lock.Client, string, *lock.Lease) {
	t.Helper()
	key := s.key(t)
	bb := s.backend(t)
	c := s.clientOver(t, bb, lock.WithTTL(ttl), lock.WithAutoRenew(false))
	s.warmUp(ctx, t, c)
	l, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	return bb, c, key, l
}

// warmUp passes a lock between two goroutines of c on a key of its own, so
// that the store has done every kind of request once (a script cache is
// loaded, say) before a case holds replies.
func (s *suite) warmUp(ctx context.Context, t *testing.T, c *lock.Client) {
	t.Helper()
	key := s.key(t)
	a, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	got := acquireLater(ctx, t, c, key)
	waitWaiting(ctx, t, c, key, 1)
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if b := <-got; b != nil {
		if err := b.Renew(ctx); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		b.Release(ctx)
	}
}

// replyHolder returns the harness's ReplyHolder, or skips the case.
func (s *suite) replyHolder(t *testing.T) ReplyHolder {
	t.Helper()
	rh, ok := s.h.(ReplyHolder)
	if !ok {
		t.Skip("the harness offers no ReplyHolder: replies cannot be held after the store acted")
	}
	return rh
}

// replyFaults holds, delivers or drops the replies to one backend the suite
// got from the harness, failing the case when the harness cannot.
type replyFaults struct {
	ctx context.Context
	t   *testing.T
	rh  ReplyHolder
	b   backend.Backend
}

func replies(ctx context.Context, t *testing.T, rh ReplyHolder, b backend.Backend) replyFaults {
	return replyFaults{ctx, t, rh, unguarded(b)}
}

func (r replyFaults) hold()    { r.check("HoldReplies", r.rh.HoldReplies(r.ctx, r.b)) }
func (r replyFaults) deliver() { r.check("DeliverReplies", r.rh.DeliverReplies(r.ctx, r.b)) }
func (r replyFaults) drop()    { r.check("DropReplies", r.rh.DropReplies(r.ctx, r.b)) }

func (r replyFaults) check(hook string, err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatalf("harness %s: %v", hook, err)
	}
}
