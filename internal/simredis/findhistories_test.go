package simredis

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock/internal/flawpatch"
	"github.com/distlock/lock/internal/simtest"
)

// historyEnv marks the child processes of TestSimFindsHistories, each a
// test binary with one history's flaw compiled in.
const historyEnv = "LOCK_SIMREDIS_HISTORY"

// TestSimFindsHistories re-creates each history (histories_test.go) in a
// copy of the code, one at a time, and requires the simulation to find it
// within its CI budget of seeds: a child test binary built with the flaw
// (flawpatch, through -overlay: the production files are never written)
// runs TestSimRedis or TestSimRedlock with -simwant, which stops at the
// first seed with the violation the history causes. It logs a table of
// the seeds each history took.
func TestSimFindsHistories(t *testing.T) {
	if os.Getenv(historyEnv) != "" {
		t.Skip("the child runs only the simulation")
	}
	b := flawpatch.NewBuilder()
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	var flaws []flawpatch.Flaw
	for _, h := range histories {
		flaws = append(flaws, h.flaw)
	}
	b.Prepare(flaws...) // one build at a time, ahead of the runs
	found := regexp.MustCompile(`FOUND .* after (\d+) seeds \(seed (\d+)\): (.*)`)
	var table []string
	for _, h := range histories {
		t.Run(h.name, func(t *testing.T) {
			test, budget := "TestSimRedis", redisBudget
			if h.model == "redlock" {
				test, budget = "TestSimRedlock", redlockBudget
			}
			if b := simtest.Budget(0); b > 0 {
				budget = b // -simseeds
			}
			// Within the CI budget: the seeds a history takes vary a
			// lot from run to run (X3 took 36, 50, 85 and 159), and the
			// budget is set for the slowest; the table says how many
			// each took.
			bin := b.Binary(t, h.flaw)
			start := time.Now()
			cmd := exec.Command(bin, "-test.run=^"+test+"$", "-test.count=1", "-test.v", "-test.timeout=20m",
				fmt.Sprintf("-simseeds=%d", budget), "-simwant="+h.want)
			cmd.Env = append(os.Environ(), historyEnv+"="+h.flaw.Name)
			out, err := cmd.CombinedOutput()
			m := found.FindSubmatch(out)
			if m == nil {
				t.Fatalf("not found by %s in %d seeds (want a violation with %q; the child: %v):\n%s", test, budget, h.want, err, tail(out, 40))
			}
			line := fmt.Sprintf("%-50s %-14s seeds to the first failure: %4s of %d (seed %s, %v)", h.name, test, m[1], budget, m[2], time.Since(start).Round(time.Second))
			table = append(table, line)
			t.Log(line)
			t.Logf("the violation: %.400s", m[3])
		})
	}
	t.Log("the histories and the seeds to their first failure:\n  " + strings.Join(table, "\n  "))
}

// tail returns the last n lines of out.
func tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
