package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
	"github.com/distlock/lock/memory"
)

// hangingRenew is a backend whose Renew reports its start on started and
// then waits for its context to end, or for the test to let it go; it
// records a Close that comes while a Renew runs.
type hangingRenew struct {
	backend.Backend
	started     chan struct{}
	letGo       chan struct{} // closed by the test: a Renew still waiting returns
	inFlight    atomic.Int32
	closedUnder atomic.Bool
}

func (h *hangingRenew) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	h.started <- struct{}{}
	select {
	case <-ctx.Done():
		return backend.Grant{}, ctx.Err()
	case <-h.letGo:
		return backend.Grant{}, errors.New("let go by the test")
	}
}

// hangingBatch is hangingRenew for a backend that renews in batches:
// its RenewBatch hangs the same way.
type hangingBatch struct{ *hangingRenew }

func (h hangingBatch) RenewBatch(ctx context.Context, rs []backend.Renewal) []backend.RenewResult {
	_, err := h.Renew(ctx, "", "", 0)
	return backend.FailedRenewals(len(rs), err)
}

func (h *hangingRenew) Close() error {
	if h.inFlight.Load() > 0 {
		h.closedUnder.Store(true)
	}
	return h.Backend.Close()
}

// Close ends the automatic renewals in flight and waits for them before it
// closes the backend: no renewal runs on against a closed backend, and no
// goroutine of the Client outlives Close. (Close returned at once, and the
// renewal went on: on a real store, against a closed connection pool.) A
// lease renewed alone, and leases renewed in one batch.
func TestCloseWaitsForRenewalsInFlight(t *testing.T) {
	t.Run("alone", func(t *testing.T) { testCloseWaitsForRenewals(t, false) })
	t.Run("batch", func(t *testing.T) { testCloseWaitsForRenewals(t, true) })
}

func testCloseWaitsForRenewals(t *testing.T, batch bool) {
	ignore := goleak.IgnoreCurrent()
	const ttl = 30 * time.Second // the renewal at ttl/3
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	h := &hangingRenew{Backend: memory.New(memory.WithStoreClock(fc)), started: make(chan struct{}, 1), letGo: make(chan struct{})}
	defer close(h.letGo) // whatever happens, nothing waits past the test
	var b backend.Backend = h
	keys := []string{"k"}
	if batch {
		b = hangingBatch{h}
		keys = append(keys, "k2") // due together: one batch
	}
	c, err := lock.New(b, lock.WithClock(fc), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, err := c.TryAcquire(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	fc.Advance(ttl / 3) // the automatic renewal falls due, and hangs
	select {
	case <-h.started:
	case <-time.After(10 * time.Second):
		t.Fatal("no automatic renewal started a third of the TTL after the acquire")
	}

	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung behind an automatic renewal in flight: it waits for it without ending it")
	}
	if h.closedUnder.Load() {
		t.Error("Close closed the backend while an automatic renewal still ran against it")
	}
	if n := h.inFlight.Load(); n > 0 {
		t.Errorf("%d automatic renewal(s) still running after Close returned", n)
	}
	if err := goleak.Find(ignore); err != nil {
		t.Errorf("goroutines outlive Close: %v", err)
	}
}
