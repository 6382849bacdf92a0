package pgbackend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distlock/lock/backend"
)

// A call that waits for a key's row lock returns when its context ends,
// with an error that wraps the context's, and the statement does not
// outlive it on the server: pgx closes the connection and sends a cancel
// request, so that the acquire never takes the lock once the row lock is
// free. (Should the cancel request come too late, the backend's dead
// tokens make package lock's cleanup release win: see the package doc.)
func TestCallWaitingForARowLockEndsWithItsContext(t *testing.T) {
	h, b := harnessAndBackend(t)
	ctx := context.Background()
	const key, token = "row-locked", "0123456789abcdef0123456789abcdef"
	if err := b.Release(ctx, key, "fedcba9876543210fedcba9876543210"); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release of a free key: %v; want ErrNotHeld (and the key's row)", err)
	}
	// Another session holds the key's row lock.
	conn, err := pgx.Connect(ctx, dsn(h.srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM distlock_locks WHERE key = $1 FOR UPDATE`, []byte(key)); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	began := time.Now()
	_, err = b.Acquire(actx, key, token, time.Minute)
	took := time.Since(began)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || took > 1300*time.Millisecond {
		t.Fatalf("Acquire waiting for the row lock: %v after %v; want DeadlineExceeded within a second of its 300ms deadline", err, took)
	}
	// Another session watches: a transaction sees pg_stat_activity as it
	// was when the transaction first read it.
	watcher, err := pgx.Connect(ctx, dsn(h.srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close(ctx)
	waiting := func() (n int) {
		if err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%distlock_acquire%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for deadline := time.Now().Add(5 * time.Second); waiting() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the abandoned acquire still runs on the server 5s after its context ended")
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if hd, err := b.(backend.Inspector).Inspect(ctx, key); err != nil || hd.Held {
		t.Fatalf("Inspect after the row lock was freed: %+v, %v; want the key free", hd, err)
	}
}
