// Package faultruns runs the conformance suite's fault runs with the SQL
// fenced resource (conformance.SQLResourcer): a fence.Table in SQLite,
// written through Apply in transactions, beside the in-memory fence.Guard
// that every backend's fault runs check. The suite imports no SQL driver;
// this module brings SQLite, so that no library module requires it.
package faultruns

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/fence"
	"github.com/distlock/lock/memory"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// harness is a memory store with the faults its Store offers (a pause, a
// restart) and a SQLite database for the fenced resource.
type harness struct {
	s  *memory.Store
	db **sql.DB // the SQL resource's database, once the run opened it
}

var (
	_ conformance.Pauser       = harness{}
	_ conformance.Restarter    = harness{}
	_ conformance.SQLResourcer = harness{}
)

func (h harness) NewBackend(context.Context) (backend.Backend, error) { return h.s.NewBackend(), nil }

func (h harness) Capabilities() backend.Capabilities { return h.s.NewBackend().Capabilities() }

func (h harness) Pause(context.Context) error  { h.s.Pause(); return nil }
func (h harness) Resume(context.Context) error { h.s.Resume(); return nil }

func (h harness) Restart(_ context.Context, keepData bool) error {
	mode := memory.LoseData
	if keepData {
		mode = memory.KeepData
	}
	h.s.Restart(mode)
	return nil
}

// SQLResource opens a SQLite database in the test's directory: immediate
// transactions (a writer takes the lock at BEGIN, so concurrent Applies
// queue instead of failing) and a busy timeout long enough for the runs'
// contention.
func (h harness) SQLResource(t *testing.T) (*sql.DB, fence.Dialect) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "fenced.db")+"?_txlock=immediate&_busy_timeout=20000&_journal_mode=WAL")
	if err != nil {
		t.Fatalf("SQLite: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	t.Cleanup(func() { // before the Close above: cleanups run last first
		var rows int
		if err := db.QueryRow("SELECT count(*) FROM lock_conformance_fences").Scan(&rows); err != nil || rows == 0 {
			t.Errorf("the fault run wrote no fence to its SQL resource: %d rows, %v", rows, err)
		}
	})
	*h.db = db
	return db, fence.SQLite
}

// TestFaultRunsWithSQL: randomized fault runs on the memory store, every
// write of every section also applied to the SQLite fence table; the runs
// fail if the table refuses a valid lease's fence. Each run's table must
// have taken writes: a run that never used it would prove nothing.
func TestFaultRunsWithSQL(t *testing.T) {
	conformance.RunFaults(t, func(t *testing.T) conformance.Harness {
		h := harness{s: memory.NewStore(), db: new(*sql.DB)}
		t.Cleanup(func() {
			if *h.db == nil {
				t.Errorf("the fault run never asked for its SQL resource")
			}
		})
		return h
	})
}
