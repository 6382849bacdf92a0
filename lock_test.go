package lock_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
	"github.com/distlock/lock/memory"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// probe wraps a backend: it counts calls, can fail renewals, and can move a
// fake clock while a request is in flight (network latency).
type probe struct {
	backend.Backend
	acquires, renews, releases atomic.Int64
	failRenews                 atomic.Int64 // fail this many renewals
	latency                    time.Duration
	clock                      *clock.Fake
}

func (p *probe) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	p.acquires.Add(1)
	if p.latency > 0 {
		p.clock.Advance(p.latency)
	}
	return p.Backend.Acquire(ctx, key, token, ttl)
}

func (p *probe) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	defer p.renews.Add(1)
	if p.failRenews.Add(-1) >= 0 {
		return backend.Grant{}, errors.New("probe: connection reset")
	}
	return p.Backend.Renew(ctx, key, token, ttl)
}

func (p *probe) Release(ctx context.Context, key, token string) error {
	p.releases.Add(1)
	return p.Backend.Release(ctx, key, token)
}

func (p *probe) Capabilities() backend.Capabilities {
	return p.Backend.(backend.Describer).Capabilities()
}

// notifyingProbe is a probe that passes the memory backend's wake-ups on.
type notifyingProbe struct{ *probe }

func (p notifyingProbe) Watch(ctx context.Context, key string) (backend.Watch, error) {
	return p.Backend.(backend.Notifier).Watch(ctx, key)
}

type fixture struct {
	clock *clock.Fake
	store *memory.Store
	probe *probe
	locks *lock.Client
}

// newFixture builds a client over a probed memory backend, all on one fake
// clock.
func newFixture(t *testing.T, opts ...lock.Option) *fixture {
	t.Helper()
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	store := memory.NewStore(memory.WithStoreClock(fc))
	p := &probe{Backend: store.NewBackend(), clock: fc}
	p.failRenews.Store(0)
	c, err := lock.New(p, append([]lock.Option{lock.WithClock(fc)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &fixture{clock: fc, store: store, probe: p, locks: c}
}

// until waits, in real time, for cond: the fake clock's callbacks run in
// their own goroutines.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func TestDeadlineIsMeasuredFromSendTime(t *testing.T) {
	f := newFixture(t, lock.WithAutoRenew(false))
	f.probe.latency = 30 * time.Millisecond
	sent := f.clock.Now()
	l, err := f.locks.TryAcquire(context.Background(), "k", lock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want := sent.Add(time.Second - lock.DefaultDrift(time.Second))
	if got := l.Deadline(); !got.Equal(want) {
		t.Fatalf("deadline %v after send; want %v (send + TTL - drift, not receive + TTL)", got.Sub(sent), want.Sub(sent))
	}
	if d := lock.DefaultDrift(time.Second); d != 12*time.Millisecond {
		t.Errorf("default drift for 1s is %v; want TTL*0.01+2ms = 12ms", d)
	}
}

func TestLostExactlyAtDeadline(t *testing.T) {
	f := newFixture(t, lock.WithAutoRenew(false), lock.WithDrift(10*time.Millisecond))
	l, err := f.locks.TryAcquire(context.Background(), "k", lock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(990*time.Millisecond - time.Nanosecond)
	if err := l.Err(); err != nil {
		t.Fatalf("lost 1ns before the deadline: %v", err)
	}
	select {
	case <-l.Done():
		t.Fatal("Done closed before the deadline")
	default:
	}
	f.clock.Advance(time.Nanosecond)
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed at the deadline")
	}
	if err := l.Err(); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Err at the deadline: %v; want ErrLost", err)
	}
	// The store still holds it for 10ms more (the drift): nobody else can
	// have it yet, and the holder already knows it lost it.
	if h, _ := f.store.NewBackend().Inspect(context.Background(), "k"); !h.Held {
		t.Error("store freed the key before TTL")
	}
}

// renewCycle advances the fake clock to the next automatic renewal and waits
// until it completed.
func renewCycle(t *testing.T, f *fixture, l *lock.Lease, ttl time.Duration) {
	t.Helper()
	before := f.probe.renews.Load()
	f.clock.AdvanceWait(ttl / 3)
	if f.probe.renews.Load() == before {
		t.Fatalf("no renewal after %v", ttl/3)
	}
}

func TestAutoRenewKeepsTheLease(t *testing.T) {
	const ttl = 300 * time.Millisecond
	f := newFixture(t)
	l, err := f.locks.TryAcquire(context.Background(), "k", lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 30; i++ { // ten TTLs
		renewCycle(t, f, l, ttl)
		if err := l.Err(); err != nil {
			t.Fatalf("renewal %d: lease lost: %v", i, err)
		}
	}
	h, err := f.store.NewBackend().Inspect(context.Background(), "k")
	if err != nil || !h.Held || h.Token != l.Token() {
		t.Fatalf("store holder %+v, %v; want the lease's token", h, err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.Err(); !errors.Is(err, lock.ErrReleased) {
		t.Errorf("Err after Release: %v; want ErrReleased", err)
	}
}

func TestAutoRenewRetriesTransientErrors(t *testing.T) {
	const ttl = 300 * time.Millisecond
	f := newFixture(t)
	l, err := f.locks.TryAcquire(context.Background(), "k", lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	f.probe.failRenews.Store(2)
	renewCycle(t, f, l, ttl) // fails
	for f.probe.renews.Load() < 3 && l.Err() == nil {
		f.clock.AdvanceWait(5 * time.Millisecond)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("lease lost although a retry succeeded in time: %v", err)
	}
	if !l.Deadline().After(f.clock.Now().Add(ttl / 2)) {
		t.Errorf("deadline not moved by the successful retry")
	}
}

func TestAutoRenewNeverReacquires(t *testing.T) {
	const ttl = 300 * time.Millisecond
	f := newFixture(t)
	ctx := context.Background()
	l, err := f.locks.TryAcquire(ctx, "k", lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	// An operator deletes the lock behind the holder's back.
	if err := f.store.NewBackend().Release(ctx, "k", l.Token()); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(ttl / 3)
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease not lost after the store refused the renewal")
	}
	if err := l.Err(); !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Err: %v; want ErrLost wrapping ErrNotHeld", err)
	}
	renews := f.probe.renews.Load()
	f.clock.Advance(10 * ttl)
	if err := l.Renew(ctx); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Renew after loss: %v; want ErrLost", err)
	}
	if n := f.probe.renews.Load(); n != renews {
		t.Errorf("%d renewals sent after the loss; want none", n-renews)
	}
	if h, _ := f.store.NewBackend().Inspect(ctx, "k"); h.Held {
		t.Errorf("the key was re-acquired: %+v", h)
	}
}

func TestMaxHoldCapsTheWatchdog(t *testing.T) {
	const ttl = 300 * time.Millisecond
	const maxHold = time.Second
	f := newFixture(t, lock.WithMaxHold(maxHold))
	start := f.clock.Now()
	l, err := f.locks.TryAcquire(context.Background(), "k", lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	for l.Err() == nil {
		if f.clock.Now().Sub(start) > 2*maxHold {
			t.Fatalf("lease still valid %v after acquisition; max hold %v", f.clock.Now().Sub(start), maxHold)
		}
		f.clock.AdvanceWait(ttl / 3)
	}
	if !errors.Is(l.Err(), lock.ErrLost) || !strings.Contains(l.Err().Error(), "maximum hold") {
		t.Fatalf("Err: %v; want ErrLost for the maximum hold time", l.Err())
	}
	if d := l.Deadline().Sub(start); d > maxHold {
		t.Errorf("last deadline %v after acquisition; want within the max hold %v", d, maxHold)
	}
}

func TestDoCancelsOnLossAndReportsIt(t *testing.T) {
	mc := memory.New()
	c, err := lock.New(mc, lock.WithTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var cause error
	err = c.Do(context.Background(), "job", func(ctx context.Context, l *lock.Lease) error {
		mc.Disconnect() // renewals now vanish
		defer mc.Reconnect()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			return errors.New("context not cancelled after the lease was lost")
		}
		cause = context.Cause(ctx)
		return ctx.Err()
	})
	if !errors.Is(cause, lock.ErrLost) {
		t.Errorf("context cause: %v; want ErrLost", cause)
	}
	if !errors.Is(err, lock.ErrLost) || !errors.Is(err, context.Canceled) {
		t.Errorf("Do: %v; want fn's error joined with ErrLost", err)
	}
}

func TestDoReleasesAndReturnsFnError(t *testing.T) {
	store := memory.NewStore()
	c, err := lock.New(store.NewBackend())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	boom := errors.New("boom")
	var fence uint64
	err = c.Do(context.Background(), "job", func(ctx context.Context, l *lock.Lease) error {
		fence = l.Fence()
		return boom
	})
	if !errors.Is(err, boom) || errors.Is(err, lock.ErrLost) {
		t.Errorf("Do: %v; want fn's error only", err)
	}
	if fence == 0 {
		t.Error("fence 0 inside Do")
	}
	if n := store.Len(); n != 0 {
		t.Errorf("%d locks held after Do; want 0", n)
	}
}

func TestAcquireWithoutNotifierWaitsAtMostTheRemainingTTL(t *testing.T) {
	const ttl = 200 * time.Millisecond
	store := memory.NewStore()
	holder, err := lock.New(store.NewBackend(), lock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	// The probe hides the memory backend's wake-ups: the waiter must back
	// off, and never sleep past the holder's expiry.
	p := &probe{Backend: store.NewBackend()}
	waiter, err := lock.New(p, lock.WithBackoff(time.Second, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	ctx := context.Background()
	if _, err := holder.TryAcquire(ctx, "k", lock.WithTTL(ttl)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	l, err := waiter.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if d := time.Since(start); d > ttl+500*time.Millisecond {
		t.Errorf("waiter took %v with a 1s minimum backoff; the holder's TTL was %v", d, ttl)
	}
	if n := p.acquires.Load(); n > 5 {
		t.Errorf("%d attempts; want a few (sleep until the holder's expiry, not poll)", n)
	}
}

func TestAcquireWakesOnReleaseWithoutPolling(t *testing.T) {
	store := memory.NewStore()
	holder, err := lock.New(store.NewBackend())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	p := notifyingProbe{&probe{Backend: store.NewBackend()}}
	waiter, err := lock.New(p)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	ctx := context.Background()
	hl, err := holder.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "k")
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	until(t, "the waiter to watch the key", func() bool { return store.Watchers() == 1 })
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken by the release")
	}
	// One try, one re-check after the watch began, one after the wake-up.
	if n := p.acquires.Load(); n > 3 {
		t.Errorf("%d acquire attempts for one wait; want at most 3", n)
	}
	if n := store.Watchers(); n != 0 {
		t.Errorf("%d watches left open", n)
	}
}

func TestTokensAreRandom128Bits(t *testing.T) {
	c, err := lock.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		l, err := c.TryAcquire(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		tok := l.Token()
		if raw, err := hex.DecodeString(tok); err != nil || len(raw) != 16 {
			t.Fatalf("token %q is not 128 bits of hex", tok)
		}
		if seen[tok] {
			t.Fatalf("token %q repeated", tok)
		}
		seen[tok] = true
		l.Release(context.Background())
	}
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	a, err := lock.Open(ctx, "mem://shared-test?ttl=2s&autorenew=false")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := lock.Open(ctx, "mem://shared-test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if l.TTL() != 2*time.Second {
		t.Errorf("TTL %v; want 2s from the URL", l.TTL())
	}
	if _, err := b.TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
		t.Errorf("second client of the named store: %v; want ErrLocked", err)
	}
	private, err := lock.Open(ctx, "mem://")
	if err != nil {
		t.Fatal(err)
	}
	defer private.Close()
	if l2, err := private.TryAcquire(ctx, "k"); err != nil {
		t.Errorf("a private store shares nothing: %v", err)
	} else {
		l2.Release(ctx)
	}
	l.Release(ctx)

	bad := []struct {
		url, want string
		is        error
	}{
		{"nosuch://x", "registered: mem", lock.ErrUnknownScheme},
		{"mem://x?color=red", "valid: autorenew, drift, maxhold, maxttl, ttl", lock.ErrInvalidOption},
		{"mem://x?ttl=soon", "want a Go duration", lock.ErrInvalidOption},
		{"mem://x?ttl=-1s", "must be > 0", lock.ErrInvalidTTL},
		{"mem://x?autorenew=maybe", "want true or false", lock.ErrInvalidOption},
		{"mem://x?ttl=1s&ttl=2s", "give it once", lock.ErrInvalidOption},
		{"://", "missing protocol scheme", lock.ErrInvalid},
	}
	for _, tc := range bad {
		c, err := lock.Open(ctx, tc.url)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", tc.url)
			continue
		}
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "lock: ") {
			t.Errorf("Open(%q): %q; want %v mentioning %q", tc.url, err, tc.is, tc.want)
		}
	}
}

func TestCloseIsIdempotentAndStopsTheClient(t *testing.T) {
	c, err := lock.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.TryAcquire(context.Background(), "k"); !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("TryAcquire after Close: %v; want ErrClosed", err)
	}
}

func TestConcurrentLeaseMethods(t *testing.T) {
	c, err := lock.New(memory.New(), lock.WithTTL(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Go(func() {
			for l.Err() == nil {
				l.Renew(ctx)
				_ = l.Deadline()
			}
			<-l.Done()
		})
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// shortRenew renews every lock for half the TTL asked for, and says so in
// its grant. The time of its first Renew call goes to called (buffered
// one): a time after package lock read the renewal's send time.
type shortRenew struct {
	backend.Backend
	called chan time.Time
}

func (s shortRenew) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	select {
	case s.called <- time.Now():
	default:
	}
	return s.Backend.Renew(ctx, key, token, ttl/2)
}

// A renewal the store grants for less than asked shortens the lease's TTL
// and deadline, and TTL reads it safely while the renewal runs.
func TestRenewalGrantedShorterShortensTheTTL(t *testing.T) {
	const ttl = 2 * time.Second
	called := make(chan time.Time, 1)
	c, err := lock.New(shortRenew{memory.New(), called}, lock.WithTTL(ttl), lock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	// Another goroutine reads the TTL until it sees the renewal's.
	started := make(chan struct{})
	stop := make(chan struct{})
	seen := make(chan time.Duration, 1)
	go func() {
		first := l.TTL()
		close(started)
		for {
			if d := l.TTL(); d != first {
				seen <- d
				return
			}
			select {
			case <-stop:
				seen <- first
				return
			default:
			}
		}
	}()
	<-started
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	// The renewal was sent no later than the backend's Renew was called:
	// the deadline counts from the send, so it is at most the granted
	// TTL after the call (a bound that scheduling delays cannot break).
	sent := <-called
	select {
	case d := <-seen:
		if d != ttl/2 {
			t.Errorf("another goroutine read the TTL %v after the renewal; want %v", d, ttl/2)
		}
	case <-time.After(5 * time.Second):
		close(stop)
		t.Errorf("another goroutine still read the TTL %v after the renewal; want %v", <-seen, ttl/2)
	}
	if got := l.TTL(); got != ttl/2 {
		t.Errorf("TTL %v after a renewal granted for %v; want %v", got, ttl/2, ttl/2)
	}
	if dl := l.Deadline(); dl.After(sent.Add(ttl / 2)) {
		t.Errorf("deadline %v after the backend's Renew was called; want at most the %v it was granted for", dl.Sub(sent), ttl/2)
	}
}

// grantThenFail grants the lock on the store but reports a timeout, as when a
// reply is lost on the way back: the outcome is unknown to the client.
type grantThenFail struct{ backend.Backend }

func (g grantThenFail) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if _, err := g.Backend.Acquire(ctx, key, token, ttl); err != nil {
		return backend.Grant{}, err
	}
	return backend.Grant{}, context.DeadlineExceeded
}

func TestAcquireWithUnknownOutcomeLeavesNothingBehind(t *testing.T) {
	store := memory.NewStore()
	c, err := lock.New(grantThenFail{store.NewBackend()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(context.Background(), "k")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v; want the backend's context error", err)
	}
	c.Close() // waits for the background release
	if n := store.Len(); n != 0 {
		t.Fatalf("%d locks left on the store after an acquire with unknown outcome", n)
	}
}

// firstReleaseLost loses the first release on the way to the store, as a
// connection broken by a fault does: the store never sees it, and the
// client gets an error that leaves the outcome unknown.
type firstReleaseLost struct {
	backend.Backend
	lost atomic.Bool
}

func (f *firstReleaseLost) Release(ctx context.Context, key, token string) error {
	if f.lost.CompareAndSwap(false, true) {
		return errors.New("write: connection reset by peer")
	}
	return f.Backend.Release(ctx, key, token)
}

// A cleanup release whose outcome is unknown is sent again: sent once, it
// left the lock held for a whole TTL after a fault that broke the
// connection (the conformance case HandoverFails caught it over netstore).
func TestCleanupSendsAnUnknownReleaseAgain(t *testing.T) {
	store := memory.NewStore()
	f := &firstReleaseLost{Backend: store.NewBackend()}
	c, err := lock.New(grantThenFail{f})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(context.Background(), "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v; want the backend's context error", err)
	}
	c.Close() // waits for the background release
	if !f.lost.Load() {
		t.Fatal("no cleanup release was sent")
	}
	if n := store.Len(); n != 0 {
		t.Fatalf("%d locks left on the store after a cleanup release was lost once", n)
	}
}

// A release whose outcome is unknown (the store never saw it here) is sent
// again in the background: the caller gets the error, and the key is not
// left held for the rest of its TTL.
func TestReleaseOfUnknownOutcomeIsSentAgain(t *testing.T) {
	store := memory.NewStore()
	f := &firstReleaseLost{Backend: store.NewBackend()}
	c, err := lock.New(f)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err == nil || errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release: %v; want the lost request's error", err)
	}
	c.Close() // waits for the background release
	if n := store.Len(); n != 0 {
		t.Fatalf("%d locks left on the store after a release of unknown outcome", n)
	}
}

// unknownThenSlowRelease is a remote-like store whose first acquire takes
// the lock and reports a timeout (unknown outcome), and whose releases wait
// for proceed.
type unknownThenSlowRelease struct {
	remoteLike
	failed   atomic.Bool
	releases chan struct{} // a release began
	proceed  chan struct{} // closed: releases go on
}

func (u *unknownThenSlowRelease) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := u.remoteLike.Acquire(ctx, key, token, ttl)
	if err == nil && u.failed.CompareAndSwap(false, true) {
		return backend.Grant{}, context.DeadlineExceeded
	}
	return g, err
}

func (u *unknownThenSlowRelease) Release(ctx context.Context, key, token string) error {
	u.releases <- struct{}{}
	<-u.proceed
	return u.remoteLike.Release(ctx, key, token)
}

// An acquire of unknown outcome keeps this client's turn for the key until
// its cleanup release has ended: the next goroutine does not ask the store
// meanwhile (it could not get the lock before the release anyway), so that
// acquires cancelled again and again on a slow store cannot pile up requests
// and releases until releases time out and leave locks behind.
func TestUnknownOutcomeHoldsTheTurnUntilTheCleanupEnds(t *testing.T) {
	u := &unknownThenSlowRelease{
		remoteLike: remoteLike{&probe{Backend: memory.New()}},
		releases:   make(chan struct{}, 4),
		proceed:    make(chan struct{}),
	}
	c, err := lock.New(u)
	if err != nil {
		t.Fatal(err)
	}
	var proceed sync.Once
	let := func() { proceed.Do(func() { close(u.proceed) }) }
	defer c.Close()
	defer let() // before Close, which waits for the cleanup
	ctx := context.Background()
	if _, err := c.Acquire(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v; want the backend's context error", err)
	}
	<-u.releases // the cleanup runs, and waits
	got := make(chan error, 1)
	go func() {
		l, err := c.Acquire(ctx, "k")
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	until(t, "the second Acquire to wait for the key's turn", func() bool { return c.Waiting("k") == 1 || u.probe.acquires.Load() > 1 })
	if n := u.probe.acquires.Load(); n != 1 {
		t.Fatalf("%d acquire requests while the cleanup was out; want 1 (the first)", n)
	}
	let()
	if err := <-got; err != nil {
		t.Fatalf("the Acquire after the cleanup: %v", err)
	}
}

// slowRenew blocks every renewal until release is closed.
type slowRenew struct {
	backend.Backend
	started chan struct{}
	release chan struct{}
}

func (s *slowRenew) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	s.started <- struct{}{}
	<-s.release
	return s.Backend.Renew(ctx, key, token, ttl)
}

func (s *slowRenew) Capabilities() backend.Capabilities {
	return s.Backend.(backend.Describer).Capabilities()
}

func TestRenewCompletingAfterTheDeadlineDoesNotRevive(t *testing.T) {
	const ttl = 300 * time.Millisecond
	fc := clock.NewFake(time.Unix(0, 0))
	store := memory.NewStore(memory.WithStoreClock(fc))
	sb := &slowRenew{Backend: store.NewBackend(), started: make(chan struct{}, 1), release: make(chan struct{})}
	c, err := lock.New(sb, lock.WithClock(fc), lock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "k", lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	result := make(chan error, 1)
	go func() { result <- l.Renew(ctx) }()
	<-sb.started
	// Past the client's deadline, not yet past the store's expiry, while the
	// renewal is in flight: the store will accept it.
	fc.AdvanceWait(ttl - time.Millisecond)
	if err := l.Err(); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Err past the deadline: %v; want ErrLost", err)
	}
	close(sb.release)
	if err := <-result; !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew that completed after the deadline: %v; want ErrLost", err)
	}
	if err := l.Err(); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("the lease came back to life: Err %v", err)
	}
	c.Close() // waits for the release of the lock the late renewal extended
	if n := store.Len(); n != 0 {
		t.Errorf("the late renewal left the key locked on the store")
	}
}

// minOneSecond is a backend that declares a 1s minimum TTL.
type minOneSecond struct{ backend.Backend }

func (minOneSecond) Capabilities() backend.Capabilities {
	return backend.Capabilities{MinTTL: time.Second}
}

func TestTTLBelowTheBackendMinimum(t *testing.T) {
	store := memory.NewStore()
	if _, err := lock.New(minOneSecond{store.NewBackend()}, lock.WithTTL(500*time.Millisecond)); !errors.Is(err, lock.ErrInvalidTTL) {
		t.Fatalf("New with a TTL below the minimum: %v; want ErrInvalidTTL", err)
	}
	c, err := lock.New(minOneSecond{store.NewBackend()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.TryAcquire(context.Background(), "k", lock.WithTTL(500*time.Millisecond))
	if !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "minimum of 1s") {
		t.Fatalf("TryAcquire with a TTL below the minimum: %v; want ErrInvalidTTL naming the 1s minimum", err)
	}
	if n := store.Len(); n != 0 {
		t.Fatalf("bad input changed the store: %d locks", n)
	}
}

func TestDoReleasesWhenFnPanics(t *testing.T) {
	store := memory.NewStore()
	c, err := lock.New(store.NewBackend())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not propagate")
			}
		}()
		c.Do(context.Background(), "k", func(context.Context, *lock.Lease) error { panic("boom") })
	}()
	if n := store.Len(); n != 0 {
		t.Fatalf("%d locks held after fn panicked", n)
	}
}

// remoteLike presents the memory backend as a remote store (InProcess false),
// so that package lock queues a client's goroutines for a key.
type remoteLike struct{ *probe }

func (r remoteLike) Capabilities() backend.Capabilities {
	caps := r.probe.Capabilities()
	caps.InProcess = false
	return caps
}

func (r remoteLike) Watch(ctx context.Context, key string) (backend.Watch, error) {
	return r.Backend.(backend.Notifier).Watch(ctx, key)
}

func TestGoroutinesOfOneClientQueueLocally(t *testing.T) {
	const goroutines, rounds = 8, 25
	p := remoteLike{&probe{Backend: memory.New()}}
	c, err := lock.New(p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	var active, overlaps atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < goroutines; i++ {
		wg.Go(func() {
			for r := 0; r < rounds; r++ {
				l, err := c.Acquire(ctx, "k")
				if err != nil {
					t.Error(err)
					return
				}
				if active.Add(1) > 1 {
					overlaps.Add(1)
				}
				runtime.Gosched()
				active.Add(-1)
				if err := l.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d overlapping sections", n)
	}
	// One request per acquisition: queued goroutines never ask the store
	// while another of the same client holds the key.
	if n := p.acquires.Load(); n != goroutines*rounds {
		t.Errorf("%d acquire requests for %d acquisitions; want one each", n, goroutines*rounds)
	}

	l, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	before := p.acquires.Load()
	if _, err := c.TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
		t.Errorf("TryAcquire while another goroutine holds the key: %v; want ErrLocked", err)
	}
	if p.acquires.Load() != before {
		t.Error("TryAcquire asked the store although this client holds the key")
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(wctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire behind a local holder: %v; want the context's error", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("TryAcquire after the release: %v (a waiter that gave up left the key's turn taken?)", err)
	}
	l2.Release(ctx)
}

// An Acquire whose context ends while the key is held says both: that it
// gave up (the context's error) and that the key was held (ErrLocked), so a
// caller can tell "held by someone else" from "the store did not answer".
func TestAcquireGivingUpOnAHeldKeyWrapsErrLocked(t *testing.T) {
	ctx := context.Background()
	store := memory.NewStore()
	a, err := lock.New(store.NewBackend())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := lock.New(store.NewBackend())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = b.Acquire(wctx, "k")
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("Acquire that timed out on a held key: %v; want DeadlineExceeded and ErrLocked", err)
	}
	// Goroutines of one client wait in the client's queue: the same.
	wctx2, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if _, err := a.Acquire(wctx2, "k"); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("Acquire that timed out behind a goroutine of the same client: %v; want DeadlineExceeded and ErrLocked", err)
	}
}

func TestCheckKey(t *testing.T) {
	for _, k := range []string{"", strings.Repeat("k", lock.MaxKeyLen+1), "\xff"} {
		if err := lock.CheckKey(k); !errors.Is(err, lock.ErrInvalidKey) || !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("CheckKey(%.20q): %v; want ErrInvalidKey", k, err)
		}
	}
	for _, k := range []string{"k", strings.Repeat("k", lock.MaxKeyLen), "ключ/\x00"} {
		if err := lock.CheckKey(k); err != nil {
			t.Errorf("CheckKey(%.20q): %v; want nil", k, err)
		}
	}
}

// A backend's error that carries the package's prefix is not prefixed twice.
func TestOpenErrorSaysItsPrefixOnce(t *testing.T) {
	lock.Register("failing-open-test", nil, func(context.Context, *url.URL) (backend.Backend, error) {
		return nil, fmt.Errorf("%w: port out of range", backend.ErrInvalid)
	})
	_, err := lock.Open(context.Background(), "failing-open-test://h:99999")
	if !errors.Is(err, lock.ErrInvalid) {
		t.Fatalf("Open: %v; want ErrInvalid", err)
	}
	if n := strings.Count(err.Error(), "lock: "); n != 1 {
		t.Errorf("Open: %q says %q %d times; want once", err, "lock: ", n)
	}
}

// queuing is a backend.Queuer over a memory backend whose handovers the
// test makes by hand: an extra for package lock's side of the handover (the
// etcd package proves it against a real store).
type queuing struct {
	remoteLike
	mu       sync.Mutex
	place    *fakePlace
	released []string
}

func (q *queuing) Release(ctx context.Context, key, token string) error {
	q.mu.Lock()
	q.released = append(q.released, token)
	q.mu.Unlock()
	return q.remoteLike.Release(ctx, key, token)
}

func (q *queuing) Queue(key string) (backend.Queue, error) {
	p := &fakePlace{q: q, key: key, ch: make(chan struct{}, 1)}
	q.mu.Lock()
	q.place = p
	q.mu.Unlock()
	return p, nil
}

type fakePlace struct {
	q      *queuing
	key    string
	ch     chan struct{}
	mu     sync.Mutex
	tokens []string
	handed *backend.Handover
	closed bool
}

func (p *fakePlace) C() <-chan struct{} { return p.ch }

func (p *fakePlace) Close(bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

func (p *fakePlace) Acquire(ctx context.Context, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := p.q.remoteLike.Acquire(ctx, p.key, token, ttl)
	if errors.Is(err, backend.ErrLocked) {
		p.mu.Lock()
		p.tokens = append(p.tokens, token)
		p.mu.Unlock()
	}
	return g, err
}

func (p *fakePlace) Handed() (backend.Handover, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.handed == nil {
		return backend.Handover{}, false
	}
	h := *p.handed
	p.handed = nil
	return h, true
}

// hand hands the lock to token and wakes the waiter.
func (p *fakePlace) hand(token string, fence uint64, since time.Time) {
	p.mu.Lock()
	p.handed = &backend.Handover{Token: token, Grant: backend.Grant{Fence: fence}, Since: since}
	p.mu.Unlock()
	select {
	case p.ch <- struct{}{}:
	default:
	}
}

// queuingOnHeldKey returns a client with opts over a queuing backend, and
// the backend, whose store has the key "k" held by another client; both
// clients are closed at the end of the test.
func queuingOnHeldKey(t *testing.T, opts ...lock.Option) (*lock.Client, *queuing) {
	t.Helper()
	store := memory.New()
	q := &queuing{remoteLike: remoteLike{&probe{Backend: store}}}
	c, err := lock.New(q, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	holder, err := lock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	if _, err := holder.Acquire(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	return c, q
}

// queuedPlace waits for the place of a waiter whose first attempt the
// store queued, and returns it.
func (q *queuing) queuedPlace(t *testing.T) *fakePlace {
	t.Helper()
	var p *fakePlace
	until(t, "the waiter queued", func() bool {
		q.mu.Lock()
		p = q.place
		q.mu.Unlock()
		return p != nil && len(p.queued()) == 1
	})
	return p
}

// queued returns the tokens the place queued so far.
func (p *fakePlace) queued() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.tokens...)
}

// Package lock takes a lock the store handed to its waiter only for a token
// of its own that the store queued, counts its deadline from the send time
// the store reports, and leaves a lock handed with no validity left to its
// next attempt.
func TestHandedLocks(t *testing.T) {
	c, q := queuingOnHeldKey(t, lock.WithTTL(2*time.Second), lock.WithAutoRenew(false))
	ctx := context.Background()
	type result struct {
		l   *lock.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := c.Acquire(ctx, "k")
		got <- result{l, err}
	}()
	p := q.queuedPlace(t)
	// A token that is not the waiter's: ignored; the waiter tries again.
	p.hand("0123456789abcdef0123456789abcdef", 7, time.Now())
	until(t, "the waiter's next attempt", func() bool { return len(p.queued()) == 2 })
	// Its own token, with no validity left: not taken; the waiter's next
	// attempt (which would take it over, on a real store) goes out.
	stale := p.queued()[1]
	p.hand(stale, 8, time.Now().Add(-3*time.Second))
	until(t, "the waiter's attempt after the stale handover", func() bool { return len(p.queued()) == 3 })
	q.mu.Lock()
	if slices.Contains(q.released, stale) {
		t.Error("the stale handover was released: the place goes on with its lease, and a release could take it down")
	}
	q.mu.Unlock()
	// The waiter kept the client's turn for the key: another goroutine of
	// the client waits for it in the process, and asks the store nothing.
	octx, ocancel := context.WithCancel(ctx)
	other := make(chan error, 1)
	go func() {
		_, err := c.Acquire(octx, "k")
		other <- err
	}()
	until(t, "the other goroutine to wait", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return c.Waiting("k") == 1 || q.place != p
	})
	q.mu.Lock()
	if q.place != p {
		t.Error("another goroutine of the client queued on the store: the stale handover gave the client's turn away")
	}
	q.mu.Unlock()
	ocancel()
	if err := <-other; !errors.Is(err, context.Canceled) {
		t.Fatalf("the other goroutine's Acquire: %v; want context.Canceled", err)
	}
	select {
	case r := <-got:
		t.Fatalf("Acquire returned %v, %v on a handover with no validity left", r.l, r.err)
	default:
	}
	// Its own token, handed 500ms after the send time the store reports.
	tok := p.queued()[2]
	since := time.Now().Add(-500 * time.Millisecond)
	p.hand(tok, 9, since)
	r := <-got
	if r.err != nil {
		t.Fatalf("Acquire: %v", r.err)
	}
	if r.l.Token() != tok || r.l.Fence() != 9 {
		t.Fatalf("lease of token %s, fence %d; want %s, 9", r.l.Token(), r.l.Fence(), tok)
	}
	if dl := r.l.Deadline(); dl.After(since.Add(2*time.Second)) || dl.Before(since.Add(time.Second)) {
		t.Fatalf("deadline %v after the reported send; want at most the 2s TTL (less the drift)", dl.Sub(since))
	}
}
