package migratetest

import (
	"testing"

	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/migrate"
)

// TestConformance runs the suite over phases 2 and 3 of a move from
// redis-server to an etcd member (confHarness), with every hook.
func TestConformance(t *testing.T) {
	for _, phase := range []migrate.Phase{migrate.BothFromFences, migrate.BothToFences} {
		t.Run(confPhaseName(phase), func(t *testing.T) {
			conformance.Run(t, func(t *testing.T) conformance.Harness { return confNewHarness(t, phase) },
				conformance.RequireHooks())
		})
	}
}

// TestFaultRuns makes the seeded fault runs over phases 2 and 3, with
// contenders in helper processes too (see confProcHarness).
func TestFaultRuns(t *testing.T) {
	t.Run(confPhaseName(migrate.BothFromFences), func(t *testing.T) {
		conformance.RunFaults(t, func(t *testing.T) conformance.Harness {
			return confProcHarness{confNewHarness(t, migrate.BothFromFences)}
		})
	})
	t.Run(confPhaseName(migrate.BothToFences), func(t *testing.T) {
		conformance.RunFaults(t, func(t *testing.T) conformance.Harness {
			return confProcHarness{confNewHarness(t, migrate.BothToFences)}
		})
	})
}

func confPhaseName(p migrate.Phase) string {
	if p == migrate.BothFromFences {
		return "phase2"
	}
	return "phase3"
}
