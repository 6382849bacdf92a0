package redis_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// plainClient builds a go-redis client as the README's example does: no
// ContextTimeoutEnabled, go-redis's default retries and timeouts. (Its
// maintenance notifications are off only because their goroutine outlives
// Close in go-redis v9.23.)
func plainClient(t *testing.T, addr string) *goredis.Client {
	rdb := goredis.NewClient(&goredis.Options{
		Addr:                     addr,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// endsWith runs call and fails t unless it returns an error wrapping want
// within bound, far less than go-redis's 3s read timeout that a hung server
// otherwise costs.
func endsWith(t *testing.T, what string, want error, call func() error) {
	t.Helper()
	const bound = 2 * time.Second
	start := time.Now()
	err := call()
	if took := time.Since(start); took > bound {
		t.Errorf("%s on a hung server took %v; want its context to end it within %v", what, took.Round(time.Millisecond), bound)
	}
	if !errors.Is(err, want) {
		t.Errorf("%s on a hung server: %v; want %v", what, err, want)
	}
}

// Contexts bound every call, however the user built the go-redis client:
// with a hung server (SIGSTOP), a call under a 300ms deadline, or with a
// context cancelled after 300ms, returns then.
func TestCallsEndWithTheirContextWhateverTheClient(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client func(t *testing.T, addr string) *goredis.Client
	}{
		{"plain client", plainClient},
		{"ContextTimeoutEnabled", func(t *testing.T, addr string) *goredis.Client { return newGoRedis(t, addr) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.NoPersistence)
			b := redis.New(tc.client(t, srv.Addr))
			locks := newLocks(t, b, lock.WithAutoRenew(false))
			ctx := context.Background()
			l, err := locks.TryAcquire(ctx, "held") // a live connection, and the scripts cached
			if err != nil {
				t.Fatal(err)
			}
			srv.Stop()
			t.Cleanup(srv.Continue) // before the clients close, which wait for their cleanups
			deadline := func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(ctx, 300*time.Millisecond)
			}
			cancelled := func() (context.Context, context.CancelFunc) {
				c, cancel := context.WithCancel(ctx)
				time.AfterFunc(300*time.Millisecond, cancel)
				return c, cancel
			}
			for _, c := range []struct {
				name string
				ctx  func() (context.Context, context.CancelFunc)
				want error
			}{{"deadline", deadline, context.DeadlineExceeded}, {"cancelled", cancelled, context.Canceled}} {
				if c.name == "deadline" && tc.name == "ContextTimeoutEnabled" {
					continue // go-redis ends these itself
				}
				endsWith(t, "Acquire, "+c.name, c.want, func() error {
					actx, cancel := c.ctx()
					defer cancel()
					_, err := locks.Acquire(actx, "k")
					return err
				})
				endsWith(t, "Renew, "+c.name, c.want, func() error {
					actx, cancel := c.ctx()
					defer cancel()
					_, err := b.Renew(actx, "held", l.Token(), time.Second)
					return err
				})
				endsWith(t, "Release, "+c.name, c.want, func() error {
					actx, cancel := c.ctx()
					defer cancel()
					return b.Release(actx, "other", "0123456789abcdef0123456789abcdef")
				})
				endsWith(t, "Inspect, "+c.name, c.want, func() error {
					actx, cancel := c.ctx()
					defer cancel()
					_, err := b.Inspect(actx, "k")
					return err
				})
			}
		})
	}
}

// The node timeout bounds every Redlock node's request, also over clients
// built without ContextTimeoutEnabled: with two of three nodes hung, an
// attempt fails after about the node timeout, not go-redis's read timeout.
func TestRedlockNodeTimeoutBoundsPlainClients(t *testing.T) {
	srvs := startN(t, 3, redistest.NoPersistence)
	var nodes []redis.Conn
	for _, s := range srvs {
		nodes = append(nodes, plainClient(t, s.Addr))
	}
	r, err := redis.NewRedlock(nodes, redis.WithNodeTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	locks := newLocks(t, r, lock.WithAutoRenew(false))
	ctx := context.Background()
	warmUp(t, locks)
	for _, s := range srvs[:2] {
		s.Stop()
		t.Cleanup(s.Continue)
	}
	start := time.Now()
	_, err = locks.TryAcquire(ctx, "k")
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("TryAcquire with 2 of 3 nodes hung took %v; want about the 200ms node timeout", took.Round(time.Millisecond))
	}
	if err == nil || errors.Is(err, lock.ErrLocked) {
		t.Errorf("TryAcquire with 2 of 3 nodes hung: %v; want a quorum error", err)
	}
	// The caller's context did not end: the error must not say it did
	// (a caller tells "my time ran out" from "the store failed" so).
	if errors.Is(err, context.DeadlineExceeded) || !strings.Contains(fmt.Sprint(err), "no answer within the node timeout") {
		t.Errorf("TryAcquire with 2 of 3 nodes hung, without a deadline: %v; want the node timeout named, not context.DeadlineExceeded", err)
	}
}

// closedPort returns a loopback address where nothing listens.
func closedPort(t *testing.T) string { return closedPorts(t, 1)[0] }

// closedPorts returns n distinct loopback addresses nothing listens on:
// all are held open until the last is chosen, so that the kernel cannot
// hand one port out twice.
func closedPorts(t *testing.T, n int) []string {
	var addrs []string
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		addrs = append(addrs, l.Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	return addrs
}

// A backend opened from a URL reports an unreachable server at once, even
// for a call whose context has no deadline, and its Close (which waits for
// the cleanup of the failed attempt) does not linger: go-redis's default
// five dials per attempt, three attempts, took 1.6s for each.
func TestOpenedURLFailsFastWhenRefused(t *testing.T) {
	addrs := closedPorts(t, 3)
	for _, u := range []string{"redis://" + addrs[0], "redlock://" + strings.Join(addrs, ",")} {
		ctx := context.Background()
		locks, err := lock.Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = locks.TryAcquire(ctx, "k")
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s: TryAcquire took %v; want a refused connection reported within 1s", u, took.Round(time.Millisecond))
		}
		if err == nil || errors.Is(err, lock.ErrLocked) {
			t.Errorf("%s: TryAcquire: %v; want the connection error", u, err)
		}
		t.Logf("%s: TryAcquire reported %v after %v", u, err, time.Since(start).Round(time.Millisecond))
		start = time.Now()
		locks.Close()
		t.Logf("%s: Close took %v", u, time.Since(start).Round(time.Millisecond))
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s: Close took %v; want within 1s", u, took.Round(time.Millisecond))
		}
	}
}
