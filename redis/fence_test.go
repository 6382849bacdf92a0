package redis_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// permanentKeys returns the keys on a server that have no expiry, but the
// Redlock node state.
func permanentKeys(t *testing.T, rdb *goredis.Client) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	for _, k := range rdb.Keys(ctx, "*").Val() {
		if k == "lock:redlock:node" {
			continue
		}
		if rdb.PTTL(ctx, k).Val() == -1 {
			out = append(out, k)
		}
	}
	return out
}

// The key that records a fence reserved for the next holder lives as long
// as the lock, no longer: renewals extend it, and it expires with the lock.
// (It used to stay forever, one per lock key handed over.)
func TestNextKeyExpiresWithTheLock(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	b := redis.New(rdb)
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	if _, err := b.Acquire(ctx, "k", "00000000000000000000000000000001", ttl); err != nil {
		t.Fatal(err)
	}
	got, err := b.Transfer(ctx, "k", "00000000000000000000000000000001", "00000000000000000000000000000002", ttl, backend.TransferOptions{Reserve: true})
	if err != nil || got.Next == 0 {
		t.Fatalf("Transfer with a reservation: %+v, %v", got, err)
	}
	if p := rdb.PTTL(ctx, "lock:{k}:next").Val(); p <= 0 || p > ttl {
		t.Fatalf("the next key expires in %v after a transfer with TTL %v; want with the lock", p, ttl)
	}
	if _, err := b.Renew(ctx, "k", "00000000000000000000000000000002", 2*ttl); err != nil {
		t.Fatal(err)
	}
	if lp, p := rdb.PTTL(ctx, "lock:{k}").Val(), rdb.PTTL(ctx, "lock:{k}:next").Val(); p <= ttl || p > lp {
		t.Fatalf("after a renewal the lock expires in %v and the next key in %v; want them together", lp, p)
	}
	h, err := b.Inspect(ctx, "k")
	if err != nil || h.Fence != got.Fence {
		t.Fatalf("Inspect: %+v, %v; want the holder's fence %d", h, err, got.Fence)
	}
	time.Sleep(2 * ttl) // wait out the TTL
	if left := permanentKeys(t, rdb); len(left) != 1 || left[0] != "lock:{k}:fence" {
		t.Fatalf("keys without expiry: %v; want only the fence counter lock:{k}:fence", left)
	}
	if n := rdb.Exists(ctx, "lock:{k}:next").Val(); n != 0 {
		t.Fatal("the next key outlived the lock")
	}
}

// keysIn returns n lock keys whose hash slots are among the first slots
// ones (all when slots is 16384).
func keysIn(n, slots int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		key := fmt.Sprintf("request:%d", i)
		if redis.HashSlot("lock:{"+key+"}") < slots {
			out = append(out, key)
		}
	}
	return out
}

// churn acquires and releases keys (each twice, checking that the fence
// grows), and hands a hot key around between goroutines (transfers with
// reservations), and returns the keys it used.
func churn(t *testing.T, locks *lock.Client, keys []string) []string {
	t.Helper()
	ctx := context.Background()
	var used []string
	for _, key := range keys {
		used = append(used, key)
		var last uint64
		for range 2 {
			l, err := locks.TryAcquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if l.Fence() <= last {
				t.Fatalf("%s: fence %d after %d: want strictly increasing", key, l.Fence(), last)
			}
			last = l.Fence()
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	hammer(t, locks, "hot", 4, 25)
	return append(used, "hot")
}

// With WithSlotFenceCounters, the only keys without expiry are the slot
// counters, at most one per hash slot used, however many lock keys were
// used; fences still grow for each key, also for a key with a counter left
// by the default mode.
func TestSlotFenceCountersBoundTheFootprint(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	ctx := context.Background()

	// A key used before in the default mode, with a long history.
	old := newLocks(t, redis.New(newGoRedis(t, srv.Addr)))
	l, err := old.TryAcquire(ctx, "legacy")
	if err != nil {
		t.Fatal(err)
	}
	l.Release(ctx)
	rdb.Set(ctx, "lock:{legacy}:fence", 1000, 0)

	locks := newLocks(t, redis.New(newGoRedis(t, srv.Addr), redis.WithSlotFenceCounters(true)), lock.WithTTL(time.Second))
	l, err = locks.TryAcquire(ctx, "legacy")
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence() <= 1000 {
		t.Fatalf("fence %d for a key whose counter was at 1000 before slot counters; want above", l.Fence())
	}
	if h, err := locks.Backend().(backend.Inspector).Inspect(ctx, "legacy"); err != nil || h.Fence != l.Fence() {
		t.Fatalf("Inspect: %+v, %v; want fence %d", h, err, l.Fence())
	}
	l.Release(ctx)

	// A thousand lock keys in 16 hash slots: 16 counters.
	used := churn(t, locks, keysIn(1000, 16))
	slots := map[int]bool{}
	for _, k := range append(used, "legacy") {
		slots[redis.HashSlot("lock:{"+k+"}")] = true
	}
	permanent := permanentKeys(t, rdb)
	for _, k := range permanent {
		if !strings.HasSuffix(k, ":slotfence") {
			t.Errorf("key %s has no expiry; with slot counters only they may live forever", k)
		}
	}
	if len(permanent) > len(slots) {
		t.Errorf("%d keys without expiry for %d hash slots used", len(permanent), len(slots))
	}
	t.Logf("%d lock keys used, %d keys left without expiry (%d slots)", len(used)+1, len(permanent), len(slots))
	if v := rdb.Get(ctx, redis.SlotFenceKey("lock:", "hot")).Val(); v == "" {
		t.Errorf("no slot counter %s for key hot", redis.SlotFenceKey("lock:", "hot"))
	}
}

// The default mode, for comparison: one counter per lock key, forever, and
// nothing else without expiry.
func TestFenceCountersPerKeyByDefault(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	locks := newLocks(t, redis.New(newGoRedis(t, srv.Addr)), lock.WithTTL(time.Second))
	used := churn(t, locks, keysIn(200, 16384))
	permanent := permanentKeys(t, rdb)
	for _, k := range permanent {
		if !strings.HasSuffix(k, "}:fence") {
			t.Errorf("key %s has no expiry; only fence counters may live forever", k)
		}
	}
	if len(permanent) != len(used) {
		t.Errorf("%d keys without expiry for %d lock keys; want one fence counter each", len(permanent), len(used))
	}
}

// Redlock with slot counters: fences grow, only slot counters stay, and a
// node that comes back empty adopts them (folding in per-key counters of
// the default mode) before it votes again.
func TestRedlockSlotFenceCounters(t *testing.T) {
	srvs := startN(t, 3, redistest.AOFAlways)
	const maxTTL = 500 * time.Millisecond
	_, rdbs := redlockOver(t, srvs)
	// A key with a history in the default mode.
	for _, c := range rdbs {
		c.Set(context.Background(), "lock:{legacy}:fence", 1000, 0)
	}
	r, _ := redlockOver(t, srvs, redis.WithMaxTTL(maxTTL), redis.WithSlotFenceCounters(true))
	locks := newLocks(t, r, lock.WithTTL(maxTTL))
	ctx := context.Background()
	l, err := locks.TryAcquire(ctx, "legacy")
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence() <= 1000 {
		t.Fatalf("fence %d for a key whose counters were at 1000; want above", l.Fence())
	}
	if h, err := r.Inspect(ctx, "legacy"); err != nil || h.Fence != l.Fence() {
		t.Fatalf("Inspect: %+v, %v; want fence %d", h, err, l.Fence())
	}
	l.Release(ctx)
	churn(t, locks, keysIn(100, 16384))
	for i, c := range rdbs {
		for _, k := range permanentKeys(t, c) {
			if !strings.HasSuffix(k, ":slotfence") && k != "lock:{legacy}:fence" {
				t.Errorf("node %d: key %s has no expiry", i, k)
			}
		}
	}

	// Node 0 comes back empty; it adopts the counters of the others.
	var last uint64
	acquire := func() {
		t.Helper()
		l, err := locks.Acquire(ctx, "legacy")
		if err != nil {
			t.Fatal(err)
		}
		if l.Fence() <= last {
			t.Fatalf("fence %d after %d: want strictly increasing", l.Fence(), last)
		}
		last = l.Fence()
		l.Release(ctx)
	}
	acquire()
	beforeRestart := last
	srvs[0].Restart(false)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for rdbs[0].Get(wctx, "lock:redlock:node").Val() != "ready" {
		if wctx.Err() != nil {
			t.Fatal("node 0 never became ready after its restart")
		}
		acquire()
	}
	sk := redis.SlotFenceKey("lock:", "legacy")
	// Adoption read the other two nodes' counters: the node knows one at
	// least as high as every fence granted before it lost its data. (It
	// may lag later grants: a call returns once a majority decided it.)
	if f, _ := rdbs[0].Get(ctx, sk).Int64(); f < int64(beforeRestart) {
		t.Fatalf("node 0 adopted slot counter %d; fence %d was granted before it restarted empty", f, beforeRestart)
	}
	for _, k := range permanentKeys(t, rdbs[0]) {
		if !strings.HasSuffix(k, ":slotfence") {
			t.Errorf("node 0 after adoption: key %s has no expiry", k)
		}
	}
	acquire()
}
