package simtest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
)

// TestSim runs package lock's real code against the memory store over the
// simulated network, one seed after another, and fails on any violation.
func TestSim(t *testing.T) {
	Sweep(t, Config{TTL: *simTTL}, "./internal/simtest", 150)
}

// Deliberately broken backends, each wrapping a simulated connection: the
// negative controls of TestSimCatchesBrokenBackends. Their flaws live here,
// in the test, and nowhere else.

// shortTTL asks the store for num/den of the TTL it is given and reports
// the full one, so that the store expires locks while their leases still
// count as valid.
type shortTTL struct {
	Backend
	num, den time.Duration
}

func (b shortTTL) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := b.Backend.Acquire(ctx, key, token, ttl*b.num/b.den)
	g.TTL = 0 // "as asked"
	return g, err
}

func (b shortTTL) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := b.Backend.Renew(ctx, key, token, ttl*b.num/b.den)
	g.TTL = 0
	return g, err
}

func (b shortTTL) Transfer(ctx context.Context, key, from, to string, ttl time.Duration, opt backend.TransferOptions) (backend.Transferred, error) {
	tr, err := b.Backend.Transfer(ctx, key, from, to, ttl*b.num/b.den, opt)
	tr.TTL = 0
	return tr, err
}

// optimisticRenew answers a renewal whose reply did not come in time as if
// it had succeeded: a retry layer that assumes the best.
type optimisticRenew struct{ Backend }

func (b optimisticRenew) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := b.Backend.Renew(ctx, key, token, ttl)
	if errors.Is(err, ErrTimeout) {
		return backend.Grant{}, nil
	}
	return g, err
}

// phantomGrant answers an acquire whose reply did not come in time as a
// grant, with a fence above every real one: Acquire succeeds without the
// store.
type phantomGrant struct {
	Backend
	fences *atomic.Uint64
}

func (b phantomGrant) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := b.Backend.Acquire(ctx, key, token, ttl)
	if errors.Is(err, ErrTimeout) {
		return backend.Grant{Fence: 1<<40 + b.fences.Add(1)}, nil
	}
	return g, err
}

// wrappedFence reports fences modulo a small number: they repeat and go
// backwards.
type wrappedFence struct{ Backend }

func (b wrappedFence) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := b.Backend.Acquire(ctx, key, token, ttl)
	if g.Fence > 0 {
		g.Fence = g.Fence%7 + 1
	}
	return g, err
}

// forgetfulRelease answers releases with success without sending them:
// locks are left behind until they expire.
type forgetfulRelease struct{ Backend }

func (b forgetfulRelease) Release(ctx context.Context, key, token string) error { return nil }

// shunned answers every acquire of client 0 with "locked", whoever holds
// the key: that client is never served.
type shunned struct{ Backend }

func (b shunned) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if b.Backend.(*Conn).id == 0 {
		return backend.Grant{}, backend.Locked(0)
	}
	return b.Backend.Acquire(ctx, key, token, ttl)
}

// TestSimCatchesBrokenBackends proves that the checkers can fail: over each
// deliberately broken backend, some seed of the CI budget must show the
// violation the flaw causes. It logs how many seeds each took.
func TestSimCatchesBrokenBackends(t *testing.T) {
	cases := []struct {
		name string
		wrap func(Backend) Backend
		rate float64 // of every client's clock; 0: as drawn
		want string  // in a violation
	}{
		{"store enforces a quarter of the TTL", func(b Backend) Backend { return shortTTL{b, 1, 4} }, 0, "overlap on"},
		{"store enforces 90% of the TTL", func(b Backend) Backend { return shortTTL{b, 9, 10} }, 0, "overlap on"},
		{"renewal of unknown outcome taken as success", func(b Backend) Backend { return optimisticRenew{b} }, 0, "overlap on"},
		{"acquire of unknown outcome taken as a grant", nil, 0, "overlap on"},
		{"fences wrap around", func(b Backend) Backend { return wrappedFence{b} }, 0, "fence"},
		{"releases never sent", func(b Backend) Backend { return forgetfulRelease{b} }, 0, "still holds"},
		{"one client never served", func(b Backend) Backend { return shunned{b} }, 0, "liveness"},
		{"client clocks 3% slow, beyond the drift allowance", func(b Backend) Backend { return b }, 0.97, "overlap on"},
	}
	// Up to three times the CI budget, whatever -simseed says: each case
	// stops at its first catch, which takes one seed for most flaws and
	// 5 to 56 (about 22 on average, measured) for the optimistic renewal,
	// whose window is narrow; the margin keeps the test from failing by
	// chance.
	ss := seedRangeN(t, 3**simSeeds)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ta := &tally{begin: time.Now()}
			for i, seed := range ss {
				wrap := tc.wrap
				if wrap == nil {
					fences := new(atomic.Uint64)
					wrap = func(b Backend) Backend { return phantomGrant{b, fences} }
				}
				r := runSeed(t, Config{Seed: seed, Wrap: wrap, ClockRate: tc.rate})
				ta.add(r)
				for _, v := range r.Violations {
					if strings.Contains(v, tc.want) {
						t.Logf("caught by seed %d, the %d. of the run: %s", seed, i+1, v)
						t.Log(ta)
						return
					}
				}
			}
			t.Errorf("no violation with %q in %d seeds over a broken backend: the checkers cannot see it", tc.want, len(ss))
		})
	}
}
