package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
)

// lockEvicted: the store loses a lock while its lease renews itself, by
// the store's own doing (the Evicter hook: an eviction, an expiry, a lost
// write), so that the holder's token stays alive. The lease must end lost
// at its next renewal, and must not take the key back: another client
// then takes the key and keeps it through the evicted lease's renewal
// times. (StoreLosesLock frees the lock with a release, which kills the
// token: a watchdog that takes the key again after a renewal found it
// free is refused there, and goes unseen.)
func (s *suite) lockEvicted(t *testing.T) {
	ev, ok := s.h.(Evicter)
	if !ok {
		t.Skip("the harness offers no Evicter: the store cannot lose a lock on its own")
	}
	ctx := s.ctx(t)
	key := s.key(t)
	ttl := s.roundTTL(max(3*s.short, time.Second))
	l, err := s.client(t, lock.WithTTL(ttl)).TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if err := ev.Evict(ctx, key); err != nil {
		t.Fatalf("harness Evict: %v", err)
	}
	select {
	case <-l.Done():
	case <-time.After(ttl/3 + s.slack):
		t.Fatalf("the store lost the lock, and the lease is still valid %v later, after its next renewal: a renewal that finds the key free must end the lease, never take the key again", ttl/3+s.slack)
	}
	if !errors.Is(l.Err(), lock.ErrLost) {
		t.Errorf("Err: %v; want ErrLost", l.Err())
	}
	o, err := s.client(t, lock.WithAutoRenew(false)).TryAcquire(ctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("another client after the lock was lost: %v; want the key free", err)
	}
	if o.Fence() <= l.Fence() {
		t.Errorf("fence %d after %d; want strictly increasing", o.Fence(), l.Fence())
	}
	// Two more renewal periods of the lost lease: nothing of it may take
	// the key from the new holder.
	time.Sleep(2*ttl/3 + s.slack) // waiting out most of a TTL
	if err := o.Renew(ctx); err != nil {
		t.Errorf("the new holder's Renew %v after it took the key: %v; want it still held", 2*ttl/3+s.slack, err)
	}
	if err := o.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}
