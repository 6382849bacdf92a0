package fencesql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/distlock/lock/fence"
	"github.com/distlock/lock/internal/fencerule"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// openSQLite opens a new SQLite database file with the settings fence.Table.Apply
// asks for: BEGIN IMMEDIATE and a busy timeout.
func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fence.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate&_busy_timeout=20000&_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(4)
	var version string
	if err := db.QueryRow(`SELECT sqlite_version()`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	t.Logf("SQLite %s", version)
	return db
}

func TestSQLite(t *testing.T) {
	db := openSQLite(t)
	testTable(t, db, fence.SQLite)
}

// testTable runs the tests every dialect passes, on db.
func testTable(t *testing.T, db *sql.DB, d fence.Dialect) {
	t.Run("rule", func(t *testing.T) { testTableRule(t, db, d) })
	t.Run("rollback on stale leaves the write out", func(t *testing.T) { testRollback(t, db, d) })
	t.Run("bad input", func(t *testing.T) { testTableBadInput(t, db, d) })
	t.Run("race", func(t *testing.T) {
		tbl := newTable(t, db, d, "fences_race")
		workers, rounds := 4, 60
		if d == fence.Postgres {
			workers, rounds = 8, 60
		}
		r := race(t, db, d, tbl, workers, rounds)
		t.Logf("%d committed, %d refused, %d stale fences accepted, %d lost updates", r.committed, r.refused, r.staleAccepted, r.lost)
		if r.lost != 0 || r.staleAccepted != 0 {
			t.Errorf("%d writes committed after a newer fence's; %d fences known to be stale accepted; want 0 and 0", r.lost, r.staleAccepted)
		}
		if r.refused == 0 {
			t.Errorf("no fence refused: the race did not race")
		}
	})
	// The negative control: the same race through the upsert without its
	// WHERE clause must lose updates, or the race above proves nothing.
	t.Run("race without the WHERE clause loses updates", func(t *testing.T) {
		tbl := newTable(t, db, d, "fences_unfenced")
		r := race(t, db, d, unfenced{tbl.Name(), d}, 4, 20)
		t.Logf("%d committed, %d refused, %d stale fences accepted, %d lost updates", r.committed, r.refused, r.staleAccepted, r.lost)
		if r.lost == 0 || r.staleAccepted == 0 {
			t.Errorf("%d lost updates, %d stale fences accepted without the fence check; want both > 0", r.lost, r.staleAccepted)
		}
	})
}

// q writes a test statement, written with $1 placeholders, in dialect d
// (SQLite reads ?1 as the first argument).
func q(d fence.Dialect, query string) string {
	if d == fence.SQLite {
		return strings.ReplaceAll(query, "$", "?")
	}
	return query
}

func newTable(t *testing.T, db *sql.DB, d fence.Dialect, name string) *fence.Table {
	t.Helper()
	tbl, err := fence.NewTable(d, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := tbl.Create(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return tbl
}

// applier is what race writes through: a fence.Table, or the unfenced
// upsert of the negative control.
type applier interface {
	Apply(ctx context.Context, tx *sql.Tx, resource string, f uint64, holder string) error
	Name() string
}

// unfenced is fence.Table's upsert without its WHERE clause: every fence
// is accepted, the newest write or not.
type unfenced struct {
	name string
	d    fence.Dialect
}

func (u unfenced) Name() string { return u.name }

func (u unfenced) Apply(ctx context.Context, tx *sql.Tx, resource string, f uint64, holder string) error {
	_, err := tx.ExecContext(ctx, q(u.d, "INSERT INTO "+u.name+" AS f (resource, fence, holder) VALUES ($1, $2, $3)"+
		" ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, holder = excluded.holder"), resource, int64(f), holder)
	return err
}

// offer applies one fence in a transaction of its own, committed when
// accepted.
func offer(ctx context.Context, db *sql.DB, tbl *fence.Table, resource string, fence uint64, holder string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := tbl.Apply(ctx, tx, resource, fence, holder); err != nil {
		return err
	}
	return tx.Commit()
}

func testTableRule(t *testing.T, db *sql.DB, d fence.Dialect) {
	tbl := newTable(t, db, d, "fences_rule")
	for _, s := range fencerule.Steps {
		t.Run(s.Name, func(t *testing.T) {
			fencerule.Check(t, offer(context.Background(), db, tbl, s.Resource, s.Fence, s.Holder), s.Want)
		})
	}
	// The same lease writing twice in one transaction.
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for i := range 2 {
		if err := tbl.Apply(ctx, tx, "r3", 4, "e"); err != nil {
			t.Fatalf("apply %d of the same fence and holder in one transaction: %v", i+1, err)
		}
	}
}

func testRollback(t *testing.T, db *sql.DB, d fence.Dialect) {
	ctx := context.Background()
	tbl := newTable(t, db, d, "fences_rollback")
	if _, err := db.ExecContext(ctx, `CREATE TABLE rollback_data (v TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := offer(ctx, db, tbl, "doc", 6, "new"); err != nil {
		t.Fatal(err)
	}
	// The late holder writes first and applies its fence after: the
	// rollback takes the write out.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, q(d, `INSERT INTO rollback_data VALUES ($1)`), "late write"); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Apply(ctx, tx, "doc", 5, "old"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("fence 5 after 6: %v; want fence.ErrStale", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM rollback_data`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows after the rollback; want 0", n)
	}
	// The table still holds fence 6 from "new".
	if err := offer(ctx, db, tbl, "doc", 6, "new"); err != nil {
		t.Fatalf("fence 6 from its holder again: %v", err)
	}
}

func testTableBadInput(t *testing.T, db *sql.DB, d fence.Dialect) {
	for _, c := range []struct {
		dialect fence.Dialect
		name    string
		want    string
	}{
		{0, "fences", "unknown Dialect(0); use Postgres or SQLite"},
		{d, "", `table name ""`},
		{d, "1fences", "not starting with a digit"},
		{d, "fences; DROP TABLE x", "letters, digits and underscores"},
		{d, `"fences"`, "letters, digits and underscores"},
		{d, "a.b.c", "letters, digits and underscores"},
		{d, strings.Repeat("f", 64), "at most 63 bytes"},
	} {
		if _, err := fence.NewTable(c.dialect, c.name); !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("fence.NewTable(%v, %q): %v; want fence.ErrInvalid saying %q", c.dialect, c.name, err, c.want)
		}
	}
	for _, name := range []string{"fences", "_f", "app.fences_2", "F" + strings.Repeat("f", 62)} {
		if _, err := fence.NewTable(d, name); err != nil {
			t.Errorf("fence.NewTable(%v, %q): %v", d, name, err)
		}
	}

	ctx := context.Background()
	tbl := newTable(t, db, d, "fences_bad")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var nilCtx context.Context
	for _, c := range []struct {
		name     string
		ctx      context.Context
		tx       *sql.Tx
		resource string
		fence    uint64
		holder   string
		want     string
	}{
		{"fence 0", ctx, tx, "r", 0, "a", "fences start at 1"},
		{"fence beyond BIGINT", ctx, tx, "r", math.MaxInt64 + 1, "a", "does not fit a BIGINT column; fences are 1 to 9223372036854775807"},
		{"empty resource", ctx, tx, "", 9, "a", "resource is empty"},
		{"resource with NUL", ctx, tx, "r\x00", 9, "a", "contains a NUL byte"},
		{"empty holder", ctx, tx, "r", 9, "", "holder is empty"},
		{"nil transaction", ctx, nil, "r", 9, "a", "nil context or transaction"},
		{"nil context", nilCtx, tx, "r", 9, "a", "nil context or transaction"},
	} {
		if err := tbl.Apply(c.ctx, c.tx, c.resource, c.fence, c.holder); !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want fence.ErrInvalid saying %q", c.name, err, c.want)
		}
	}
	// Nothing reached the table, and the transaction is still usable.
	if err := tbl.Apply(ctx, tx, "r", 1, "a"); err != nil {
		t.Fatalf("fence 1 after bad input: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM fences_bad`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows, %v; want 1 row", n, err)
	}
}

type raceResult struct {
	committed     int64 // transactions that committed their write
	refused       int64 // Apply returned fence.ErrStale
	staleAccepted int64 // Apply accepted a fence known to be stale
	lost          int64 // writes committed after a write with a higher fence
}

// race runs workers goroutines, each running rounds of two transactions
// on one resource: one with a fresh fence (drawn from a counter, so the
// transactions arrive in any order) and one with a fence known to be stale
// (one below the highest committed, or equal to it from another holder).
// Each transaction applies its fence, then writes a row that counts as
// lost every write committed after a write with a higher fence.
func race(t *testing.T, db *sql.DB, d fence.Dialect, tbl applier, workers, rounds int) raceResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	data := tbl.Name() + "_data"
	for _, stmt := range []string{
		`CREATE TABLE ` + data + ` (id INTEGER PRIMARY KEY, last_fence BIGINT NOT NULL, writes BIGINT NOT NULL, lost BIGINT NOT NULL)`,
		`INSERT INTO ` + data + ` VALUES (1, 0, 0, 0)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	// In PostgreSQL at READ COMMITTED the UPDATE reads the row as the
	// last committed write left it, as the fence upsert does.
	update := q(d, `UPDATE `+data+` SET lost = lost + CASE WHEN last_fence > $1 THEN 1 ELSE 0 END, last_fence = $1, writes = writes + 1 WHERE id = 1`)
	write := func(f uint64, holder string) (bool, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return false, err
		}
		defer tx.Rollback()
		if err := tbl.Apply(ctx, tx, "account", f, holder); errors.Is(err, fence.ErrStale) {
			return false, nil
		} else if err != nil {
			return false, err
		}
		if _, err := tx.ExecContext(ctx, update, int64(f)); err != nil {
			return false, err
		}
		return true, tx.Commit()
	}

	var (
		r      raceResult
		next   atomic.Uint64 // fresh fences
		newest atomic.Uint64 // the highest fence committed
		wg     sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				f := next.Add(1)
				ok, err := write(f, fmt.Sprint("lease-", f))
				if err != nil {
					t.Errorf("fence %d: %v", f, err)
					return
				}
				if ok {
					atomic.AddInt64(&r.committed, 1)
					fencerule.Raise(&newest, f)
				} else {
					atomic.AddInt64(&r.refused, 1)
				}
				var stale bool
				if f, stale = fencerule.Stale(&newest, i); !stale {
					continue
				}
				ok, err = write(f, fmt.Sprint("late-", w))
				if err != nil {
					t.Errorf("stale fence %d: %v", f, err)
					return
				}
				if ok {
					atomic.AddInt64(&r.committed, 1)
					atomic.AddInt64(&r.staleAccepted, 1)
				} else {
					atomic.AddInt64(&r.refused, 1)
				}
			}
		})
	}
	wg.Wait()

	var lastFence, writes, fenceRow int64
	if err := db.QueryRowContext(ctx, `SELECT last_fence, writes, lost FROM `+data).Scan(&lastFence, &writes, &r.lost); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, q(d, `SELECT fence FROM `+tbl.Name()+` WHERE resource = $1`), "account").Scan(&fenceRow); err != nil {
		t.Fatal(err)
	}
	if writes != r.committed {
		t.Errorf("%d writes in the table; %d transactions committed", writes, r.committed)
	}
	if r.staleAccepted == 0 && (lastFence != int64(newest.Load()) || fenceRow != lastFence) {
		t.Errorf("the last write has fence %d, the fence table %d; want the highest committed, %d", lastFence, fenceRow, newest.Load())
	}
	return r
}
