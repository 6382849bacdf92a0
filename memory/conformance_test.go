package memory

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/internal/libflaw"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type harness struct{ s *Store }

var (
	_ conformance.Pauser       = harness{}
	_ conformance.Disconnecter = harness{}
	_ conformance.Restarter    = harness{}
	_ conformance.ReplyHolder  = harness{}
)

func (h harness) NewBackend(context.Context) (backend.Backend, error) { return h.s.NewClient(), nil }

func (h harness) Capabilities() backend.Capabilities { return h.s.NewClient().Capabilities() }

func (h harness) Pause(context.Context) error  { h.s.Pause(); return nil }
func (h harness) Resume(context.Context) error { h.s.Resume(); return nil }

func (h harness) Disconnect(_ context.Context, b backend.Backend) error {
	b.(*Client).Disconnect()
	return nil
}

func (h harness) Reconnect(_ context.Context, b backend.Backend) error {
	b.(*Client).Reconnect()
	return nil
}

func (h harness) HoldReplies(_ context.Context, b backend.Backend) error {
	b.(*Client).HoldReplies()
	return nil
}

func (h harness) DeliverReplies(_ context.Context, b backend.Backend) error {
	b.(*Client).DeliverReplies()
	return nil
}

func (h harness) DropReplies(_ context.Context, b backend.Backend) error {
	b.(*Client).DropReplies()
	return nil
}

func (h harness) Restart(_ context.Context, keepData bool) error {
	mode := LoseData
	if keepData {
		mode = KeepData
	}
	h.s.Restart(mode)
	return nil
}

// flawEnv names a deliberate flaw for the child process that
// TestSuiteCatchesFlaws starts; it is empty in every normal run.
const flawEnv = "LOCK_MEMORY_FLAW"

var flawSwitches = map[string]func(*flaws){
	"release-ignores-token": func(f *flaws) { f.releaseIgnoresToken = true },
	"renew-reacquires":      func(f *flaws) { f.renewReacquires = true },
	"repeat-fence":          func(f *flaws) { f.repeatFence = true },
	"non-atomic-acquire":    func(f *flaws) { f.nonAtomicAcquire = true },
	"expire-early":          func(f *flaws) { f.expireEarly = true },
	"round-down":            func(f *flaws) { f.roundDown = true },
	"renew-short":           func(f *flaws) { f.renewShort = true },
	"grant-overstated":      func(f *flaws) { f.grantOverstated = true },
	"prefix-token":          func(f *flaws) { f.prefixToken = true },
	"release-expired-ok":    func(f *flaws) { f.releaseExpiredOK = true },
	"silent-notifier":       func(f *flaws) { f.silentNotifier = true },
	"inspect-expired":       func(f *flaws) { f.inspectExpired = true },
	"inspect-stale":         func(f *flaws) { f.inspectStale = true },
	"claims-fifo":           func(f *flaws) { f.claimsFIFO = true },
	"forget-fence-idle":     func(f *flaws) { f.forgetFenceIdle = true },
	"ignores-context":       func(f *flaws) { f.ignoreContext = true },
	"transfer-any-from":     func(f *flaws) { f.transferAnyFrom = true },
	"transfer-forgets":      func(f *flaws) { f.transferForgets = true },
	"transfer-keeps-expiry": func(f *flaws) { f.transferKeepsExpiry = true },
	"short-keys":            func(f *flaws) { f.shortKeys = true },
	"fold-keys":             func(f *flaws) { f.foldKeys = true },
	"clean-keys":            func(f *flaws) { f.cleanKeys = true },
	// Flaws of package lock itself, on a correct store.
	"deadline-from-reply":      func(*flaws) { libflaw.DeadlineFromReply = true },
	"zero-drift":               func(*flaws) { libflaw.ZeroDrift = true },
	"renew-longer-ttl":         func(*flaws) { libflaw.RenewLongerTTL = true },
	"unknown-renew-is-success": func(*flaws) { libflaw.UnknownRenewIsSuccess = true },
	"short-tokens":             func(*flaws) { libflaw.ShortTokens = true },
	"scheduler-no-rearm":       func(*flaws) { libflaw.SchedulerNoRearm = true },
}

func TestConformance(t *testing.T) {
	var store *Store
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		store = NewStore()
		if name := os.Getenv(flawEnv); name == "no-hooks" {
			return hooksHidden{harness{store}}
		} else if name != "" {
			set, ok := flawSwitches[name]
			if !ok {
				t.Fatalf("%s=%q: unknown flaw", flawEnv, name)
			}
			set(&store.flaws)
			t.Logf("running with the deliberate flaw %q", name)
		}
		return harness{store}
	}, conformance.RequireHooks())
	if n := store.Watchers(); n != 0 {
		t.Errorf("%d watches left open after the suite; want 0", n)
	}
	if n := store.Len(); n != 0 {
		t.Errorf("%d locks left held after the suite; want 0", n)
	}
}

// hooksHidden offers a harness without any of its fault hooks.
type hooksHidden struct{ h harness }

func (h hooksHidden) NewBackend(ctx context.Context) (backend.Backend, error) {
	return h.h.NewBackend(ctx)
}
func (h hooksHidden) Capabilities() backend.Capabilities { return h.h.Capabilities() }

// TestSuiteCatchesFlaws runs the whole suite, in a child process, against
// memory stores with one deliberate bug each, and checks that the suite fails
// and that the case aimed at the bug is among the failures.
func TestSuiteCatchesFlaws(t *testing.T) {
	if os.Getenv(flawEnv) != "" {
		return // this is the child: only TestConformance runs here
	}
	cases := []struct {
		flaw string
		want []string // the failing cases that must include at least these
		only bool     // run just the wanted cases (the whole suite takes longer)
	}{
		{"release-ignores-token", []string{"StaleOwner/ReleaseAfterSuccessor"}, false},
		{"renew-reacquires", []string{"StaleOwner/RenewAfterExpiry"}, false},
		{"repeat-fence", []string{"FencesSequential", "FencesContended"}, false},
		{"non-atomic-acquire", []string{"TryAcquireRace"}, false},
		{"expire-early", []string{"ExpiryNotEarly"}, true},
		{"round-down", []string{"ExpiryNotEarly"}, true},
		{"renew-short", []string{"ExpiryNotEarly"}, true},
		{"grant-overstated", []string{"ExpiryNotEarly"}, true},
		{"prefix-token", []string{"TokenExact"}, true},
		{"release-expired-ok", []string{"ReleaseAfterExpiry"}, true},
		{"silent-notifier", []string{"WakeOnRelease"}, true},
		{"inspect-expired", []string{"InspectAfterExpiry"}, true},
		{"inspect-stale", []string{"InspectAfterExpiry"}, true},
		{"claims-fifo", []string{"FIFOOrder"}, true},
		{"forget-fence-idle", []string{"FenceAfterIdle"}, true},
		// A harness without hooks under RequireHooks: the cases that need
		// them skip, and the run fails saying which.
		{"no-hooks", []string{"LostSignal", "ReplyLost", "FenceAfterRestart"}, true},
		// A call that ignores its context stops the run, naming the call
		// and the case, instead of hanging until go test's timeout.
		{"ignores-context", []string{"CancelWhileStoreHangs"}, true},
		{"transfer-any-from", []string{"Transfer"}, true},
		{"transfer-forgets", []string{"Transfer"}, true},
		{"transfer-keeps-expiry", []string{"Transfer"}, true},
		{"short-keys", []string{"KeyShapes"}, true},
		{"fold-keys", []string{"KeyShapes"}, true},
		{"clean-keys", []string{"KeyShapes"}, true},
		{"deadline-from-reply", []string{"DeadlineFromSend"}, true},
		{"zero-drift", []string{"DeadlineFromSend"}, true},
		{"renew-longer-ttl", []string{"DeadlineFromSend"}, true},
		{"unknown-renew-is-success", []string{"DeadlineFromSend"}, true},
		{"short-tokens", []string{"TokenShape"}, true},
		{"scheduler-no-rearm", []string{"SeveralTTLs"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.flaw, func(t *testing.T) {
			t.Parallel()
			run := "-test.run=^TestConformance$"
			if tc.only {
				run += "/^(" + strings.Join(tc.want, "|") + ")$"
			}
			// FIFOOrder catches a store that only claims FIFO when its
			// newcomer hits the moment between a release and the woken
			// waiter's acquire: nearly always, but not in every run under
			// load (it passed the flaw once in a CI run). The control
			// gives it three runs in one child; any failing run counts.
			count := "-test.count=1"
			if tc.flaw == "claims-fifo" {
				count = "-test.count=3"
			}
			cmd := exec.Command(os.Args[0], run, "-test.v", count, "-test.timeout=5m")
			cmd.Env = append(os.Environ(), flawEnv+"="+tc.flaw)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a backend whose %s; output:\n%s", tc.flaw, out)
			}
			if _, ok := err.(*exec.ExitError); !ok {
				t.Fatalf("running the child: %v", err)
			}
			failed := failedCases(string(out))
			if tc.flaw == "ignores-context" {
				if !strings.Contains(string(out), "case TestConformance/CancelWhileStoreHangs: backend Acquire ignores its context") {
					t.Fatalf("a backend that ignores its context: the run did not name the call and the case:\n%s", tail(string(out), 30))
				}
				return
			}
			if tc.flaw == "no-hooks" {
				if !failed["TestConformance"] || !strings.Contains(string(out), "3 of") || !strings.Contains(string(out), "skipped for want of a harness hook") {
					t.Fatalf("a harness without hooks under RequireHooks: the run did not fail naming the skipped cases:\n%s", tail(string(out), 30))
				}
				return
			}
			for _, w := range tc.want {
				if !failed["TestConformance/"+w] {
					t.Errorf("flaw %s: case %s did not fail; failing cases: %v\n%s", tc.flaw, w, keys(failed), tail(string(out), 60))
				}
			}
			t.Logf("flaw %s caught by: %v", tc.flaw, keys(failed))
		})
	}
}

func failedCases(out string) map[string]bool {
	failed := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if name, ok := strings.CutPrefix(line, "--- FAIL: "); ok {
			if i := strings.IndexByte(name, ' '); i > 0 {
				name = name[:i]
			}
			failed[name] = true
		}
	}
	return failed
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return fmt.Sprint(strings.Join(lines, "\n"))
}

// Seeded randomized fault runs against the in-process store.
func TestFaultRuns(t *testing.T) {
	conformance.RunFaults(t, func(t *testing.T) conformance.Harness { return harness{NewStore()} })
}

// Negative controls for the fault runs: a store with a flaw that breaks
// exclusion or fences is caught in at least 95% of short runs. Twelve
// contenders: with six, expire-early (seen only by a section that holds
// between 3/4 and 9/10 of the TTL without renewing while another client
// waits) went unseen in about one run in 40, and a CI run missed it once
// in 10; with twelve, 120 runs each found it at least twice.
func TestFaultRunsCatchFlaws(t *testing.T) {
	const runs = 10 // all 10 must catch it: 95% of 10, rounded up
	for _, name := range []string{"expire-early", "repeat-fence", "release-ignores-token"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // mostly sleeping: sections and faults
			conformance.RequireCaught(t, name, runs, func(seed uint64) []string {
				store := NewStore()
				flawSwitches[name](&store.flaws)
				return conformance.FaultRun(t, harness{store}, seed, conformance.FaultDuration(5*time.Second), conformance.FaultContenders(12))
			})
		})
	}
}
