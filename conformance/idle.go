package conformance

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/distlock/lock"
)

// idleResourcesExpire: a burst of acquires on 16 keys at once fills the
// backend's pools (the sessions, leases and connections it keeps idle for
// its next locks); the client then stands idle until the store has expired
// everything it keeps idle (the backend's declared latest expiry of the
// TTL they were made for, which bounds them as it bounds the locks they
// carry); then it acquires 16 keys again, fresh ones and the burst's,
// holding each until all are taken, so that every acquire meets what the
// pools kept. Every grant must be real: a fence, and another client's
// TryAcquire refused while it is held; the history is checked.
//
// The short TTL leaves little room on a loaded machine (16 concurrent
// acquires of a five-node Redlock can spend most of 200ms), so a lease may
// be lost before it is released: its Release then reports ErrLost, which is
// the promise kept, not broken, and a lease lost before another client's
// TryAcquire is no longer held. The history checks every such case.
func (s *suite) idleResourcesExpire(t *testing.T) {
	ctx := s.ctx(t)
	const n = 16
	rec := s.newRecorder()
	c := s.client(t, lock.WithTTL(s.short))
	other := s.client(t, lock.WithTTL(s.short))
	keys := make([]string, n)
	var wg sync.WaitGroup
	for i := range keys {
		keys[i] = s.key(t)
	}
	leases := make([]*lock.Lease, n)
	for i, k := range keys {
		wg.Go(func() {
			l, err := rec.acquire(ctx, 0, c, k, true, s.short)
			if err != nil {
				t.Errorf("burst: Acquire: %v", err)
				return
			}
			leases[i] = l
		})
	}
	wg.Wait()
	for _, l := range leases {
		if l != nil {
			if err := rec.release(ctx, 0, l); err != nil && !errors.Is(err, lock.ErrLost) {
				t.Errorf("burst: Release: %v", err)
			}
		}
	}
	if t.Failed() {
		return
	}
	s.waitOutExpiry(s.short) // what the backend keeps idle expires too

	held := make([]*lock.Lease, 0, n)
	for i := range n {
		key := keys[i]
		if i%2 == 0 {
			key = s.key(t) // a fresh key
		}
		l, err := rec.acquire(ctx, 0, c, key, true, s.short)
		if err != nil {
			t.Errorf("after the idle resources expired: Acquire of a %s key: %v", fresh(i), err)
			continue
		}
		held = append(held, l)
		if l.Fence() == 0 {
			t.Errorf("after the idle resources expired: a lease of a %s key with fence 0", fresh(i))
		}
		if ol, err := rec.acquire(ctx, 1, other, key, false, s.short); !errors.Is(err, lock.ErrLocked) {
			if err == nil && errors.Is(l.Err(), lock.ErrLost) {
				// Lost before the other client asked: no longer held.
				rec.release(ctx, 1, ol)
				continue
			}
			t.Errorf("after the idle resources expired: another client's TryAcquire of a %s key held by a lease of fence %d: %v; want ErrLocked (two holders)", fresh(i), l.Fence(), err)
			if ol != nil {
				rec.release(ctx, 1, ol)
			}
		}
	}
	for _, l := range held {
		if err := rec.release(ctx, 0, l); err != nil && !errors.Is(err, lock.ErrLost) {
			t.Errorf("Release: %v", err)
		}
	}
	s.checkHistory(t, rec)
}

func fresh(i int) string {
	if i%2 == 0 {
		return "fresh"
	}
	return fmt.Sprintf("burst's (%d)", i)
}
