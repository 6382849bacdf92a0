package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
)

// extend: Lease.Extend with a new TTL. A bad TTL is refused
// (ErrInvalidTTL) and the lease stays as it was. On a backend whose locks
// keep their TTL (Capabilities.FixedTTL) another TTL is refused too, and
// the same TTL renews. Elsewhere a longer TTL moves the deadline, and the
// store keeps the lock that long: another client cannot take the key
// once the old TTL's latest expiry has passed, while the lease is valid.
func (s *suite) extend(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	c := s.client(t, lock.WithTTL(s.short), lock.WithAutoRenew(false))
	l, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	defer l.Release(ctx)
	dl := l.Deadline()
	for _, ttl := range []time.Duration{0, -s.short, lock.MaxTTL + 1} {
		if err := l.Extend(ctx, ttl); !errors.Is(err, lock.ErrInvalidTTL) {
			t.Errorf("Extend(%v): %v; want ErrInvalidTTL", ttl, err)
		}
	}
	if l.TTL() != s.short || !l.Deadline().Equal(dl) {
		t.Fatalf("after the refused Extends: TTL %v, deadline moved %v; want %v, unmoved", l.TTL(), l.Deadline().Sub(dl), s.short)
	}
	if s.caps.FixedTTL {
		if err := l.Extend(ctx, s.long); !errors.Is(err, lock.ErrInvalidTTL) {
			t.Errorf("Extend to %v on a backend whose locks keep their TTL: %v; want ErrInvalidTTL", s.long, err)
		}
		if err := l.Extend(ctx, s.short); err != nil {
			t.Errorf("Extend to the lease's own TTL: %v; want nil (a renewal)", err)
		}
		return
	}
	sent := time.Now()
	if err := l.Extend(ctx, s.long); err != nil {
		t.Fatalf("Extend to %v: %v", s.long, err)
	}
	if l.TTL() != s.long || l.Deadline().Before(sent.Add(s.long/2)) {
		t.Fatalf("after Extend to %v: TTL %v, deadline %v after the send; want the new TTL's", s.long, l.TTL(), l.Deadline().Sub(sent))
	}
	s.waitOutExpiry(s.short)
	if err := l.Err(); err != nil {
		t.Fatalf("the extended lease after the old TTL's latest expiry: %v; want valid", err)
	}
	other := s.client(t)
	if o, err := other.TryAcquire(ctx, key); !errors.Is(err, lock.ErrLocked) {
		if o != nil {
			o.Release(ctx)
		}
		t.Fatalf("another client after the old TTL's latest expiry: %v; want ErrLocked: the store must keep the lock for the new TTL", err)
	}
}
