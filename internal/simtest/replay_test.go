package simtest

import (
	"slices"
	"strings"
	"testing"
)

// TestSimReplay runs one seed twice and compares what the seed decides:
// the timed faults must repeat exactly. How much of the rest repeats
// (per-request faults, sections) is logged: goroutines runnable at the
// same virtual instant run in the scheduler's order, and package lock's
// jitter comes from math/rand's global source, so neither is the seed's.
func TestSimReplay(t *testing.T) {
	seed := uint64(1)
	if ss := seeds(t); len(ss) > 0 {
		seed = ss[0]
	}
	a := runSeed(t, Config{Seed: seed})
	b := runSeed(t, Config{Seed: seed})
	timed := func(r *Result) []string {
		var out []string
		for _, f := range r.Faults {
			if !strings.Contains(f, `"`) { // per-request faults name their key
				out = append(out, f)
			}
		}
		return out
	}
	if ta, tb := timed(a), timed(b); !slices.Equal(ta, tb) {
		t.Errorf("seed %d: the timed faults differ between two runs:\n  %s\nand\n  %s", seed, strings.Join(ta, "\n  "), strings.Join(tb, "\n  "))
	}
	same := 0
	for i := range min(len(a.Faults), len(b.Faults)) {
		if a.Faults[i] != b.Faults[i] {
			break
		}
		same++
	}
	if same < len(a.Faults) && same < len(b.Faults) {
		t.Logf("first difference:\n  %s\n  %s", a.Faults[same], b.Faults[same])
	}
	t.Logf("seed %d: %d and %d faults, the first %d identical; %d and %d sections; %v and %v simulated", seed, len(a.Faults), len(b.Faults), same, a.Sections, b.Sections, a.Simulated, b.Simulated)
}
