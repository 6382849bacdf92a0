package migratetest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/fence"
	"github.com/distlock/lock/internal/sqltest/pgtest"
	"github.com/distlock/lock/migrate"
)

// rollHarness is one step of a rolling cutover from redis-server to an
// etcd member, for the conformance fault runs: its backends alternate
// between two phases, so that the run's contenders are instances of both
// contending on the same keys, each under its phase's fence epoch
// (conformance.ClientOptioner), with the faults of the fault runs (replies
// lost and late, a store paused, a client cut off, helper processes of the
// later phase stopped with SIGSTOP past their TTL), a fenced resource in
// PostgreSQL (fence.Table) beside the run's fence.Guard, and the history
// check. The servers are the whole cutover's: fences carry on from step
// to step, as in a deployment.
type rollHarness struct {
	*confHarness
	phases [2]migrate.Phase
	db     *sql.DB

	mu     sync.Mutex
	made   int
	epochs map[backend.Backend]uint64
}

var (
	_ conformance.ClientOptioner    = (*rollHarness)(nil)
	_ conformance.SQLResourcer      = (*rollHarness)(nil)
	_ conformance.ProcessContenders = (*rollHarness)(nil)
)

func (h *rollHarness) NewBackend(ctx context.Context) (backend.Backend, error) {
	h.mu.Lock()
	p := h.phases[h.made%2]
	h.made++
	h.mu.Unlock()
	b, err := h.newBackendOf(ctx, p)
	if err != nil {
		return nil, err
	}
	epoch := uint64(0)
	if p >= migrate.BothToFences {
		epoch = 1
	}
	h.mu.Lock()
	h.epochs[b] = epoch
	h.mu.Unlock()
	return b, nil
}

// ClientOptions gives each backend its phase's fence epoch.
func (h *rollHarness) ClientOptions(b backend.Backend) []lock.Option {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.epochs[b]
	if !ok {
		h.t.Errorf("ClientOptions for a backend the harness did not make: %T", b)
	}
	return []lock.Option{lock.WithFenceEpoch(e)}
}

func (h *rollHarness) SQLResource(*testing.T) (*sql.DB, fence.Dialect) { return h.db, fence.Postgres }

// ContenderURL gives the helper processes the later phase's URL: the
// instances that the step starts.
func (h *rollHarness) ContenderURL(context.Context) (string, error) {
	return rollURL(h.redis.Addr, h.etcd.Addr, h.phases[1]), nil
}

// TestRollingCutover moves a deployment from Redis to etcd in three
// steps, phases 1 and 2, 2 and 3, 3 and 4, each a set of fault runs in
// which instances of both phases contend; no run may find two valid
// leases at once, a valid lease refused by a fenced resource (but for a
// fence of the older epoch after the epoch changed: migrate's doc), a
// late lost signal, or a history the lease-lock model rejects. Then the
// negative control: the same run with instances of phases 1 and 4, which
// share no store, must be flagged.
func TestRollingCutover(t *testing.T) {
	base := confNewHarness(t, migrate.BothFromFences)
	db := pgtest.Start(t)
	newRoll := func(t *testing.T, a, b migrate.Phase) *rollHarness {
		// The servers are the cutover's; each run's clients and
		// proxies belong to its own t.
		h := &confHarness{t: t, phase: base.phase, redis: base.redis, etcd: base.etcd, caps: base.caps}
		return &rollHarness{confHarness: h, phases: [2]migrate.Phase{a, b}, db: db, epochs: map[backend.Backend]uint64{}}
	}
	for _, step := range [][2]migrate.Phase{{1, 2}, {2, 3}, {3, 4}} {
		t.Run(fmt.Sprintf("phases%dand%d", step[0], step[1]), func(t *testing.T) {
			conformance.RunFaults(t, func(t *testing.T) conformance.Harness { return newRoll(t, step[0], step[1]) },
				conformance.FaultRuns(3))
		})
	}
	t.Run("negative control: phases 1 and 4", func(t *testing.T) {
		var flagged []string
		for seed := uint64(1); seed <= 3 && len(flagged) == 0; seed++ {
			for _, v := range conformance.FaultRun(t, newRoll(t, 1, 4), seed, conformance.FaultProcesses(0)) {
				if strings.Contains(v, "overlap on") {
					flagged = append(flagged, v)
				}
			}
		}
		if len(flagged) == 0 {
			t.Fatal("instances of phases 1 and 4 (old store only beside new store only) ran 3 fault runs with no overlap flagged; the test cannot see the double holders it exists to catch")
		}
		t.Logf("flagged, as it must be: %s (and %d more)", flagged[0], len(flagged)-1)
	})
}
