// The conformance harness of the worked example: all the glue a backend
// author writes to run the suite against a real PostgreSQL server.
package pgbackend_test

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/conformance/serverproc"
	"github.com/distlock/lock/internal/sqltest/pgbackend"
	"github.com/distlock/lock/internal/sqltest/pgtest"
)

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness, conformance.RequireHooks())
}

// maxTTL is above every TTL the suite asks for (ManyKeys holds its
// 10,000 locks for 2m).
const maxTTL = 10 * time.Minute

// harness is one PostgreSQL server in a process of its own (serverproc),
// with the default durability settings (fsync and synchronous_commit on).
// Every backend reaches it through two fault proxies of its own, between
// which its pool spreads its connections: faultproxy.Hooks turns them into
// the network hooks, LinkDelayer included.
type harness struct {
	faultproxy.Hooks
	t   *testing.T
	db  pgtest.Cluster // initdb's work: see package pgtest
	srv *serverproc.Process
}

// newHarness starts the server as the user the cluster belongs to
// (nobody when the test runs as root: postgres refuses root). It needs no
// AfterKill: Kill waits until every process of the server is gone, so a
// new postmaster finds the pid in the old postmaster.pid free and removes
// the file itself.
func newHarness(t *testing.T) conformance.Harness {
	h := &harness{t: t, db: pgtest.InitDB(t)}
	h.srv = serverproc.Start(t, []string{filepath.Join(h.db.Bin, "postgres"), "-D", h.db.Data,
		"-p", serverproc.PortPlaceholder, "-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=", "-c", "max_connections=300"},
		serverproc.Options{User: h.db.User, Dir: h.db.Dir, Ready: func(addr string) bool {
			// A real question: PostgreSQL accepts connections while
			// it starts up or recovers, and refuses to serve them.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			return withConn(ctx, addr, func(c *pgx.Conn) error { return c.Ping(ctx) }) == nil
		}})
	h.createSchema()
	return h
}

func dsn(addr string) string { return "postgres://postgres@" + addr + "/postgres?sslmode=disable" }

// withConn runs f on a connection of its own to the server at addr.
func withConn(ctx context.Context, addr string, f func(*pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, dsn(addr))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return f(conn)
}

func (h *harness) createSchema() {
	ctx := context.Background()
	if err := withConn(ctx, h.srv.Addr, func(c *pgx.Conn) error { return pgbackend.CreateSchema(ctx, c) }); err != nil {
		h.t.Fatal(err)
	}
}

// proxied closes its pool and proxies with the backend, as the exit of
// its process would.
type proxied struct {
	*pgbackend.Backend
	h    *harness
	pool *pgxpool.Pool
	pxs  [2]*faultproxy.Proxy
}

func (p *proxied) Close() error {
	err := p.Backend.Close()
	p.pool.Close()
	p.pxs[0].Close()
	p.pxs[1].Close()
	p.h.Forget(p)
	return err
}

func (h *harness) NewBackend(ctx context.Context) (backend.Backend, error) {
	pxs := [2]*faultproxy.Proxy{faultproxy.Start(h.t, h.srv.Addr), faultproxy.Start(h.t, h.srv.Addr)}
	cfg, err := pgxpool.ParseConfig(dsn(pxs[0].Addr))
	if err != nil {
		return nil, err
	}
	var n atomic.Int64 // connections alternate between the two proxies
	cfg.ConnConfig.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
		return new(net.Dialer).DialContext(ctx, "tcp", pxs[n.Add(1)%2].Addr)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	b, err := pgbackend.New(pool, pgbackend.WithMaxTTL(maxTTL))
	if err != nil {
		pool.Close()
		return nil, err
	}
	p := &proxied{Backend: b, h: h, pool: pool, pxs: pxs}
	h.Add(p, pxs[0], pxs[1])
	return p, nil
}

func (h *harness) Capabilities() backend.Capabilities {
	b, err := pgbackend.New(nil, pgbackend.WithMaxTTL(maxTTL)) // Capabilities sends nothing
	if err != nil {
		h.t.Fatal(err)
	}
	return b.Capabilities()
}

func (h *harness) Pause(context.Context) error  { h.srv.Stop(); return nil }
func (h *harness) Resume(context.Context) error { h.srv.Continue(); return nil }

// Restart kills the server with SIGKILL and starts it again: on the same
// data directory, which crash recovery replays, or on a new one.
func (h *harness) Restart(_ context.Context, keepData bool) error {
	if !keepData {
		h.srv.Kill()
		h.db.Reinit(h.t)
	}
	h.srv.Restart()
	if !keepData {
		h.createSchema()
	}
	return nil
}

// Evict ends the lock on key as its expiry would (conformance.Evicter):
// no tombstone, and the fence counter stays.
func (h *harness) Evict(ctx context.Context, key string) error {
	return withConn(ctx, h.srv.Addr, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `UPDATE distlock_locks SET expires = clock_timestamp() WHERE key = $1`, []byte(key))
		return err
	})
}
