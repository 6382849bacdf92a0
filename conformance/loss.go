package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// lockFreedOutside: a lock released from outside its client (another client
// of the store releases it by its token, as an operator deleting the key
// would) ends its lease: at once on a backend that implements
// backend.LossNotifier (the store's report reaches Lease.Done without
// waiting for the next renewal; auto-renew is off here), by the next renewal
// on the others. A report that concerns another lock (the same key released
// and taken again by the same client, another key of the client) leaves a
// held lease alone.
func (s *suite) lockFreedOutside(t *testing.T) {
	ctx := s.ctx(t)
	key, other := s.key(t), s.key(t)
	b := s.backend(t)
	_, notifies := unguarded(b).(backend.LossNotifier)
	c := s.clientOver(t, b, lock.WithTTL(s.long), lock.WithAutoRenew(!notifies))
	outside := s.backend(t)
	defer outside.Close()

	// The key released and taken again: the first lease's watch, if any,
	// ends with it, and must not end the second.
	l1, err := c.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	l2, err := c.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire again: %v", err)
	}
	l3, err := c.Acquire(ctx, other)
	if err != nil {
		t.Fatalf("Acquire of another key: %v", err)
	}
	freed := time.Now()
	if err := outside.Release(ctx, other, l3.Token()); err != nil {
		t.Fatalf("another client's Release by the holder's token: %v", err)
	}
	bound := s.long/3 + s.slack // the next renewal
	how := "by its next renewal"
	if notifies {
		bound = s.slack
		how = "at once (the backend is a LossNotifier, and auto-renew is off)"
	}
	select {
	case <-l3.Done():
		t.Logf("the holder learned of the loss %v after the release from outside", time.Since(freed).Round(time.Millisecond))
	case <-time.After(bound):
		t.Fatalf("the holder of a lock released from outside was not told within %v; want it %s", bound, how)
	}
	if err := l3.Err(); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Err of the lease released from outside: %v; want ErrLost", err)
	}
	select {
	case <-l2.Done():
		t.Fatalf("the lease of the key released and taken again ended with the other key's loss: %v", l2.Err())
	default:
	}
	if err := l2.Renew(ctx); err != nil {
		t.Fatalf("Renew of the lease of the key released and taken again: %v", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// renewAfterLoss: once the client's deadline passed, Renew reports ErrLost
// without asking the store, and the lock is not re-acquired.
func (s *suite) renewAfterLoss(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	cb := s.counted(t)
	a := s.clientOver(t, cb, lock.WithAutoRenew(false))
	l, err := a.TryAcquire(ctx, key, lock.WithTTL(s.short))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	select {
	case <-l.Done():
	case <-time.After(s.short + s.slack):
		t.Fatalf("lease without renewal still valid %v after acquisition; TTL %v", s.short+s.slack, s.short)
	}
	if now := time.Now(); now.Before(l.Deadline()) {
		t.Errorf("Done closed %v before the deadline", l.Deadline().Sub(now))
	}
	if err := l.Err(); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Err after the deadline: %v; want ErrLost", err)
	}
	before := cb.calls.Load()
	if err := l.Renew(ctx); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Renew after loss: %v; want ErrLost", err)
	}
	if n := cb.calls.Load() - before; n != 0 {
		t.Errorf("Renew after loss sent %d requests to the store; want none", n)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release after a loss Done reported: %v; want nil (Err keeps the loss)", err)
	}
	if err := l.Err(); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Err after the release of a lost lease: %v; want ErrLost still", err)
	}
	b := s.client(t)
	wctx, cancel := context.WithTimeout(ctx, s.caps.LatestExpiry(s.short)+s.slack)
	defer cancel()
	l2, err := b.Acquire(wctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("Acquire by another client after the loss: %v", err)
	}
	successorDone(ctx, t, l, l2)
}

// lostSignal: the holder is cut off from the store; it must be told it lost
// the lock before the store could grant the key to anyone else.
func (s *suite) lostSignal(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	drift := max(promisedDrift(s.short), s.short/4)
	ab := s.backend(t)
	a := s.clientOver(t, ab, lock.WithDrift(drift))
	l, err := a.TryAcquire(ctx, key, lock.WithTTL(s.short))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	undo, whole, ok := s.cutOff(t, ab)
	if !ok {
		t.Skip("the harness offers neither Disconnecter nor Pauser: the store cannot be cut off")
	}
	type got struct {
		at  time.Time
		l   *lock.Lease
		err error
	}
	successor := make(chan got, 1)
	if !whole {
		b := s.client(t)
		go func() {
			l, err := b.Acquire(ctx, key, lock.WithTTL(s.long))
			successor <- got{time.Now(), l, err}
		}()
	}
	var lostAt time.Time
	select {
	case <-l.Done():
		lostAt = time.Now()
	case <-time.After(s.caps.LatestExpiry(s.short) + s.slack):
		t.Fatalf("holder cut off from the store was not told within %v; TTL %v", s.caps.LatestExpiry(s.short)+s.slack, s.short)
	}
	if err := l.Err(); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Err: %v; want ErrLost", err)
	}
	deadline := l.Deadline()
	earliestExpiry := deadline.Add(drift) // send time of the last successful request + TTL
	if lostAt.Before(deadline) {
		t.Errorf("told %v before its deadline", deadline.Sub(lostAt))
	}
	if lostAt.After(earliestExpiry) {
		t.Errorf("told %v after the store could have expired the lock (drift margin %v)", lostAt.Sub(earliestExpiry), drift)
	}
	undo()
	if whole {
		b := s.client(t)
		l2, err := b.Acquire(ctx, key, lock.WithTTL(s.long))
		successor <- got{time.Now(), l2, err}
	}
	g := <-successor
	if g.err != nil {
		t.Fatalf("successor Acquire: %v", g.err)
	}
	if !g.at.After(lostAt) {
		t.Errorf("successor held the key %v before the holder was told", lostAt.Sub(g.at))
	}
	if g.l.Fence() <= l.Fence() {
		t.Errorf("successor fence %d after %d; want strictly increasing", g.l.Fence(), l.Fence())
	}
	if err := g.l.Release(ctx); err != nil {
		t.Errorf("successor Release: %v", err)
	}
}
