package simtest

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// The flags of the simulation tests (TestSim here, TestSimRedis and
// TestSimRedlock in internal/simredis, which import this package and so
// get its flags):
//
//	go test -race -run 'TestSim$' ./internal/simtest                      # the CI budget: -simseeds seeds from a random base
//	go test -race -run 'TestSim$' ./internal/simtest -simseed=N           # replay seed N (up to -simtries times)
//	go test -race -run 'TestSim$' ./internal/simtest -simseeds=100000     # on demand: many more
//	go test -race -run 'TestSim$' ./internal/simtest -simbase=N -simv     # a fixed range, one line per seed
//
// A failing seed prints its violations, its fault schedule with virtual
// times, and the command that replays it. Only test binaries import this
// package, so its flags are theirs alone.
var (
	simSeed  = flag.String("simseed", "", "replay this one seed (as printed by a failing run)")
	simSeeds = flag.Int("simseeds", 150, "how many seeds a simulation test runs")
	simBase  = flag.String("simbase", "", "the first seed of a simulation test's run (default: a random one, printed)")
	simTTL   = flag.Duration("simttl", time.Second, "the lease TTL of the simulated runs; the workload and the faults scale with it, latencies do not")
	simV     = flag.Bool("simv", false, "log every seed's summary")
	simWant  = flag.String("simwant", "", "stop at the first seed with a violation that contains this text, and report how many seeds it took (the self-test of internal/simredis runs flawed copies so)")
	simTries = flag.Int("simtries", 20, "with -simseed: run the seed up to this many times, until one fails (a seed fixes the fault schedule, not the interleaving)")
)

// seeds returns the seeds to run: the -simseed one, or seedRange.
func seeds(t *testing.T) []uint64 {
	if *simSeed != "" {
		s, err := strconv.ParseUint(*simSeed, 10, 64)
		if err != nil {
			t.Fatalf("-simseed=%q: want a seed printed by an earlier run", *simSeed)
		}
		return []uint64{s}
	}
	return seedRange(t)
}

// seedRange returns -simseeds seeds from -simbase (random unless given).
func seedRange(t *testing.T) []uint64 { return seedRangeN(t, *simSeeds) }

// Budget returns the number of seeds a simulation test runs: -simseeds if
// given, otherwise n, the test's share of the CI budget.
func Budget(n int) int {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "simseeds" })
	if set {
		return *simSeeds
	}
	return n
}

// seedRangeN returns n seeds from -simbase (random unless given).
func seedRangeN(t *testing.T, n int) []uint64 {
	base := rand.Uint64() >> 1
	if *simBase != "" {
		b, err := strconv.ParseUint(*simBase, 10, 64)
		if err != nil {
			t.Fatalf("-simbase=%q: want a number", *simBase)
		}
		base = b
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

// runSeed runs one seed in a bubble of its own. A deadlock in the bubble
// (synctest panics) is reported as a violation of that seed.
func runSeed(t *testing.T, cfg Config) (res *Result) {
	defer func() {
		if p := recover(); p != nil {
			res = &Result{Seed: cfg.Seed, Violations: []string{fmt.Sprintf("the bubble failed: %v; its goroutines:\n%s", p, bubbleStacks())}}
		}
	}()
	synctest.Test(t, func(t *testing.T) { res = Run(cfg) })
	return res
}

// bubbleStacks returns the stacks of the goroutines still in a synctest
// bubble (those a failed bubble left blocked), at most 30 of them.
func bubbleStacks() string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(strings.SplitN(g, "\n", 2)[0], "synctest bubble") && len(out) < 30 {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// tally sums up runs for the report line.
type tally struct {
	seeds, sections, lost, cancelled int
	deadOnArrival                    int
	simulated                        time.Duration
	begin                            time.Time
	requests                         map[string]int
}

func (ta *tally) add(r *Result) {
	ta.seeds++
	ta.sections += r.Sections
	ta.lost += r.Lost
	ta.cancelled += r.Cancelled
	ta.deadOnArrival += r.DeadOnArrival
	ta.simulated += r.Simulated
	if ta.requests == nil {
		ta.requests = map[string]int{}
	}
	for op, n := range r.Requests {
		ta.requests[op] += n
	}
}

func (ta *tally) String() string {
	wall := time.Since(ta.begin)
	ops := slices.Sorted(maps.Keys(ta.requests))
	var reqs []string
	for _, op := range ops {
		reqs = append(reqs, fmt.Sprintf("%s %d", op, ta.requests[op]))
	}
	return fmt.Sprintf("%d runs in %v (%.1f runs/s): %d critical sections (%d lost, %d of them lost as Acquire returned them, %d acquires cancelled), %.2f simulated hours (%.2f simulated hours per wall second); requests: %s",
		ta.seeds, wall.Round(time.Millisecond), float64(ta.seeds)/wall.Seconds(), ta.sections, ta.lost, ta.deadOnArrival, ta.cancelled, ta.simulated.Hours(), ta.simulated.Hours()/wall.Seconds(), strings.Join(reqs, ", "))
}

// failure describes a failing run, with the command that replays it: the
// test named test in the package in directory pkg.
func failure(r *Result, pkg, test string) string {
	return fmt.Sprintf("seed %d: %d violations (replay: go test -race -run '^%s$' %s -simseed=%d):\n  %s\nthe leases of the keys named:\n  %s\nthe faults of the keys named, and every timed fault (-simv: all):\n  %s",
		r.Seed, len(r.Violations), test, pkg, r.Seed, strings.Join(r.Violations, "\n  "), strings.Join(r.Leases, "\n  "), strings.Join(relevantFaults(r), "\n  "))
}

// relevantFaults returns the faults of r that concern the keys its
// violations name, and the timed ones (partitions, pauses, restarts,
// which name no key); with -simv, all of them.
func relevantFaults(r *Result) []string {
	if *simV {
		return r.Faults
	}
	quoted := regexp.MustCompile(`"[^"]*"`)
	named := map[string]bool{}
	for _, v := range r.Violations {
		for _, k := range quoted.FindAllString(v, -1) {
			named[k] = true
		}
	}
	var out []string
	for _, f := range r.Faults {
		ks := quoted.FindAllString(f, -1)
		keep := len(ks) == 0
		for _, k := range ks {
			keep = keep || named[k]
		}
		if keep {
			out = append(out, f)
		}
	}
	return out
}

// Sweep runs cfg with the seeds the flags name (-simseed, or Budget(n)
// seeds from -simbase), one after another, and fails t on any violation
// (up to three seeds' worth, then it stops). pkg is the package's
// directory, for the replay command it prints.
func Sweep(t *testing.T, cfg Config, pkg string, n int) {
	if cfg.TTL == 0 {
		cfg.TTL = *simTTL
	}
	ss := seeds(t)
	if *simSeed == "" {
		ss = seedRangeN(t, Budget(n))
	}
	if *simSeed == "" {
		t.Logf("seeds %d to %d (replay one with -simseed=N)", ss[0], ss[len(ss)-1])
	}
	ta := &tally{begin: time.Now()}
	failed := 0
	tries := 1
	if *simSeed != "" {
		tries = max(1, *simTries)
	}
	for i, seed := range ss {
		var r *Result
		for try := 0; try < tries; try++ {
			cfg.Seed = seed
			r = runSeed(t, cfg)
			ta.add(r)
			if len(r.Violations) > 0 {
				if tries > 1 {
					t.Logf("seed %d failed on try %d", seed, try+1)
				}
				break
			}
		}
		if *simV {
			t.Logf("seed %d: %d sections, %d lost, %v simulated, %d faults", seed, r.Sections, r.Lost, r.Simulated, len(r.Faults))
		}
		if *simWant != "" {
			if v, ok := violation(r, *simWant); ok {
				t.Log(ta)
				t.Errorf("FOUND %q after %d seeds (seed %d): %s\n%s", *simWant, i+1, seed, v, failure(r, pkg, t.Name()))
				return
			}
			continue
		}
		if len(r.Violations) > 0 {
			t.Error(failure(r, pkg, t.Name()))
			if failed++; failed == 3 {
				break
			}
		}
	}
	if *simWant != "" {
		t.Logf("NOT FOUND %q in %d seeds", *simWant, len(ss))
	}
	t.Log(ta)
}

// violation returns r's first violation that contains want.
func violation(r *Result, want string) (string, bool) {
	for _, v := range r.Violations {
		if strings.Contains(v, want) {
			return v, true
		}
	}
	return "", false
}
