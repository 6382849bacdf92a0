package conformance

import (
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
