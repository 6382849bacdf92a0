package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
	"github.com/distlock/lock/memory"
)

// renewSpy reports each Renew that reaches it, before passing it on.
type renewSpy struct {
	backend.Backend
	renews chan string
}

func (s *renewSpy) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	s.renews <- key
	return s.Backend.Renew(ctx, key, token, ttl)
}

// A Client whose store hangs, with every one of its renewal slots taken by
// a renewal that waits for it, delays no other Client's renewals: the
// slots are per Client. (They were one semaphore for the process: B's
// renewal waited for A's store.)
func TestRenewSlotsPerClient(t *testing.T) {
	ctx := context.Background()
	const ttl = 30 * time.Second // renewals at about ttl/3
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	store := memory.NewStore(memory.WithStoreClock(fc))

	ma := store.NewBackend()
	spyA := &renewSpy{Backend: ma, renews: make(chan string, lock.MaxConcurrentTicks)}
	a, err := lock.New(spyA, lock.WithClock(fc), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var leases []*lock.Lease
	for i := range lock.MaxConcurrentTicks {
		l, err := a.TryAcquire(ctx, fmt.Sprintf("a%d", i))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	// A's store stops answering A; A's renewals fall due and hang, one
	// per slot.
	ma.Disconnect()
	fc.Advance(ttl / 2)
	for range lock.MaxConcurrentTicks {
		<-spyA.renews
	}

	spyB := &renewSpy{Backend: store.NewBackend(), renews: make(chan string, 1)}
	b, err := lock.New(spyB, lock.WithClock(fc), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	lb, err := b.TryAcquire(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	// B's renewal falls due (ttl/3 after its acquire); A's leases are
	// still valid (their deadlines, ttl minus drift after theirs, would
	// cancel their renewals and free the slots).
	fc.Advance(ttl/3 + time.Second)
	select {
	case <-spyB.renews:
	case <-time.After(10 * time.Second):
		t.Error("B's renewal did not start while A's renewals held A's slots")
	}

	ma.Reconnect()
	for _, l := range append(leases, lb) {
		_ = l.Release(ctx)
	}
}

// armSpy is a fake clock that reports each callback armed for d.
type armSpy struct {
	*clock.Fake
	d     time.Duration
	armed chan struct{}
}

func (c *armSpy) AfterFunc(d time.Duration, f func()) clock.Timer {
	if d == c.d {
		c.armed <- struct{}{}
	}
	return c.Fake.AfterFunc(d, f)
}

// releaseSpy fails the first fail Releases with an error of unknown outcome
// and reports each call.
type releaseSpy struct {
	backend.Backend
	fail     int64
	n        atomic.Int64
	releases chan int64
}

func (s *releaseSpy) Release(ctx context.Context, key, token string) error {
	n := s.n.Add(1)
	s.releases <- n
	if n <= s.fail {
		return errors.New("connection reset (simulated)")
	}
	return s.Backend.Release(ctx, key, token)
}

// The pause before a cleanup release is sent again is taken on the
// Client's clock, not on a timer of the system's: with a fake clock, the
// release goes again when the test moves the clock, and not before.
func TestCleanupResendPausesOnTheClientsClock(t *testing.T) {
	ctx := context.Background()
	fc := &armSpy{Fake: clock.NewFake(time.Unix(1_000_000, 0)), d: 50 * time.Millisecond, armed: make(chan struct{}, 4)}
	spy := &releaseSpy{Backend: memory.New(memory.WithStoreClock(fc.Fake)), fail: 2, releases: make(chan int64, 8)}
	c, err := lock.New(spy, lock.WithClock(fc), lock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err == nil {
		t.Fatal("Release with an unknown outcome reported success")
	}
	<-spy.releases // Release's own
	<-spy.releases // the cleanup's first
	select {
	case <-fc.armed:
	case n := <-spy.releases:
		t.Fatalf("release %d sent after a pause that the fake clock did not see", n)
	case <-time.After(10 * time.Second):
		t.Fatal("the cleanup did not pause on the client's clock")
	}
	fc.Advance(50 * time.Millisecond)
	select {
	case <-spy.releases:
	case <-time.After(10 * time.Second):
		t.Fatal("the cleanup did not send the release again when the pause ended")
	}
}

// waitingStop is a backend whose loss watch has a stop function that waits
// for its watcher goroutine; the watcher reports the loss when stop is
// called (a watch ended by a release sees the key go), as a backend may.
type waitingStop struct {
	backend.Backend
	stopped chan struct{} // closed when a stop returned
}

func (w *waitingStop) NotifyLoss(key, token string, fence uint64, lost func(error)) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		<-quit
		lost(errors.New("the key is gone (simulated watch)"))
	}()
	return func() {
		close(quit)
		<-done
		close(w.stopped)
	}
}

// End hooks run after the lease's mutex is released: a backend's stop
// function that waits for its loss callback, which takes the mutex, does
// not deadlock the release. (They ran under the mutex: Release hung.)
func TestEndHooksRunOutsideTheLeaseMutex(t *testing.T) {
	ctx := context.Background()
	b := &waitingStop{Backend: memory.New(), stopped: make(chan struct{})}
	c, err := lock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- l.Release(ctx) }()
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("Release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Release hung: the backend's stop function ran under the lease's mutex, which its loss callback needs")
	}
	<-b.stopped
	if !errors.Is(l.Err(), lock.ErrReleased) {
		t.Errorf("Err after Release and a late loss report: %v; want ErrReleased", l.Err())
	}
}
