package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// The cases of this file check package lock's own promises, which every
// backend inherits: deadlines counted from the send with the drift taken
// off, renewals of unknown outcome that move nothing, owner tokens, and
// several leases of one client each lost at its own deadline.

// deadlineFromSend: with the store's replies held back, a lease's deadline
// is at most the send time of its acquire (or renew) plus its TTL minus the
// drift allowance, measured here before the call; and a renewal whose
// reply comes after the caller gave up does not move the deadline.
func (s *suite) deadlineFromSend(t *testing.T) {
	rh := s.replyHolder(t)
	ctx := s.ctx(t)
	key := s.key(t)
	bb := s.backend(t)
	// The client's default TTL is longer than the lease's: a renewal must
	// count with the lease's.
	c := s.clientOver(t, bb, lock.WithTTL(s.long), lock.WithAutoRenew(false))
	s.warmUp(ctx, t, c)
	ttl := max(5*s.short, 2*time.Second)
	const late = 100 * time.Millisecond
	// The library reads its clock a moment after sent is taken: allow for
	// it, well below the drift allowance (22ms for 2s) and the delay.
	const tolerance = 10 * time.Millisecond
	slowly := func(f func() error) (time.Time, error) {
		t.Helper()
		replies(ctx, t, rh, bb).hold()
		sentc := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			sentc <- time.Now()
			errc <- f()
		}()
		time.Sleep(late) // the delay under test: the reply comes this late
		replies(ctx, t, rh, bb).deliver()
		return <-sentc, <-errc
	}
	latest := func(sent time.Time) time.Time { return sent.Add(ttl - promisedDrift(ttl)) }

	var l *lock.Lease
	sent, err := slowly(func() (err error) {
		l, err = c.TryAcquire(ctx, key, lock.WithTTL(ttl))
		return err
	})
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if over := l.Deadline().Sub(latest(sent)); over > tolerance {
		t.Errorf("after an acquire whose reply came %v late, the deadline is %v later than send + TTL - drift", late, over.Round(time.Millisecond))
	}
	sent, err = slowly(func() error { return l.Renew(ctx) })
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if over := l.Deadline().Sub(latest(sent)); over > tolerance {
		t.Errorf("after a renewal whose reply came %v late, the deadline is %v later than send + the lease's TTL - drift", late, over.Round(time.Millisecond))
	}

	// A renewal whose caller gives up before the reply: unknown outcome.
	before := l.Deadline()
	replies(ctx, t, rh, bb).hold()
	rctx, cancel := context.WithTimeout(ctx, late)
	err = l.Renew(rctx)
	cancel()
	replies(ctx, t, rh, bb).deliver()
	if err == nil {
		t.Errorf("Renew returned nil while its reply was held past its context")
	}
	if after := l.Deadline(); after.After(before) {
		t.Errorf("a renewal of unknown outcome moved the deadline by %v", after.Sub(before))
	}
	if err := l.Release(ctx); err != nil && !errors.Is(err, lock.ErrLost) {
		t.Errorf("Release: %v", err)
	}
}

// tokenShape: owner tokens are 32 lower-case hex digits (128 bits), all
// different; on a backend.TokenPrefixer, the backend's prefix of at most
// backend.MaxTokenPrefix bytes and hex digits after it.
func (s *suite) tokenShape(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	b := s.backend(t)
	_, prefixes := unguarded(b).(backend.TokenPrefixer)
	c := s.clientOver(t, b, lock.WithTTL(s.long))
	seen := map[string]bool{}
	for range 200 {
		l, err := c.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		tok := l.Token()
		if len(tok) != 32 || !isLowerHex(tok[backend.MaxTokenPrefix:]) || !prefixes && !isLowerHex(tok) {
			t.Fatalf("token %q: want 32 lower-case hex digits (after the backend's prefix of at most %d bytes, when it names one)", tok, backend.MaxTokenPrefix)
		}
		if seen[tok] {
			t.Fatalf("token %s came twice in %d acquisitions", tok, len(seen)+1)
		}
		seen[tok] = true
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// severalTTLs: one client holds leases of different TTLs, taken longest
// first, without renewals; each is lost at its own deadline, the short one
// not held up by the longer ones.
func (s *suite) severalTTLs(t *testing.T) {
	ctx := s.ctx(t)
	c := s.client(t, lock.WithAutoRenew(false))
	var leases []*lock.Lease
	for _, ttl := range []time.Duration{8 * s.short, 2 * s.short, s.short} {
		l, err := c.TryAcquire(ctx, s.key(t), lock.WithTTL(ttl))
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		leases = append(leases, l)
	}
	for i := len(leases) - 1; i >= 0; i-- { // shortest first
		l := leases[i]
		select {
		case <-l.Done():
		case <-time.After(time.Until(l.Deadline()) + s.slack):
			t.Fatalf("the lease of TTL %v was not lost within %v of its deadline", l.TTL(), s.slack)
		}
		if late := time.Since(l.Deadline()); late > s.slack {
			t.Errorf("the lease of TTL %v was lost %v after its deadline", l.TTL(), late)
		}
		if !errors.Is(l.Err(), lock.ErrLost) {
			t.Errorf("Err: %v; want ErrLost", l.Err())
		}
	}
}

// storeLosesLock: when the store loses a lock under a live, automatically
// renewed lease (deleted from outside; here, released with its token by
// another client), the next renewal reports the lease lost: it never takes
// the key again, and another owner can have it.
func (s *suite) storeLosesLock(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	ttl := max(3*s.short, time.Second)
	c := s.client(t, lock.WithTTL(ttl))
	l, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	outside := s.backend(t)
	defer outside.Close()
	if err := outside.Release(ctx, key, l.Token()); err != nil {
		t.Fatalf("Release from outside: %v", err)
	}
	select {
	case <-l.Done():
	case <-time.After(ttl/3 + s.slack):
		t.Fatalf("the store lost the lock, and the lease is still valid after its next renewal (%v)", ttl/3+s.slack)
	}
	if !errors.Is(l.Err(), lock.ErrLost) {
		t.Errorf("Err: %v; want ErrLost", l.Err())
	}
	o, err := s.client(t).TryAcquire(ctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("another client after the lease was lost: %v; want the key free", err)
	}
	o.Release(ctx)
}

// cancelInQueue: an Acquire whose context ends while it waits behind
// another goroutine of the same client gives up its place: the goroutine
// behind it gets the key as soon as the holder releases it.
func (s *suite) cancelInQueue(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	c := s.client(t, lock.WithTTL(s.long))
	a, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	bctx, cancel := context.WithCancel(ctx)
	b := make(chan error, 1)
	go func() {
		_, err := c.Acquire(bctx, key)
		b <- err
	}()
	waitWaiting(ctx, t, c, key, 1)
	got := acquireLater(ctx, t, c, key)
	waitWaiting(ctx, t, c, key, 2)
	cancel()
	if err := <-b; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled Acquire: %v; want context.Canceled", err)
	}
	released := time.Now()
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case l := <-got:
		if l == nil {
			t.FailNow()
		}
		if d := time.Since(released); d > s.slack {
			t.Errorf("the goroutine behind a cancelled one got the key %v after the release; want within %v", d, s.slack)
		}
		l.Release(ctx)
	case <-time.After(s.slack + time.Second):
		t.Fatalf("the goroutine behind a cancelled one did not get the key within %v of the release", s.slack+time.Second)
	}
}

// promisedDrift is the drift allowance that package lock's documentation
// promises by default (DefaultDrift: 1% of the TTL plus 2ms), written out
// here: a bound taken from the library's own constant would agree with a
// library build that changed it (to 0, say).
func promisedDrift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}
