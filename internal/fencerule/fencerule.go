// Package fencerule is the one history of fence offers that every fenced
// resource of package fence must answer alike (fence.Guard in memory,
// fence.Table in each SQL dialect), for their tests.
package fencerule

import (
	"errors"
	"math"
	"sync/atomic"
	"testing"

	"github.com/distlock/lock"
	"github.com/distlock/lock/fence"
)

// A Step is one offer and its outcome.
type Step struct {
	Name     string
	Resource string
	Fence    uint64
	Holder   string
	Want     string // "" when accepted, else the ErrStale message
}

// Steps is one history of offers, run in order against one Guard or
// Table: the rule every helper applies.
var Steps = []Step{
	{"first fence accepted", "r1", 5, "a", ""},
	{"lower fence refused", "r1", 4, "b", `fence: stale fence 4 for "r1": fence 5 was already accepted`},
	{"lower fence from the same holder refused", "r1", 3, "a", `fence: stale fence 3 for "r1": fence 5 was already accepted`},
	{"equal fence from the same holder accepted", "r1", 5, "a", ""},
	{"equal fence from another holder refused", "r1", 5, "b", `fence: stale fence 5 for "r1": fence 5 was already accepted from another holder`},
	{"higher fence accepted", "r1", 6, "b", ""},
	{"the old holder refused after the new one", "r1", 5, "a", `fence: stale fence 5 for "r1": fence 6 was already accepted`},
	{"the new holder writes twice", "r1", 6, "b", ""},
	{"another resource starts afresh", "r2", 1, "c", ""},
	{"the first resource is unchanged by it", "r1", 2, "c", `fence: stale fence 2 for "r1": fence 6 was already accepted`},
	{"the second resource refuses on its own", "r2", 1, "d", `fence: stale fence 1 for "r2": fence 1 was already accepted from another holder`},
	{"a large fence", "r2", math.MaxInt64, "d", ""},
	// Fence epochs (lock.WithFenceEpoch) while a deployment moves between
	// stores: a later epoch's fence is above every fence of an earlier
	// one, however far ahead the old store's counter was.
	{"epoch 0: the old store's fence far ahead", "epochs", 1_000_000_000_000_001, "e", ""},
	{"epoch 1 above every fence of epoch 0", "epochs", 1<<lock.FenceEpochShift | 1, "f", ""},
	{"epoch 0 refused after epoch 1", "epochs", 1_000_000_000_000_002, "e", `fence: stale fence 1000000000000002 for "epochs": fence 72057594037927937 was already accepted`},
	{"the highest epoch fits a signed 64-bit column", "epochs", lock.MaxFenceEpoch<<lock.FenceEpochShift | 5, "g", ""},
}

// Check compares the outcome of one offer with what its Step wants.
func Check(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("refused: %v; want accepted", err)
	case want != "" && !errors.Is(err, fence.ErrStale):
		t.Fatalf("got %v; want ErrStale", err)
	case want != "" && err.Error() != want:
		t.Fatalf("message %q; want %q", err, want)
	}
}

// Raise sets a to f when f is higher: the highest fence a race saw
// accepted.
func Raise(a *atomic.Uint64, f uint64) {
	for {
		old := a.Load()
		if f <= old || a.CompareAndSwap(old, f) {
			return
		}
	}
}

// Stale returns a fence that must be refused now, when newest holds the
// highest fence accepted so far: one below it, or (on odd rounds) equal to
// it, offered by another holder. ok is false while newest is below 2.
func Stale(newest *atomic.Uint64, round int) (f uint64, ok bool) {
	c := newest.Load()
	if c < 2 {
		return 0, false
	}
	if round%2 == 1 {
		return c, true
	}
	return c - 1, true
}
