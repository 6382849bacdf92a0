package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// BenchmarkRedlockOneNodeDown measures TryAcquire and Release on a Redlock
// opened from a URL (go-redis's default retries) over three nodes, one of
// which is dead (connection refused) or hung (SIGSTOP). A majority answers
// at once; the call must not wait for the third node.
func BenchmarkRedlockOneNodeDown(b *testing.B) {
	for _, fault := range []string{"refused", "hung"} {
		b.Run(fault, func(b *testing.B) {
			srvs := startN(b, 3, redistest.NoPersistence)
			var addrs []string
			for _, s := range srvs {
				addrs = append(addrs, s.Addr)
			}
			ctx := context.Background()
			locks, err := lock.Open(ctx, "redlock://"+strings.Join(addrs, ","), lock.WithAutoRenew(false))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { locks.Close() })
			if fault == "refused" {
				srvs[2].Kill()
			} else {
				srvs[2].Stop()
				b.Cleanup(srvs[2].Continue)
			}
			var acquire, release float64
			for b.Loop() {
				start := time.Now()
				l, err := locks.TryAcquire(ctx, "k")
				if err != nil {
					b.Fatal(err)
				}
				mid := time.Now()
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
				acquire += float64(mid.Sub(start))
				release += float64(time.Since(mid))
			}
			b.ReportMetric(acquire/float64(b.N)/1e6, "ms/acquire")
			b.ReportMetric(release/float64(b.N)/1e6, "ms/release")
		})
	}
}

// within fails t when a call took longer than bound. The bound is far
// above what the call needs and far below what waiting for a straggler
// costs (its node timeout): the point is whether it waits, not how fast it
// is (see BenchmarkRedlockOneNodeDown for the figures).
func within(t *testing.T, what string, bound time.Duration, start time.Time) {
	t.Helper()
	if took := time.Since(start); took > bound {
		t.Errorf("%s took %v with one node hung; want within %v: it waited for the straggler", what, took.Round(time.Millisecond), bound)
	}
}

// One hung node (SIGSTOP) must not hold up a call that the two others
// decide: a request to it runs to the node timeout (5s here) in the
// background.
func TestRedlockDoesNotWaitForAHungNode(t *testing.T) {
	srvs := startN(t, 3, redistest.NoPersistence)
	r, _ := redlockOver(t, srvs, redis.WithNodeTimeout(5*time.Second))
	locks := newLocks(t, r, lock.WithAutoRenew(false))
	warmUp(t, locks)
	srvs[2].Stop()
	t.Cleanup(srvs[2].Continue) // before Close, which waits for the stragglers
	ctx := context.Background()
	const bound = 2 * time.Second

	start := time.Now()
	l, err := locks.TryAcquire(ctx, "k")
	within(t, "TryAcquire", bound, start)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	within(t, "Renew", bound, start)
	start = time.Now()
	h, err := r.Inspect(ctx, "k")
	within(t, "Inspect", bound, start)
	if err != nil || !h.Held || h.Token != l.Token() || h.Fence != l.Fence() {
		t.Errorf("Inspect: %+v, %v; want the lease's token and fence %d", h, err, l.Fence())
	}
	start = time.Now()
	_, err = newLocks(t, r).TryAcquire(ctx, "k")
	within(t, "a second TryAcquire", bound, start)
	if !errors.Is(err, lock.ErrLocked) {
		t.Errorf("a second TryAcquire: %v; want ErrLocked", err)
	}
	start = time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	within(t, "Release", bound, start)
}

// A node whose reply comes after the call was decided has still run the
// request: its late grant must not stay behind, whether the attempt failed
// (the lock is held elsewhere) or succeeded (then the grant belongs to the
// lease, and the lease's release frees it).
func TestRedlockLateGrantLeavesNothing(t *testing.T) {
	srvs := startN(t, 3, redistest.NoPersistence)
	locks, proxies := proxiedRedlockWith(t, srvs, []redis.Option{redis.WithNodeTimeout(5 * time.Second)}, lock.WithAutoRenew(false))
	warmUp(t, locks)
	ctx := context.Background()
	const bound = 2 * time.Second
	nodes := make([]*goredis.Client, len(srvs))
	for i, s := range srvs {
		nodes[i] = newGoRedis(t, s.Addr)
	}
	const C = 2
	// noLockOnC waits (up to a bound) until node C keeps no lock for key:
	// the late grant was undone there.
	noLockOnC := func(t *testing.T, key string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for nodes[C].Exists(ctx, "lock:{"+key+"}").Val() == 1 {
			if time.Now().After(deadline) {
				t.Fatalf("node C keeps %q's lock %q after the late reply: a late grant left behind", key, nodes[C].Get(ctx, "lock:{"+key+"}").Val())
			}
			time.Sleep(5 * time.Millisecond) // poll the store
		}
	}

	t.Run("failed attempt", func(t *testing.T) {
		// A and B are held elsewhere; C grants, but its reply is late,
		// and the attempt's undo never reaches C: only the late reply
		// tells that C must be released.
		for _, n := range nodes[:C] {
			n.Set(ctx, "lock:{held}", "foreign", time.Minute)
		}
		for _, px := range proxies {
			px.Hold(faultproxy.ToClient)
		}
		replies := proxies[C].Received(faultproxy.ToClient)
		errc := make(chan error, 1)
		go func() {
			_, err := locks.TryAcquire(ctx, "held")
			errc <- err
		}()
		if err := proxies[C].WaitReceived(ctx, faultproxy.ToClient, replies); err != nil {
			t.Fatal(err) // C granted
		}
		requests := proxies[C].Received(faultproxy.ToServer)
		proxies[C].Drop(faultproxy.ToServer)
		start := time.Now()
		proxies[0].Deliver(faultproxy.ToClient)
		proxies[1].Deliver(faultproxy.ToClient)
		if err := <-errc; !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("TryAcquire with two nodes held elsewhere: %v; want ErrLocked", err)
		}
		within(t, "TryAcquire", bound, start)
		if err := proxies[C].WaitReceived(ctx, faultproxy.ToServer, requests); err != nil {
			t.Fatal(err) // the undo, dropped
		}
		proxies[C].Pass(faultproxy.ToServer)
		proxies[C].Deliver(faultproxy.ToClient)
		noLockOnC(t, "held")
	})
	t.Run("granted attempt", func(t *testing.T) {
		proxies[C].Hold(faultproxy.ToClient)
		start := time.Now()
		l, err := locks.TryAcquire(ctx, "free")
		within(t, "TryAcquire", bound, start)
		if err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		within(t, "Release", bound, start)
		proxies[C].Deliver(faultproxy.ToClient)
		noLockOnC(t, "free")
	})
}

// Close of a Redlock opened from a URL does not wait for the requests still
// out to a hung node (5s node timeout here): it closes its clients.
func TestOpenedRedlockClosesWithoutWaitingForAHungNode(t *testing.T) {
	srvs := startN(t, 3, redistest.NoPersistence)
	ctx := context.Background()
	locks, err := lock.Open(ctx, "redlock://"+srvs[0].Addr+","+srvs[1].Addr+","+srvs[2].Addr+"?nodetimeout=5s", lock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	srvs[2].Stop()
	t.Cleanup(srvs[2].Continue)
	l, err := locks.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	locks.Close()
	within(t, "Close", 2*time.Second, start)
}
