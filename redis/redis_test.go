package redis_test

import (
	"context"
	"errors"
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

func newLocks(t *testing.T, b backend.Backend, opts ...lock.Option) *lock.Client {
	t.Helper()
	c, err := lock.New(b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Without persistence a restart forgets the fence counter: fences repeat.
// The backend says so (DurableFence false), and this is what breaks.
func TestFenceWithoutPersistenceRepeatsAfterRestart(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	b := redis.New(newGoRedis(t, srv.Addr))
	if b.Capabilities().DurableFence {
		t.Fatal("a backend not declared durable says its fence is durable")
	}
	locks := newLocks(t, b)
	ctx := context.Background()
	var before uint64
	for i := 0; i < 5; i++ {
		l, err := locks.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		before = l.Fence()
		l.Release(ctx)
	}
	srv.Restart(true) // same directory, but nothing was persisted
	l, err := locks.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if l.Fence() > before {
		t.Fatalf("fence %d after a restart without persistence; expected it to start again (<= %d)", l.Fence(), before)
	}
	t.Logf("without persistence: fence %d before the restart, %d after: a resource checking fences would reject the new holder", before, l.Fence())
}

// With appendfsync always the counter survives kill -9.
func TestFenceWithAOFAlwaysSurvivesKill(t *testing.T) {
	srv := redistest.Start(t, redistest.AOFAlways)
	b := redis.New(newGoRedis(t, srv.Addr), redis.WithDurableFence(true))
	locks := newLocks(t, b)
	ctx := context.Background()
	var before uint64
	for i := 0; i < 100; i++ {
		l, err := locks.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		before = l.Fence()
		l.Release(ctx)
	}
	srv.Restart(true) // SIGKILL, then start on the same data
	l, err := locks.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if l.Fence() <= before {
		t.Fatalf("fence %d after kill -9 and restart; %d before: want strictly increasing", l.Fence(), before)
	}
}

func TestScriptCacheFlushIsSurvived(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	locks := newLocks(t, redis.New(rdb))
	ctx := context.Background()
	l, err := locks.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("Renew after SCRIPT FLUSH: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after SCRIPT FLUSH: %v", err)
	}
}

func TestHolderRemainingTTLBoundsTheWait(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	b := redis.New(rdb)
	ctx := context.Background()
	if _, err := b.Acquire(ctx, "k", "holder-token", 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(ctx, "k", "other-token", time.Second)
	var le *backend.LockedError
	if !errors.As(err, &le) || le.Remaining <= 0 || le.Remaining > 300*time.Millisecond {
		t.Fatalf("conflict: %v; want ErrLocked with the holder's remaining TTL", err)
	}
	h, err := b.Inspect(ctx, "k")
	if err != nil || !h.Held || h.Token != "holder-token" || h.Fence != 1 {
		t.Fatalf("Inspect: %+v, %v", h, err)
	}
}

// redlockOver builds a Redlock over servers, with clients that honour
// context deadlines.
func redlockOver(t *testing.T, srvs []*redistest.Server, opts ...redis.Option) (*redis.Redlock, []*goredis.Client) {
	t.Helper()
	var nodes []redis.Conn
	var rdbs []*goredis.Client
	for _, s := range srvs {
		c := newGoRedis(t, s.Addr)
		rdbs = append(rdbs, c)
		nodes = append(nodes, c)
	}
	r, err := redis.NewRedlock(nodes, append([]redis.Option{redis.WithNodeTimeout(redlockNodeTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, rdbs
}

// startN starts n new servers, marked as new Redlock nodes (see
// Redlock.InitNewNodes).
func startN(t testing.TB, n int, mode string) []*redistest.Server {
	var out []*redistest.Server
	for i := 0; i < n; i++ {
		out = append(out, redistest.Start(t, mode))
	}
	initNodes(t, out)
	return out
}

// initNodes marks new servers as Redlock nodes that vote at once.
func initNodes(t testing.TB, srvs []*redistest.Server, opts ...redis.Option) {
	t.Helper()
	var nodes []redis.Conn
	for _, s := range srvs {
		nodes = append(nodes, newGoRedis(t, s.Addr))
	}
	r, err := redis.NewRedlock(nodes, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if n, err := r.InitNewNodes(context.Background()); err != nil || n != len(srvs) {
		t.Fatalf("InitNewNodes: %d of %d, %v", n, len(srvs), err)
	}
}

func TestRedlockMinorityDown(t *testing.T) {
	for _, fault := range []string{"killed", "stopped"} {
		t.Run(fault, func(t *testing.T) {
			srvs := startN(t, 5, redistest.NoPersistence)
			r, _ := redlockOver(t, srvs)
			locks := newLocks(t, r)
			for _, s := range srvs[:2] {
				if fault == "killed" {
					s.Kill()
				} else {
					s.Stop()
					t.Cleanup(s.Continue)
				}
			}
			ctx := context.Background()
			l, err := locks.TryAcquire(ctx, "k")
			if err != nil {
				t.Fatalf("TryAcquire with 2 of 5 nodes %s: %v", fault, err)
			}
			if err := l.Renew(ctx); err != nil {
				t.Errorf("Renew: %v", err)
			}
			if _, err := newLocks(t, r).TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
				t.Errorf("second TryAcquire: %v; want ErrLocked", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
	}
}

// A minority of nodes saying "not held" while another node fails is not
// the store's answer: the renewal or release has an unknown outcome, and a
// lease a majority may still hold must not be reported lost. (A node that
// missed the acquire, say while it restarted, and one restarting at the
// renewal: found by the randomized fault runs.)
func TestRedlockMinorityNotHeldIsNotTheAnswer(t *testing.T) {
	srvs := startN(t, 3, redistest.NoPersistence)
	r, rdbs := redlockOver(t, srvs)
	ctx := context.Background()
	if _, err := r.Acquire(ctx, "k", "tok", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// Node 0 never had it: deleted once the grant reached it (the acquire
	// returns on a majority; the third node's grant may land after). Node
	// 1 must hold it too, or it would be a majority saying not held.
	for i := range 2 {
		for start := time.Now(); rdbs[i].Exists(ctx, "lock:{k}").Val() == 0; {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("node %d did not get the lock within 5s", i)
			}
			time.Sleep(time.Millisecond) // poll the node
		}
	}
	rdbs[0].Del(ctx, "lock:{k}")
	srvs[2].Stop() // node 2 does not answer
	t.Cleanup(srvs[2].Continue)
	_, err := r.Renew(ctx, "k", "tok", 10*time.Second)
	if err == nil || errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Renew with 1 node renewing, 1 not holding, 1 stopped: %v; want an error that is not ErrNotHeld", err)
	} else if !strings.Contains(err.Error(), "node 0: not held by this owner") {
		t.Errorf("Renew error %q does not name the node that did not hold the lock", err)
	}
	if err := r.Release(ctx, "k", "tok"); err == nil || errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release with 1 node releasing, 1 not holding, 1 stopped: %v; want an error that is not ErrNotHeld", err)
	}
	// With the stopped node back, a majority says not held: that is the answer.
	srvs[2].Continue()
	if _, err := r.Renew(ctx, "k", "tok", 10*time.Second); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Renew after the release, every node answering: %v; want ErrNotHeld", err)
	}
}

func TestRedlockMajorityDownFailsFastAndLeavesNothing(t *testing.T) {
	srvs := startN(t, 5, redistest.NoPersistence)
	r, rdbs := redlockOver(t, srvs)
	locks := newLocks(t, r)
	for _, s := range srvs[:3] {
		s.Stop()
		t.Cleanup(s.Continue)
	}
	ctx := context.Background()
	start := time.Now()
	_, err := locks.TryAcquire(ctx, "k")
	took := time.Since(start)
	if err == nil || errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryAcquire with 3 of 5 nodes stopped: %v; want a quorum error", err)
	}
	// Two phases at most, each bounded by the node timeout.
	if bound := 2*redlockNodeTimeout + time.Second; took > bound {
		t.Errorf("failed after %v; want within %v", took, bound)
	}
	if !strings.Contains(err.Error(), "2 of 5 nodes agreed, 3 needed") {
		t.Errorf("error %q does not say how many nodes agreed", err)
	}
	for i, c := range rdbs[3:] {
		if keys := keysLeft(t, c); len(keys) != 0 {
			t.Errorf("live node %d holds %v after the failed acquire; want nothing", i+3, keys)
		}
	}
}

// freedWithin polls key on c until it is gone or bound has passed, and
// returns its last value ("" when gone).
func freedWithin(c *goredis.Client, key string, bound time.Duration) string {
	ctx := context.Background()
	deadline := time.Now().Add(bound)
	for {
		v := c.Get(ctx, key).Val()
		if v == "" || strings.TrimSuffix(v, "+") == "foreign" || time.Now().After(deadline) {
			return v
		}
		time.Sleep(time.Millisecond) // poll the store
	}
}

// keysLeft returns the keys on a server other than the tombstones of
// released tokens, and checks that those expire within a minute.
func keysLeft(t *testing.T, rdb *goredis.Client) []string {
	t.Helper()
	ctx := context.Background()
	var left []string
	for _, k := range rdb.Keys(ctx, "*").Val() {
		if k == "lock:redlock:node" {
			continue // the node's state
		}
		if !strings.Contains(k, ":dead:") {
			left = append(left, k)
			continue
		}
		if pttl := rdb.PTTL(ctx, k).Val(); pttl <= 0 || pttl > time.Minute {
			t.Errorf("tombstone %s expires in %v; want within a minute", k, pttl)
		}
	}
	return left
}

func TestRedlockEverySubsetPreoccupied(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			srvs := startN(t, n, redistest.NoPersistence)
			r, rdbs := redlockOver(t, srvs)
			locks := newLocks(t, r, lock.WithAutoRenew(false))
			ctx := context.Background()
			quorum := n/2 + 1
			for mask := 0; mask < 1<<n; mask++ {
				key := fmt.Sprintf("subset-%d", mask)
				free := 0
				for i, c := range rdbs {
					if mask&(1<<i) != 0 {
						c.Set(ctx, "lock:{"+key+"}", "foreign", 10*time.Second)
					} else {
						free++
					}
				}
				l, err := locks.TryAcquire(ctx, key)
				want := free >= quorum
				switch {
				case want && err != nil:
					t.Errorf("nodes %0*b occupied, %d free: %v; want success", n, mask, free, err)
				case !want && err == nil:
					t.Errorf("nodes %0*b occupied, %d free: acquired; want failure", n, mask, free)
				case !want && !errors.Is(err, lock.ErrLocked):
					t.Errorf("nodes %0*b occupied: %v; want ErrLocked", n, mask, err)
				}
				if l != nil {
					l.Release(ctx)
				}
				for i, c := range rdbs {
					v := c.Get(ctx, "lock:{"+key+"}").Val()
					if mask&(1<<i) != 0 && strings.TrimSuffix(v, "+") != "foreign" { // "+": a waiter's mark
						t.Errorf("mask %0*b: node %d's foreign lock was touched: %q", n, mask, i, v)
					}
					// A node that answered after the outcome was
					// decided is released in the background, within
					// the node timeout.
					if v := freedWithin(c, "lock:{"+key+"}", redlockNodeTimeout); mask&(1<<i) == 0 && v != "" {
						t.Errorf("mask %0*b: node %d keeps %q after the attempt", n, mask, i, v)
					}
				}
			}
		})
	}
}

// History 4 of issue 8, one node at a time: a node that comes back empty
// votes again only after the maximum TTL, with fence counters adopted from
// the others, and fences keep increasing through every restart.
func TestRedlockNodeRestartedEmptyKeepsFencesIncreasing(t *testing.T) {
	srvs := startN(t, 3, redistest.AOFAlways)
	const maxTTL = 500 * time.Millisecond
	r, rdbs := redlockOver(t, srvs, redis.WithMaxTTL(maxTTL))
	locks := newLocks(t, r, lock.WithTTL(maxTTL))
	ctx := context.Background()
	var last uint64
	acquire := func(rounds int) {
		t.Helper()
		for i := 0; i < rounds; i++ {
			l, err := locks.Acquire(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if l.Fence() <= last {
				t.Fatalf("fence %d after %d: want strictly increasing", l.Fence(), last)
			}
			last = l.Fence()
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	acquire(20)
	ctx2, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for i := range srvs {
		beforeRestart := last
		srvs[i].Restart(false) // this node loses everything; the other two keep theirs
		acquire(20)
		// It votes again once the wait is over and it adopted the
		// counters: before the next node restarts.
		for rdbs[i].Get(ctx2, "lock:redlock:node").Val() != "ready" {
			if ctx2.Err() != nil {
				t.Fatalf("node %d never became ready after its restart", i)
			}
			acquire(1)
		}
		// Adoption read the counters of the other two nodes, so the
		// node knows a counter at least as high as every fence granted
		// before it lost its data. (It may lag the latest grants: a call
		// returns once a majority decided it, and a majority of the
		// other two nodes needs no write to it.)
		if f, _ := rdbs[i].Get(ctx, "lock:{k}:fence").Int64(); f < int64(beforeRestart) {
			t.Fatalf("node %d adopted fence counter %d; fence %d was granted before it restarted empty", i, f, beforeRestart)
		}
		acquire(20)
	}
}

// go-redis retries a request whose reply was lost. An acquire retried after
// it took the lock must report the lock as taken, with the fence the first
// try got: otherwise the caller waits on its own lock, or gives up while it
// holds it for a whole TTL.
func TestRetriedAcquireFindsItsOwnLock(t *testing.T) {
	srvs := startN(t, 3, redistest.NoPersistence)
	single := redis.New(newGoRedis(t, srvs[0].Addr))
	t.Cleanup(func() { single.Close() })
	rl, _ := redlockOver(t, srvs)
	for name, b := range map[string]backend.Backend{"single": single, "redlock": rl} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			tok := "tok-" + name // tokens are for one acquisition: one per backend over the same servers
			first, err := b.Acquire(ctx, "retried", tok, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			again, err := b.Acquire(ctx, "retried", tok, time.Minute)
			if err != nil {
				t.Fatalf("the same acquire sent again: %v; want the lock it already took", err)
			}
			// Redlock takes a fresh fence above every node's counter,
			// which the first try raised: still above every earlier
			// holder's.
			if again.Fence != first.Fence && (name == "single" || again.Fence < first.Fence) {
				t.Fatalf("the same acquire sent again got fence %d; the first try got %d", again.Fence, first.Fence)
			}
			var locked *backend.LockedError
			if _, err := b.Acquire(ctx, "retried", "other-"+name, time.Minute); !errors.As(err, &locked) {
				t.Fatalf("another owner's acquire: %v; want a LockedError", err)
			}
			// Even after the other owner marked the lock as waited for.
			if again, err := b.Acquire(ctx, "retried", tok, time.Minute); err != nil || again.Fence < first.Fence {
				t.Fatalf("the same acquire sent again after a waiter marked the lock: fence %d, %v; want fence %d", again.Fence, err, first.Fence)
			}
			if err := b.Release(ctx, "retried", tok); err != nil {
				t.Fatal(err)
			}
		})
	}
}
