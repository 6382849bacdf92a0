package pgbackend_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/distlock/lock/backend"
)

// Releases sweep tombstones past their time, of any key, so that the
// table of dead tokens does not grow without bound; live ones stay.
func TestReleasesSweepOldTombstones(t *testing.T) {
	h, b := harnessAndBackend(t)
	ctx := context.Background()
	count := func(c *pgx.Conn, where string) (n int) {
		if err := c.QueryRow(ctx, `SELECT count(*) FROM distlock_dead_tokens WHERE `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// 20 tombstones of other keys whose time is up.
	err := withConn(ctx, h.srv.Addr, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `INSERT INTO distlock_dead_tokens (key, token, freed, dead_until)
			SELECT convert_to('old/' || i, 'UTF8'), 'token' || i, true, clock_timestamp() - interval '1 second'
			FROM generate_series(1, 20) i`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		token := fmt.Sprintf("%032x", i+1)
		if err := b.Release(ctx, "sweeper", token); !errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("Release: %v; want ErrNotHeld", err)
		}
	}
	err = withConn(ctx, h.srv.Addr, func(c *pgx.Conn) error {
		if old, live := count(c, `dead_until < clock_timestamp()`), count(c, `dead_until >= clock_timestamp()`); old != 0 || live != 3 {
			t.Errorf("after 3 releases: %d tombstones past their time, %d live; want 0 and 3 (up to 8 swept per release)", old, live)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "sweeper", fmt.Sprintf("%032x", 1), backend.MinDeadTokenTTL); !errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("Acquire with a token released just before: %v; want ErrInvalid (its tombstone is live)", err)
	}
}

// harnessAndBackend starts a server with the conformance harness and
// returns the harness and a backend of it, closed at the test's end: the
// set-up of this package's own tests.
func harnessAndBackend(t *testing.T) (*harness, backend.Backend) {
	h := newHarness(t).(*harness)
	b, err := h.NewBackend(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return h, b
}
