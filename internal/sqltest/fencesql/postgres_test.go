package fencesql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/distlock/lock/fence"
	"github.com/distlock/lock/internal/sqltest/pgtest"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestPostgres(t *testing.T) {
	db := pgtest.Start(t)
	testTable(t, db, fence.Postgres)
	t.Run("waiter decides on the row the holder left", func(t *testing.T) { testWaiter(t, db) })
}

// testWaiter holds a resource's row in one transaction (Apply done, not
// committed) while another transaction's Apply waits for the row lock, then
// ends the first transaction, at each isolation level of the waiter. It
// checks what fence.Table.Apply's documentation says of each level.
func testWaiter(t *testing.T, db *sql.DB) {
	tbl := newTable(t, db, fence.Postgres, "fences_wait")
	const (
		accepted      = "accepted"
		stale         = "fence.ErrStale"
		serialization = "serialization failure"
	)
	cases := []struct {
		name   string
		level  sql.IsolationLevel // the waiter's
		before uint64             // committed before both; 0: no row yet
		holder uint64             // applied by the transaction holding the row
		commit bool               // the holder commits (or rolls back)
		waiter uint64
		want   string
	}{
		{"read committed: newer fence committed, older refused", sql.LevelReadCommitted, 4, 6, true, 5, stale},
		{"read committed: same fence from another holder refused", sql.LevelReadCommitted, 4, 6, true, 6, stale},
		{"read committed: older fence committed, newer accepted", sql.LevelReadCommitted, 4, 6, true, 7, accepted},
		{"read committed: newer fence rolled back, older accepted", sql.LevelReadCommitted, 4, 6, false, 5, accepted},
		{"read committed: first insert committed, older refused", sql.LevelReadCommitted, 0, 6, true, 5, stale},
		{"read committed: first insert rolled back, older accepted", sql.LevelReadCommitted, 0, 6, false, 5, accepted},
		{"repeatable read: newer fence committed, serialization failure", sql.LevelRepeatableRead, 4, 6, true, 5, serialization},
		{"repeatable read: older fence committed, serialization failure", sql.LevelRepeatableRead, 4, 6, true, 7, serialization},
		{"repeatable read: newer fence rolled back, older accepted", sql.LevelRepeatableRead, 4, 6, false, 5, accepted},
		{"repeatable read: first insert committed, serialization failure", sql.LevelRepeatableRead, 0, 6, true, 7, serialization},
		{"serializable: older fence committed, serialization failure", sql.LevelSerializable, 4, 6, true, 7, serialization},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			resource := fmt.Sprint("wait-", i)
			if c.before > 0 {
				if err := offer(ctx, db, tbl, resource, c.before, "before"); err != nil {
					t.Fatal(err)
				}
			}
			holder, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback()
			if err := tbl.Apply(ctx, holder, resource, c.holder, "holder"); err != nil {
				t.Fatal(err)
			}

			waiter, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: c.level})
			if err != nil {
				t.Fatal(err)
			}
			defer waiter.Rollback()
			var pid int
			if err := waiter.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			result := make(chan error, 1)
			go func() { result <- tbl.Apply(ctx, waiter, resource, c.waiter, "waiter") }()

			// Wait until the waiter's Apply waits for the holder's lock:
			// PostgreSQL says so in pg_blocking_pids.
			for blocked := false; !blocked; {
				select {
				case err := <-result:
					t.Fatalf("the waiter's Apply returned before the holder ended: %v", err)
				default:
				}
				if err := db.QueryRowContext(ctx, `SELECT cardinality(pg_blocking_pids($1)) > 0`, pid).Scan(&blocked); err != nil {
					t.Fatal(err)
				}
			}

			if c.commit {
				err = holder.Commit()
			} else {
				err = holder.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
			err = <-result
			var pgErr *pgconn.PgError
			got := accepted
			switch {
			case errors.Is(err, fence.ErrStale):
				got = stale
			case errors.As(err, &pgErr) && pgErr.Code == "40001":
				got = serialization
			case err != nil:
				t.Fatalf("the waiter's Apply: %v", err)
			}
			if got != c.want {
				t.Fatalf("the waiter's Apply: %s (%v); want %s", got, err, c.want)
			}
			if got == accepted {
				if err := waiter.Commit(); err != nil {
					t.Fatal(err)
				}
				var f int64
				if err := db.QueryRowContext(ctx, `SELECT fence FROM fences_wait WHERE resource = $1`, resource).Scan(&f); err != nil || f != int64(c.waiter) {
					t.Fatalf("fence %d, %v after the waiter committed; want %d", f, err, c.waiter)
				}
			}
		})
	}
}
