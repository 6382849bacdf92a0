package netstore_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/distlock/lock/internal/libflaw"
)

// libFlawEnv names a deliberate bug of package lock for the child process
// that TestSuiteCatchesLibraryFlaws starts; it is empty in every normal run.
const libFlawEnv = "LOCK_NETSTORE_LIBFLAW"

// libFlaws are the bugs of package lock that need a store outside the
// process to show: the client's queue of goroutines per key, and renewals
// over a network.
var libFlaws = map[string]struct {
	on   *bool
	kase string // the conformance case that must catch it
}{
	"watchdog-reacquires":    {&libflaw.WatchdogReacquires, "StoreLosesLock"},
	"cancel-keeps-turn":      {&libflaw.CancelKeepsTurn, "CancelInQueue"},
	"handover-prev-deadline": {&libflaw.HandoverPrevDeadline, "DeadlineWithinStore"},
	"handover-unknown-keeps": {&libflaw.HandoverUnknownKeeps, "HandoverFails"},
}

// setLibFlaw turns on the bug named in the environment, in the child.
func setLibFlaw(t *testing.T) {
	name := os.Getenv(libFlawEnv)
	if name == "" {
		return
	}
	f, ok := libFlaws[name]
	if !ok {
		t.Fatalf("%s=%q: unknown flaw", libFlawEnv, name)
	}
	*f.on = true
	t.Logf("running with the deliberate flaw %q in package lock", name)
}

// TestSuiteCatchesLibraryFlaws runs the case aimed at each bug, in a child
// process with the bug switched on, and checks that it fails.
func TestSuiteCatchesLibraryFlaws(t *testing.T) {
	if os.Getenv(libFlawEnv) != "" {
		return // the child runs only TestConformance
	}
	for name, f := range libFlaws {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestConformance$/^"+f.kase+"$", "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), libFlawEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if _, ok := err.(*exec.ExitError); !ok {
				t.Fatalf("the child: %v; want it to fail\n%s", err, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestConformance/"+f.kase+" ") {
				t.Fatalf("flaw %s: case %s did not fail:\n%s", name, f.kase, out)
			}
		})
	}
}
