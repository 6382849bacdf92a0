package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// The single-deployment backend has a maximum TTL, DefaultMaxTTL unless
// WithMaxTTL says otherwise. Package lock refuses a longer TTL before it
// sends anything; the backend refuses one itself, on every call that takes
// a TTL (for callers without package lock); a maximum out of range makes
// every such call fail, saying why, since New cannot. None of them writes
// anything.
func TestMaxTTL(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	rdb := newGoRedis(t, srv.Addr)
	b := redis.New(rdb)
	defer b.Close()
	if redis.DefaultMaxTTL != lock.DefaultMaxTTL {
		t.Fatalf("redis.DefaultMaxTTL %v; want lock.DefaultMaxTTL, %v", redis.DefaultMaxTTL, lock.DefaultMaxTTL)
	}
	if got := b.Capabilities().MaxTTL; got != redis.DefaultMaxTTL {
		t.Fatalf("Capabilities().MaxTTL %v; want the default, %v", got, lock.DefaultMaxTTL)
	}
	locks := newLocks(t, redis.New(newGoRedis(t, srv.Addr)))
	if _, err := locks.TryAcquire(ctx, "k", lock.WithTTL(time.Hour)); !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") {
		t.Fatalf("TryAcquire with a TTL of 1h: %v; want ErrInvalidTTL naming the maximum 1m0s", err)
	}

	tooLong := redis.DefaultMaxTTL + time.Millisecond
	tok := newQueueToken()
	calls := map[string]func() error{
		"Acquire": func() error { _, err := b.Acquire(ctx, "k", tok, tooLong); return err },
		"Renew":   func() error { _, err := b.Renew(ctx, "k", tok, tooLong); return err },
		"Transfer": func() error {
			_, err := b.Transfer(ctx, "k", tok, newQueueToken(), tooLong, backend.TransferOptions{})
			return err
		},
		"a place's Acquire": func() error {
			q, err := b.Queue("k")
			if err != nil {
				return err
			}
			defer q.Close(false)
			_, err = q.Acquire(ctx, tok, tooLong)
			return err
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") {
			t.Errorf("%s with a TTL of %v: %v; want ErrInvalid naming the maximum", name, tooLong, err)
		}
	}
	nothingWritten := func(when string) {
		t.Helper()
		if left := keysLeft(t, rdb); len(left) != 0 {
			t.Fatalf("%s: the store holds %v; want nothing", when, left)
		}
	}
	nothingWritten("after the calls above the maximum")

	// Raised, the maximum lets a longer TTL through, and the store keeps
	// the lock that long.
	raised := newLocks(t, redis.New(newGoRedis(t, srv.Addr), redis.WithMaxTTL(time.Hour)), lock.WithTTL(time.Hour))
	l, err := raised.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("TryAcquire with a TTL of 1h under WithMaxTTL(1h): %v", err)
	}
	if pttl := rdb.PTTL(ctx, "lock:{k}").Val(); pttl < 59*time.Minute {
		t.Errorf("the lock expires in %v; want about 1h", pttl)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rdb.FlushAll(ctx)

	for _, d := range []time.Duration{0, -time.Second, redis.MinTTL - time.Millisecond, lock.MaxTTL + time.Second} {
		bad := redis.New(rdb, redis.WithMaxTTL(d))
		want := fmt.Sprintf("maximum TTL %v (WithMaxTTL) must be at least 10ms and at most 8760h0m0s", d)
		if _, err := bad.Acquire(ctx, "k", newQueueToken(), time.Second); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Acquire on a backend with WithMaxTTL(%v): %v; want ErrInvalid saying %q", d, err, want)
		}
		// Through package lock: refused by lock.New (the default TTL is
		// above the maximum) or by the backend.
		if c, err := lock.New(bad); err != nil {
			if !errors.Is(err, lock.ErrInvalid) {
				t.Errorf("lock.New over WithMaxTTL(%v): %v; want ErrInvalid", d, err)
			}
		} else {
			if _, err := c.TryAcquire(ctx, "k", lock.WithTTL(time.Second)); !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), want) {
				t.Errorf("TryAcquire over WithMaxTTL(%v): %v; want ErrInvalid saying %q", d, err, want)
			}
			c.Close()
		}
		bad.Close()
	}
	nothingWritten("after the calls on backends with a maximum out of range")
}

// Every Redis scheme takes maxttl, checked when the URL is opened; the
// backend's Capabilities report it, and without it the default.
func TestMaxTTLURLs(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	// Nothing is sent to these addresses before the first call.
	nowhere := "127.0.0.1:1"
	redlock := "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
	for _, tc := range []struct {
		url  string
		want time.Duration
	}{
		{"redis://" + srv.Addr, redis.DefaultMaxTTL},
		{"redis://" + srv.Addr + "?maxttl=2m", 2 * time.Minute},
		{"unix:///tmp/nowhere.sock?maxttl=10ms", 10 * time.Millisecond},
		{"redis+cluster://" + nowhere, redis.DefaultMaxTTL},
		{"redis+cluster://" + nowhere + "?maxttl=8760h", lock.MaxTTL},
		{"redis+sentinel://" + nowhere + "?master_name=m", redis.DefaultMaxTTL},
		{"redis+sentinel://" + nowhere + "?master_name=m&maxttl=90s", 90 * time.Second},
		{redlock, redis.DefaultMaxTTL},
		{redlock + "?maxttl=5m&nodetimeout=2m", 5 * time.Minute},
	} {
		c, err := lock.Open(ctx, tc.url, lock.WithTTL(10*time.Millisecond))
		if err != nil {
			t.Errorf("Open(%q): %v", tc.url, err)
			continue
		}
		if got := c.Capabilities().MaxTTL; got != tc.want {
			t.Errorf("Open(%q): maximum TTL %v; want %v", tc.url, got, tc.want)
		}
		c.Close()
	}

	// A TTL from the URL is checked against the URL's maximum.
	if c, err := lock.Open(ctx, "redis://"+srv.Addr+"?ttl=90s"); err == nil {
		c.Close()
		t.Errorf("Open with ttl=90s and the default maximum succeeded")
	} else if !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") || !strings.Contains(err.Error(), "maxttl") {
		t.Errorf("Open with ttl=90s: %v; want ErrInvalidTTL naming the maximum and maxttl", err)
	}
	c, err := lock.Open(ctx, "redis://"+srv.Addr+"?ttl=90s&maxttl=90s")
	if err != nil {
		t.Fatalf("Open with ttl=90s&maxttl=90s: %v", err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("TryAcquire with ttl=90s&maxttl=90s: %v", err)
	}
	if l.TTL() != 90*time.Second {
		t.Errorf("lease TTL %v; want 90s", l.TTL())
	}
	l.Release(ctx)

	for _, u := range []string{
		"redis://" + srv.Addr,
		"rediss://" + srv.Addr,
		"unix:///tmp/nowhere.sock",
		"redis+cluster://" + nowhere,
		"redis+sentinel://" + nowhere + "?master_name=m",
		redlock,
	} {
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		for _, tc := range []struct{ v, want string }{
			{"1ms", `maxttl="1ms": want a Go duration of at least 10ms and at most 8760h0m0s (lock.MaxTTL), such as 1m`},
			{"8761h", `maxttl="8761h": want a Go duration of at least 10ms`},
			{"-1m", `maxttl="-1m"`},
			{"soon", `maxttl="soon"`},
		} {
			bad := u + sep + "maxttl=" + tc.v
			if c, err := lock.Open(ctx, bad); err == nil {
				c.Close()
				t.Errorf("Open(%q) succeeded", bad)
			} else if !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Open(%q): %v; want ErrInvalid saying %q", bad, err, tc.want)
			}
		}
	}
}

// The case: a waiter killed while queued with a TTL of an hour was
// handed the lock by the next release and blocked the key for an hour.
// With the maximum TTL in place (maxttl=1s here, so that the test takes
// seconds) a TTL of an hour is refused before anything is sent, and a
// waiter killed while queued at the maximum delays the one behind it by at
// most the bound the package doc states:
//
//   - the holder releases: the release hands the lock to the killed
//     waiter, for at most its TTL, and the waiter behind it takes the key
//     within max(the killed waiter's TTL, a third of its own) of the
//     release;
//   - the holder dies too (it expires without a release): the waiter
//     behind takes the key within the killed waiter's TTL plus
//     max(its own TTL, lock.DefaultMaxBackoff) of the deaths (the
//     holder's own expiry, at most its TTL, falls within that).
//
// Each bound, with slack for round trips and timers on a loaded machine,
// is the deadline of the next waiter's Acquire: a bound broken fails the
// test. "Killed" is its host gone without a word: the proxy it reaches the
// server through holds everything from then on, so nothing more of it,
// its leave included, reaches the store.
func TestKilledWaiterDelaysOthersAtMostItsTTL(t *testing.T) {
	const maxTTL = time.Second
	const slack = time.Second
	// The dead hosts' clients, opened from URLs, fail to dial once their
	// proxies close: not worth a line each on stderr.
	redis.SetQuietGoRedisLogger()
	t.Cleanup(redis.ResetGoRedisLogger)
	for _, tc := range []struct {
		name    string
		release bool
		bound   time.Duration // from the kill, or from the release
	}{
		{"holder releases", true, max(maxTTL, maxTTL/3)},
		{"holder dies too", false, maxTTL + max(maxTTL, lock.DefaultMaxBackoff)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.NoPersistence)
			ctx := context.Background()
			rdb := newGoRedis(t, srv.Addr)
			open := func(addr string) *lock.Client {
				t.Helper()
				c, err := lock.Open(ctx, fmt.Sprintf("redis://%s?maxttl=%v&ttl=%v", addr, maxTTL, maxTTL))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			waitQueued := func(n int64) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for rdb.ZCard(ctx, "lock:{k}:q").Val() != n {
					if time.Now().After(deadline) {
						t.Fatalf("%d waiter(s) did not queue within 10s", n)
					}
					time.Sleep(5 * time.Millisecond) // poll the store
				}
			}

			// The holder: one that releases holds for longer than the
			// maximum the waiters have (its own backend's default); one
			// that dies renews its lease of maxTTL until then.
			var holder *lock.Client
			hpx := faultproxy.Start(t, srv.Addr)
			if tc.release {
				holder = newLocks(t, redis.New(newGoRedis(t, srv.Addr)), lock.WithTTL(10*time.Second))
			} else {
				holder = open(hpx.Addr)
			}
			hl, err := holder.TryAcquire(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}

			px := faultproxy.Start(t, srv.Addr)
			victim := open(px.Addr)
			if _, err := victim.Acquire(ctx, "k", lock.WithTTL(time.Hour)); !errors.Is(err, lock.ErrInvalidTTL) {
				t.Fatalf("Acquire with a TTL of 1h on a backend with maxttl=%v: %v; want ErrInvalidTTL", maxTTL, err)
			}
			if n := rdb.ZCard(ctx, "lock:{k}:q").Val(); n != 0 {
				t.Fatalf("the refused waiter queued (%d in the queue)", n)
			}
			vctx, vcancel := context.WithCancel(ctx)
			defer vcancel()
			victimDone := make(chan struct{})
			go func() {
				defer close(victimDone)
				if l, err := victim.Acquire(vctx, "k"); err == nil {
					l.Release(ctx) // not expected: its host is gone first
				}
			}()
			defer func() { vcancel(); <-victimDone }()
			// Before the clients close, the dead hosts' proxies close
			// (deferred calls run before cleanups), so that their
			// clients' last calls fail at once instead of waiting for
			// held replies.
			defer px.Close()
			defer hpx.Close()
			waitQueued(1)

			next := open(srv.Addr)
			nctx, ncancel := context.WithCancel(ctx)
			defer ncancel()
			type result struct {
				l   *lock.Lease
				err error
			}
			got := make(chan result, 1)
			go func() {
				l, err := next.Acquire(nctx, "k")
				got <- result{l, err}
			}()
			waitQueued(2)

			px.Cut() // the victim's host is gone
			if !tc.release {
				hpx.Cut() // and the holder's
			}
			from := time.Now()
			if tc.release {
				if err := hl.Release(ctx); err != nil {
					t.Fatal(err)
				}
				// Handed to the victim, for no longer than its TTL.
				ib := redis.New(rdb)
				defer ib.Close()
				h, err := ib.Inspect(ctx, "k")
				if err != nil {
					t.Fatal(err)
				}
				if !h.Held || h.Remaining > maxTTL {
					t.Fatalf("after the release: %+v; want the lock handed to the victim for at most its TTL %v", h, maxTTL)
				}
			}
			time.AfterFunc(tc.bound+slack, ncancel)
			r := <-got
			took := time.Since(from)
			if r.err != nil {
				t.Fatalf("the waiter behind the killed one: %v after %v; want the lock within %v (and %v of slack)", r.err, took.Round(time.Millisecond), tc.bound, slack)
			}
			defer r.l.Release(ctx)
			if r.l.Fence() <= hl.Fence() {
				t.Errorf("fence %d after the holder's %d; want it greater", r.l.Fence(), hl.Fence())
			}
			t.Logf("the waiter behind the killed one took the key %v after the %s (bound %v)", took.Round(time.Millisecond), map[bool]string{true: "release", false: "deaths"}[tc.release], tc.bound)
		})
	}
}
