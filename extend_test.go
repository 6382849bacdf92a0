package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
)

// Extend to a longer TTL moves the deadline once the store confirmed it,
// and the store keeps the lock that long: another client cannot take the
// key after the old TTL. Extend to a shorter TTL moves the deadline
// earlier, and the lease is lost by it.
//
// (A sleep here waits out a TTL; nothing else.)
func TestExtend(t *testing.T) {
	store := memory.NewStore()
	c := mustClient(t, store.NewBackend(), lock.WithTTL(100*time.Millisecond), lock.WithAutoRenew(false))
	other := mustClient(t, store.NewBackend())
	ctx := context.Background()
	l := mustTry(t, c, "k")
	sent := time.Now()
	if err := l.Extend(ctx, 2*time.Second); err != nil {
		t.Fatalf("Extend to 2s: %v", err)
	}
	if l.TTL() != 2*time.Second || l.Deadline().Before(sent.Add(time.Second)) {
		t.Fatalf("after Extend to 2s: TTL %v, deadline %v after the send; want 2s and more than 1s", l.TTL(), l.Deadline().Sub(sent))
	}
	<-time.After(300 * time.Millisecond) // waiting out the old TTL
	if err := l.Err(); err != nil {
		t.Fatalf("lease after the old TTL: %v; want valid", err)
	}
	if _, err := other.TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("another client after the old TTL: %v; want ErrLocked (the store keeps the new TTL)", err)
	}
	sent = time.Now()
	if err := l.Renew(ctx); err != nil { // a shorter TTL counts from the latest confirmed renewal
		t.Fatal(err)
	}
	if err := l.Extend(ctx, 50*time.Millisecond); err != nil {
		t.Fatalf("Extend to 50ms: %v", err)
	}
	if d := l.Deadline().Sub(sent); d > 50*time.Millisecond {
		t.Fatalf("deadline after Extend to 50ms: %v after the send; want at most 50ms", d)
	}
	<-l.Done() // waiting out the new, shorter TTL
	if !errors.Is(l.Err(), lock.ErrLost) {
		t.Fatalf("Err after the shorter TTL: %v; want ErrLost", l.Err())
	}
	if err := l.Extend(ctx, time.Second); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Extend of a lost lease: %v; want ErrLost", err)
	}
}

// Bad TTLs are refused before anything is sent, and the lease is as it was.
func TestExtendBadInput(t *testing.T) {
	p := &probe{Backend: memory.New()}
	c := mustClient(t, p, lock.WithTTL(time.Second), lock.WithAutoRenew(false))
	ctx := context.Background()
	l := mustTry(t, c, "k")
	dl := l.Deadline()
	for _, ttl := range []time.Duration{0, -time.Second, time.Millisecond, lock.MaxTTL + 1, 2 * lock.DefaultMaxTTL} {
		if err := l.Extend(ctx, ttl); !errors.Is(err, lock.ErrInvalidTTL) {
			t.Errorf("Extend(%v): %v; want ErrInvalidTTL", ttl, err)
		}
	}
	if err := l.Extend(nil, time.Second); !errors.Is(err, lock.ErrInvalid) { //nolint:staticcheck // a nil context on purpose
		t.Errorf("Extend with a nil context: %v; want ErrInvalid", err)
	}
	if n := p.renews.Load(); n != 0 || l.TTL() != time.Second || !l.Deadline().Equal(dl) {
		t.Errorf("after the refused Extends: %d renewals sent, TTL %v, deadline moved %v; want none, 1s, unmoved", n, l.TTL(), l.Deadline().Sub(dl))
	}
	l.Release(ctx)
	if err := l.Extend(ctx, 2*time.Second); !errors.Is(err, lock.ErrReleased) {
		t.Errorf("Extend after Release: %v; want ErrReleased", err)
	}
}

// A renewal whose outcome is unknown may still reach the store, with the
// old, shorter TTL, after the Extend: the deadline keeps counting the old
// TTL, though the Extend succeeds and the lease asks for the new one.
func TestExtendAfterAnUnknownOutcomeKeepsTheBound(t *testing.T) {
	mc := memory.New()
	const ttl = 300 * time.Millisecond
	c := mustClient(t, mc, lock.WithTTL(ttl), lock.WithAutoRenew(false))
	ctx := context.Background()
	l := mustTry(t, c, "k")
	mc.HoldReplies()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	if err := l.Renew(rctx); err == nil || errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew with its reply held: %v; want an error of unknown outcome", err)
	}
	cancel()
	mc.DeliverReplies()
	sent := time.Now()
	if err := l.Extend(ctx, 10*time.Second); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if d := l.Deadline().Sub(sent); d > ttl {
		t.Errorf("deadline after Extend to 10s, with a renewal of unknown outcome before it: %v after the send; want at most the old TTL %v", d, ttl)
	}
	if l.TTL() != 10*time.Second {
		t.Errorf("TTL after Extend: %v; want 10s (what the lease asks for)", l.TTL())
	}
}

// fixed is a backend that declares that its locks keep their TTL.
type fixed struct{ *probe }

func (f fixed) Capabilities() backend.Capabilities {
	c := f.probe.Capabilities()
	c.FixedTTL = true
	return c
}

// On a backend whose locks keep their TTL (Capabilities.FixedTTL), Extend
// to another TTL is refused before anything is sent; to the same TTL it is
// a renewal.
func TestExtendFixedTTL(t *testing.T) {
	p := &probe{Backend: memory.New()}
	c := mustClient(t, fixed{p}, lock.WithTTL(time.Second), lock.WithAutoRenew(false))
	ctx := context.Background()
	l := mustTry(t, c, "k")
	if err := l.Extend(ctx, 2*time.Second); !errors.Is(err, lock.ErrInvalidTTL) {
		t.Errorf("Extend to another TTL on a FixedTTL backend: %v; want ErrInvalidTTL", err)
	}
	if n := p.renews.Load(); n != 0 {
		t.Errorf("the refused Extend sent %d renewals; want none", n)
	}
	if err := l.Extend(ctx, time.Second); err != nil || p.renews.Load() != 1 {
		t.Errorf("Extend to the same TTL: %v, %d renewals; want nil and one", err, p.renews.Load())
	}
	l.Release(ctx)
}

// Automatic renewals after an Extend ask for the new TTL and keep the lease
// past it.
func TestExtendThenAutoRenew(t *testing.T) {
	store := memory.NewStore()
	c := mustClient(t, store.NewBackend(), lock.WithTTL(100*time.Millisecond))
	ctx := context.Background()
	l := mustTry(t, c, "k")
	defer l.Release(ctx)
	if err := l.Extend(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	<-time.After(time.Second) // waiting out three of the new TTLs
	if err := l.Err(); err != nil || l.TTL() != 300*time.Millisecond {
		t.Fatalf("lease a second after Extend to 300ms with auto-renew: %v, TTL %v; want valid, 300ms", err, l.TTL())
	}
}
