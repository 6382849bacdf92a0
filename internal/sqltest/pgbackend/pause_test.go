package pgbackend_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pause stops every process of the server, also the backends that serve
// open connections (they leave the postmaster's process group): a query
// on a connection opened before gets no answer until Resume.
func TestPauseStopsOpenSessions(t *testing.T) {
	h := newHarness(t).(*harness)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn(h.srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	h.Pause(ctx)
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = conn.Ping(pctx)
	cancel()
	h.Resume(ctx)
	if err == nil {
		t.Fatal("an open session of a paused server answered")
	}
	conn2, err := pgx.Connect(ctx, dsn(h.srv.Addr))
	if err != nil {
		t.Fatalf("after Resume: %v", err)
	}
	defer conn2.Close(ctx)
	if err := conn2.Ping(ctx); err != nil {
		t.Fatalf("after Resume: %v", err)
	}
}
