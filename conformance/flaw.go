package conformance

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
)

// Negative controls under faults: FaultFlaw runs the contenders of a fault
// run over a wrapper that breaks one promise of whatever store the harness
// gives, so that a test can require the run to notice (see the memory,
// Redis and etcd packages' TestFaultRunsCatchFlaws). The flaws are the
// classic bugs of lock libraries:
//
//   - "expire-early": the store is asked for half the TTL (at least its
//     granularity and minimum) while the grant claims the whole TTL, as a
//     library that mixes up seconds and milliseconds or counts its deadline
//     from the wrong moment would: a holder still counts itself valid after
//     the store freed the key;
//   - "repeat-fence": every third grant reports the highest fence granted
//     before for the key instead of its own, as a fence taken from a
//     counter that is not durable or not atomic would;
//   - "release-ignores-token": a release by a token that does not hold the
//     key deletes the holder's lock anyway (the blind delete by key name of
//     etcd#22082), as a release of a lease lost to expiry does.
//
// The wrapper hides the store's Transferer (package lock then releases
// through the store) and keeps its Notifier and Inspector.

// flawNames are the flaws FaultFlaw accepts.
var flawNames = []string{"expire-early", "repeat-fence", "release-ignores-token"}

// FaultFlaw makes the run's contenders use the store through a wrapper with
// the named flaw: "expire-early", "repeat-fence" or
// "release-ignores-token". For negative controls only: such a run must
// find violations.
func FaultFlaw(name string) FaultOption { return func(o *faultOptions) { o.flaw = name } }

func checkFlaw(name string) error {
	if name == "" {
		return nil
	}
	for _, n := range flawNames {
		if n == name {
			return nil
		}
	}
	return fmt.Errorf("fault runs: unknown flaw %q; want one of %s", name, strings.Join(flawNames, ", "))
}

// flawState is shared by the wrappers of one run: the fences granted so far.
type flawState struct {
	mu     sync.Mutex
	grants int
	fences map[string][]uint64 // by key, sorted
}

func newFlawState() *flawState { return &flawState{fences: map[string][]uint64{}} }

// fence records a grant of f for key and returns the fence to report.
func (s *flawState) fence(name, key string, f uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.grants++
	fs := s.fences[key]
	i := sort.Search(len(fs), func(i int) bool { return fs[i] >= f })
	if i == len(fs) || fs[i] != f {
		fs = append(fs, 0)
		copy(fs[i+1:], fs[i:])
		fs[i] = f
		s.fences[key] = fs
	}
	if name == "repeat-fence" && s.grants%3 == 0 && i > 0 {
		return fs[i-1] // the highest fence granted before this one
	}
	return f
}

// flawed is a backend with one flaw; b is the store the suite made.
type flawed struct {
	b     backend.Backend
	name  string
	state *flawState
	caps  backend.Capabilities
}

func withFlaw(b backend.Backend, name string, state *flawState) backend.Backend {
	var caps backend.Capabilities
	if d, ok := b.(backend.Describer); ok {
		caps = d.Capabilities()
	}
	return &flawed{b: b, name: name, state: state, caps: caps}
}

// short is the TTL the store is asked for under "expire-early": half of
// ttl, at least the store's minimum, in whole units of its granularity.
func (f *flawed) short(ttl time.Duration) time.Duration {
	d := max(ttl/2, f.caps.MinTTL)
	if g := f.caps.Granularity; g > 0 {
		d = (d + g - 1) / g * g
	}
	return d
}

func (f *flawed) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	asked := ttl
	if f.name == "expire-early" {
		asked = f.short(ttl)
	}
	g, err := f.b.Acquire(ctx, key, token, asked)
	if err != nil {
		return g, err
	}
	g.Fence = f.state.fence(f.name, key, g.Fence)
	if f.name == "expire-early" {
		g.TTL = 0 // claims the TTL it was asked for
	}
	return g, nil
}

func (f *flawed) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if f.name != "expire-early" {
		return f.b.Renew(ctx, key, token, ttl)
	}
	g, err := f.b.Renew(ctx, key, token, f.short(ttl))
	g.TTL = 0
	return g, err
}

func (f *flawed) Release(ctx context.Context, key, token string) error {
	err := f.b.Release(ctx, key, token)
	if f.name != "release-ignores-token" || !errors.Is(err, backend.ErrNotHeld) {
		return err
	}
	in, ok := f.b.(backend.Inspector)
	if !ok {
		return err
	}
	// The blind delete: whoever holds the key loses it.
	if h, ierr := in.Inspect(ctx, key); ierr == nil && h.Held && h.Token != "" {
		_ = f.b.Release(ctx, key, h.Token)
	}
	return err
}

func (f *flawed) Close() error { return f.b.Close() }

func (f *flawed) Capabilities() backend.Capabilities { return f.caps }

// Watch keeps the store's wake-ups; without them package lock polls.
func (f *flawed) Watch(ctx context.Context, key string) (backend.Watch, error) {
	if n, ok := f.b.(backend.Notifier); ok {
		return n.Watch(ctx, key)
	}
	return nil, errors.New("conformance: the store has no notifier")
}

func (f *flawed) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	if in, ok := f.b.(backend.Inspector); ok {
		return in.Inspect(ctx, key)
	}
	return backend.Holder{}, errors.New("conformance: the store has no inspector")
}

// RunFlawControls is the negative control of the fault runs: for each of
// the named flaws (nil: every flaw FaultFlaw offers), in parallel
// subtests, it makes runs seeded fault runs (opts apply to each) over a
// harness from newHarness with the flaw, and fails unless at least 95% of
// them find a violation: the proof that the runs can fail on this store,
// under its faults. ("expire-early" needs a store whose minimum TTL is at
// most half the suite's short TTL: on etcd and Consul, whose short TTL is
// their minimum, it changes nothing.)
func RunFlawControls(t *testing.T, newHarness func(t *testing.T) Harness, runs int, flaws []string, opts ...FaultOption) {
	t.Helper()
	if runs < 1 {
		t.Fatalf("conformance: %d runs per flaw; want at least 1", runs)
	}
	if flaws == nil {
		flaws = flawNames
	}
	for _, name := range flaws {
		if err := checkFlaw(name); err != nil || name == "" {
			t.Fatalf("conformance: flaw %q: want one of %s", name, strings.Join(flawNames, ", "))
		}
	}
	for _, name := range flaws {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // mostly waiting: sections, faults
			h := newHarness(t)
			if h == nil {
				t.Fatal("conformance: newHarness returned nil")
			}
			RequireCaught(t, name, runs, func(seed uint64) []string {
				return FaultRun(t, h, seed, append(opts, FaultFlaw(name))...)
			})
		})
	}
}

// RequireCaught makes runs seeded runs (seeds 1000, 1001, ...) of a
// negative control named name, each returning its violations, and fails t
// unless at least 95% of them found one.
func RequireCaught(t *testing.T, name string, runs int, run func(seed uint64) []string) {
	t.Helper()
	caught := 0
	for i := range runs {
		seed := uint64(1000 + i)
		if v := run(seed); len(v) > 0 {
			if caught == 0 {
				t.Logf("seed %d, first of %d violations: %s", seed, len(v), v[0])
			}
			caught++
		} else {
			t.Logf("seed %d: the flaw went unseen", seed)
		}
	}
	t.Logf("%s caught in %d of %d runs", name, caught, runs)
	if caught*100 < 95*runs {
		t.Errorf("%s caught in %d of %d fault runs; want at least 95%%", name, caught, runs)
	}
}
