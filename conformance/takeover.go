package conformance

import (
	"testing"
	"time"

	"github.com/distlock/lock"
)

// takeover: a holder vanishes without releasing; a waiter gets the key after
// the TTL, never before, and within the declared expiry bound.
func (s *suite) takeover(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	a := s.client(t, lock.WithAutoRenew(false))
	b := s.client(t)
	sentA := time.Now()
	la, err := a.TryAcquire(ctx, key, lock.WithTTL(s.short))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	gotA := time.Now()
	// a vanishes: it never renews or releases.
	lb, err := b.Acquire(ctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("Acquire by the waiter: %v", err)
	}
	gotB := time.Now()
	tolerance := max(s.caps.Granularity, time.Millisecond)
	if early := gotB.Sub(sentA); early < s.short-tolerance {
		t.Errorf("waiter got the key %v after the holder's request; the TTL is %v: taken over before expiry", early, s.short)
	}
	if late, bound := gotB.Sub(gotA), s.caps.LatestExpiry(s.short)+s.slack; late > bound {
		t.Errorf("waiter got the key %v after the holder; want within %v (declared latest expiry plus %v)", late, bound, s.slack)
	}
	successorDone(ctx, t, la, lb)
}
