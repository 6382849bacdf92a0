package conformance

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

type suite struct {
	h     Harness
	caps  backend.Capabilities
	short time.Duration // a TTL for the cases that wait for expiry
	long  time.Duration // a TTL that does not run out during a case
	slack time.Duration // scheduling allowance on top of the declared bounds
	// virtual: the cases run in bubbles (VirtualTime, FaultVirtualTime);
	// the recorder then breaks ties between times (see recorder).
	virtual bool
	only    string // under VirtualTime: the one subtest to run (see subtest)
	ranOnly bool
}

func newSuite(t *testing.T, h Harness) *suite {
	caps := h.Capabilities()
	short := max(caps.MinTTL, 200*time.Millisecond)
	if g := caps.Granularity; g > 0 {
		short = (short + g - 1) / g * g
	}
	s := &suite{
		h:     h,
		caps:  caps,
		short: short,
		long:  max(10*short, 10*time.Second),
		slack: 500*time.Millisecond + short/2,
	}
	t.Logf("conformance: short TTL %v, long TTL %v, latest expiry of the short TTL %v", s.short, s.long, caps.LatestExpiry(s.short))
	return s
}

// over returns a copy of s over h, a harness made again for one case (see
// VirtualTime): the TTLs and bounds stay those s derived, and h must
// declare the capabilities s was derived from.
func (s *suite) over(t *testing.T, h Harness) *suite {
	t.Helper()
	if h == nil {
		t.Fatal("conformance: newHarness returned nil")
	}
	if caps := h.Capabilities(); caps != s.caps {
		t.Fatalf("conformance: the harness declares %+v for this case, %+v before the cases; want the same every time", caps, s.caps)
	}
	cs := *s
	cs.h = h
	return &cs
}

// subtest runs f as t's subtest name. A bubble cannot start subtests:
// under VirtualTime, Run calls the case once for each subtest named in its
// table, in a bubble of its own, with s.only set, and subtest runs f in
// t (the bubble's test, named after the subtest) for that name only.
func (s *suite) subtest(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	if !s.virtual {
		t.Run(name, f)
		return
	}
	if name == s.only {
		s.ranOnly = true
		f(t)
	}
}

// key returns a key unique to this run of the calling test.
func (s *suite) key(t *testing.T) string {
	var b [6]byte
	crand.Read(b[:])
	return "conformance/" + t.Name() + "/" + hex.EncodeToString(b[:])
}

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	t.Cleanup(cancel)
	return ctx
}

// backend returns a new client of the store; the caller closes it, usually
// through the lock.Client that owns it.
func (s *suite) backend(t *testing.T) backend.Backend {
	t.Helper()
	b, err := s.h.NewBackend(s.ctx(t))
	if err != nil {
		t.Fatalf("harness NewBackend: %v", err)
	}
	if b == nil {
		t.Fatal("harness NewBackend returned nil")
	}
	return guarded(b, t.Name(), 5*time.Second+4*s.slack)
}

// client returns a lock.Client over a new backend, closed at cleanup.
func (s *suite) client(t *testing.T, opts ...lock.Option) *lock.Client {
	t.Helper()
	return s.clientOver(t, s.backend(t), opts...)
}

func (s *suite) clientOver(t *testing.T, b backend.Backend, opts ...lock.Option) *lock.Client {
	t.Helper()
	if co, ok := s.h.(ClientOptioner); ok {
		opts = append(co.ClientOptions(unguarded(b)), opts...)
	}
	c, err := lock.New(b, opts...)
	if err != nil {
		b.Close()
		t.Fatalf("lock.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (s *suite) clients(t *testing.T, n int, opts ...lock.Option) []*lock.Client {
	t.Helper()
	out := make([]*lock.Client, n)
	for i := range out {
		out[i] = s.client(t, opts...)
	}
	return out
}

// waitOutExpiry sleeps until the store must have expired a lock granted for
// ttl no later than now: waiting out a TTL is the one sleep the suite uses.
func (s *suite) waitOutExpiry(ttl time.Duration) {
	time.Sleep(s.caps.LatestExpiry(ttl) + s.caps.Granularity + 20*time.Millisecond)
}

func (s *suite) checkHistory(t *testing.T, rec *recorder) {
	t.Helper()
	if err := rec.check(checkBudget); err != nil {
		t.Error(err)
	}
}

// successorDone checks that next's fence is above prev's, then releases next.
func successorDone(ctx context.Context, t *testing.T, prev, next *lock.Lease) {
	t.Helper()
	if next.Fence() <= prev.Fence() {
		t.Errorf("fence %d after %d; want strictly increasing", next.Fence(), prev.Fence())
	}
	if err := next.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// cutOff cuts b's client off the store with the harness's hooks and returns
// the function that undoes it. ok is false when the harness has no hook.
func (s *suite) cutOff(t *testing.T, b backend.Backend) (undo func(), whole bool, ok bool) {
	t.Helper()
	ctx := s.ctx(t)
	var cut, heal func(context.Context) error
	if d, yes := s.h.(Disconnecter); yes {
		cut = func(ctx context.Context) error { return d.Disconnect(ctx, unguarded(b)) }
		heal = func(ctx context.Context) error { return d.Reconnect(ctx, unguarded(b)) }
	} else if p, yes := s.h.(Pauser); yes {
		cut, heal, whole = p.Pause, p.Resume, true
	} else {
		return nil, false, false
	}
	if err := cut(ctx); err != nil {
		t.Fatalf("harness: cutting the store off: %v", err)
	}
	var once sync.Once
	undo = func() {
		once.Do(func() {
			if err := heal(ctx); err != nil {
				t.Errorf("harness: reconnecting the store: %v", err)
			}
		})
	}
	t.Cleanup(undo)
	return undo, whole, true
}

// keyIsFree checks that a new client takes key at once, and releases it.
func (s *suite) keyIsFree(ctx context.Context, t *testing.T, key, when, why string) {
	t.Helper()
	l, err := s.client(t).TryAcquire(ctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("TryAcquire %s: %v; want success (%s)", when, err, why)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}
