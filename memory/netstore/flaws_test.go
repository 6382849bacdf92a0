package netstore_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/distlock/lock/internal/flawpatch"
)

// libFlawEnv names, in the child process of TestSuiteCatchesLibraryFlaws,
// the bug of package lock compiled into the child; it is empty in every
// normal run.
const libFlawEnv = "LOCK_NETSTORE_LIBFLAW"

// libFlaws are the bugs of package lock that need a store outside the
// process to show: the client's queue of goroutines per key, and renewals
// over a network. Each is an edit of package lock's source that
// flawpatch.Build compiles into a child test binary (see memory's
// TestSuiteCatchesFlaws for why that proves what a switch did); the edit's
// old text must be found exactly once, or the test fails naming the flaw
// and the file.
var libFlaws = map[string]struct {
	edit flawpatch.Edit
	kase string // the conformance case that must catch it
}{
	// A renewal that finds the lock gone takes it again.
	"watchdog-reacquires": {flawpatch.Edit{File: "renew.go",
		Old: "\tif err != nil {\n\t\tif errors.Is(err, ErrNotHeld) {\n\t\t\tl.endLocked(stateLost, fmt.Errorf(\"%w: the store no longer holds it for this owner",
		New: "\tif err != nil && errors.Is(err, ErrNotHeld) {\n\t\tif g2, err2 := l.c.b.Acquire(ctx, l.key, newToken(), l.v.ttl); err2 == nil {\n\t\t\tg, err = g2, nil\n\t\t}\n\t}\n" +
			"\tif err != nil {\n\t\tif errors.Is(err, ErrNotHeld) {\n\t\t\tl.endLocked(stateLost, fmt.Errorf(\"%w: the store no longer holds it for this owner",
	}, "StoreLosesLock"},
	// An Acquire cancelled in the client's queue stays in it.
	"cancel-keeps-turn": {flawpatch.Edit{File: "local.go",
		Old: "\tcase <-ctx.Done():\n\t}\n\tsh.mu.Lock()\n",
		New: "\tcase <-ctx.Done():\n\t}\n\treturn nil, nil, ctx.Err()\n\tsh.mu.Lock()\n",
	}, "CancelInQueue"},
	// A lease handed over ahead of the store is valid until the previous
	// holder's deadline, whatever its own TTL.
	"handover-prev-deadline": {flawpatch.Edit{File: "validity.go",
		Old: "if !v.inherited.IsZero() && v.inherited.Before(d) {",
		New: "if !v.inherited.IsZero() {",
	}, "DeadlineWithinStore"},
	// A handover of unknown outcome ends the new lease but frees neither
	// token.
	"handover-unknown-keeps": {flawpatch.Edit{File: "handover.go",
		Old: "\t\tl.c.cleanup(ctx, l.key, from, l.v.ttl, nil)\n",
		New: "\t\treturn\n\t\tl.c.cleanup(ctx, l.key, from, l.v.ttl, nil)\n",
	}, "HandoverFails"},
}

// logLibFlaw says, in the child, which bug it was built with.
func logLibFlaw(t *testing.T) {
	if name := os.Getenv(libFlawEnv); name != "" {
		t.Logf("running with the deliberate flaw %q compiled into package lock", name)
	}
}

// TestSuiteCatchesLibraryFlaws runs the case aimed at each bug, in a child
// test binary built with the bug, and checks that it fails.
func TestSuiteCatchesLibraryFlaws(t *testing.T) {
	if os.Getenv(libFlawEnv) != "" {
		return // the child runs only TestConformance
	}
	for name, f := range libFlaws {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bin := flawpatch.Build(t, flawpatch.Flaw{Name: name, Edits: []flawpatch.Edit{f.edit}})
			cmd := exec.Command(bin, "-test.run=^TestConformance$/^"+f.kase+"$", "-test.v", "-test.count=1", "-test.timeout=2m")
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

// TestLibraryFlawsApply checks at once that every flaw still applies to
// package lock's source, as TestSuiteCatchesLibraryFlaws does before it
// builds.
func TestLibraryFlawsApply(t *testing.T) {
	root, err := flawpatch.ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range libFlaws {
		if _, err := flawpatch.Apply(root, flawpatch.Flaw{Name: name, Edits: []flawpatch.Edit{f.edit}}); err != nil {
			t.Error(err)
		}
	}
}
