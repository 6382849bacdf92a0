package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
)

// staleOwner checks that the store itself refuses a stale owner's renew and
// release. The stale owner runs on a frozen clock, so package lock believes
// its lease valid and does send the requests: as after a client clock that
// runs slow, or a pause between the deadline check and the request.
func (s *suite) staleOwner(t *testing.T) {
	type setup struct {
		rec        *recorder
		stale      *lock.Lease
		successor  *lock.Lease
		bystander  *lock.Client
		successorC *lock.Client
		key        string
	}
	prepare := func(t *testing.T, withSuccessor bool) setup {
		ctx := s.ctx(t)
		su := setup{rec: s.newRecorder(), key: s.key(t)}
		frozen := clock.NewFake(time.Now())
		stale := s.client(t, lock.WithClock(frozen), lock.WithAutoRenew(false))
		l, err := su.rec.acquire(ctx, 0, stale, su.key, false, s.short)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		su.stale = l
		s.waitOutExpiry(s.short)
		su.successorC = s.client(t)
		su.bystander = s.client(t)
		if withSuccessor {
			su.successor, err = su.rec.acquire(ctx, 1, su.successorC, su.key, true, s.long)
			if err != nil {
				t.Fatalf("successor Acquire after the stale owner's TTL: %v", err)
			}
			if su.successor.Fence() <= l.Fence() {
				t.Errorf("successor fence %d not above the stale owner's %d", su.successor.Fence(), l.Fence())
			}
		}
		return su
	}
	// successorUntouched checks that the successor still holds the key.
	successorUntouched := func(t *testing.T, su setup) {
		ctx := s.ctx(t)
		if _, err := su.rec.acquire(ctx, 2, su.bystander, su.key, false, s.long); !errors.Is(err, lock.ErrLocked) {
			t.Errorf("TryAcquire by a third client: %v; want ErrLocked (the successor must still hold the key)", err)
		}
		if err := su.rec.renew(ctx, 1, su.successor); err != nil {
			t.Errorf("successor Renew: %v; want success", err)
		}
		if in, ok := su.successorC.Backend().(backend.Inspector); ok {
			h, err := in.Inspect(ctx, su.key)
			if err != nil {
				t.Errorf("Inspect: %v", err)
			} else if !h.Held || h.Fence != su.successor.StoreFence() {
				t.Errorf("Inspect: %+v; want held with the successor's store fence %d", h, su.successor.StoreFence())
			}
		}
		if err := su.rec.release(ctx, 1, su.successor); err != nil {
			t.Errorf("successor Release: %v", err)
		}
		s.checkHistory(t, su.rec)
	}
	wantStoreSaidLost := func(t *testing.T, op string, err error) {
		t.Helper()
		if !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("%s by the stale owner: %v; want ErrLost from the store's ErrNotHeld", op, err)
		}
	}

	s.subtest(t, "RenewAfterExpiry", func(t *testing.T) {
		su := prepare(t, false)
		ctx := s.ctx(t)
		wantStoreSaidLost(t, "Renew", su.rec.renew(ctx, 0, su.stale))
		l, err := su.rec.acquire(ctx, 2, su.bystander, su.key, false, s.long)
		if err != nil {
			t.Fatalf("TryAcquire after the stale renew: %v; want success (a renew must never re-acquire an expired lock)", err)
		}
		if err := su.rec.release(ctx, 2, l); err != nil {
			t.Errorf("Release: %v", err)
		}
		s.checkHistory(t, su.rec)
	})
	s.subtest(t, "RenewAfterSuccessor", func(t *testing.T) {
		su := prepare(t, true)
		wantStoreSaidLost(t, "Renew", su.rec.renew(s.ctx(t), 0, su.stale))
		successorUntouched(t, su)
	})
	s.subtest(t, "ReleaseAfterSuccessor", func(t *testing.T) {
		su := prepare(t, true)
		err := su.rec.release(s.ctx(t), 0, su.stale)
		// A backend's loss report (backend.LossNotifier) may end the
		// lease before the release, which then returns nil while Err
		// keeps the loss; otherwise the release reports the store's
		// answer.
		if err != nil || !errors.Is(su.stale.Err(), lock.ErrLost) {
			wantStoreSaidLost(t, "Release", err)
		}
		successorUntouched(t, su)
	})
}
