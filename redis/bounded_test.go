package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// deadPlaces is how many dead entries the tests below put in a queue: the
// waiters of a key that were killed while queued, whose records expired.
const deadPlaces = 300_000

// fillDeadPlaces puts n queue entries with no record at the head of key's
// queue (scores 1 to n), as waiters killed while queued leave them.
func fillDeadPlaces(ctx context.Context, t testing.TB, rdb *goredis.Client, key string, n int) {
	t.Helper()
	q := redis.KeysOf(redis.DefaultPrefix, key)[4]
	for i := 0; i < n; {
		var zs []goredis.Z
		for ; i < n && len(zs) < 5000; i++ {
			zs = append(zs, goredis.Z{Score: float64(i + 1), Member: fmt.Sprintf("dead%07d", i)})
		}
		if err := rdb.ZAdd(ctx, q, zs...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// watchSlowRequests makes the server log every request over 1ms, from
// now on, and returns a function that returns the longest logged and how
// many took over 10ms. These are wall times, which a loaded machine
// stretches when it deschedules the server (a bare ZREM took 109ms here
// beside other test suites): the tests check the work per request
// exactly (entries dropped, requests sent) and only log the times;
// BenchmarkReleaseDeadPlaces reports them.
func watchSlowRequests(ctx context.Context, t testing.TB, rdb *goredis.Client) func() (time.Duration, int) {
	t.Helper()
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "1000"}, {"slowlog-max-len", "10000"}} {
		if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.SlowLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	return func() (time.Duration, int) {
		t.Helper()
		logs, err := rdb.SlowLogGet(ctx, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		var longest time.Duration
		over := 0
		for _, l := range logs {
			longest = max(longest, l.Duration)
			if l.Duration > 10*time.Millisecond {
				over++
			}
		}
		return longest, over
	}
}

// calls returns how many requests of each name the server has run.
func calls(ctx context.Context, t testing.TB, rdb *goredis.Client, name string) int64 {
	t.Helper()
	var n int64
	info := rdb.Info(ctx, "commandstats").Val()
	prefix := "cmdstat_" + name + ":calls="
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			n, _ = strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		}
	}
	return n
}

// TestReleaseBoundedByDeadPlaces: the release of a lock whose queue holds
// 300,000 dead places before a live one drops them 500 at most per
// request, and the live place is still woken and takes the lock.
func TestReleaseBoundedByDeadPlaces(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	rdb := newGoRedis(t, srv.Addr)
	holder := redis.New(rdb)
	defer holder.Close()
	tok := holdKey(ctx, t, holder, "k")
	fillDeadPlaces(ctx, t, rdb, "k", deadPlaces)
	waiting := redis.New(newGoRedis(t, srv.Addr))
	defer waiting.Close()
	w := queueUpOn(ctx, t, waiting, "k")
	longest := watchSlowRequests(ctx, t, rdb)
	before := calls(ctx, t, rdb, "evalsha")
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	// Each request drops at most 500 dead places: the release and its
	// sweeps took at least 600 requests.
	if n := calls(ctx, t, rdb, "evalsha") - before; n < deadPlaces/500 {
		t.Errorf("the release sent %d requests; want at least %d, 500 dead places each at most", n, deadPlaces/500)
	}
	w.WakeUp(t, "the live place behind the dead ones")
	if _, err := w.Q.Acquire(ctx, newQueueToken(), queueTTL); err != nil {
		t.Fatalf("the woken place's attempt on the free key: %v; want the lock", err)
	}
	l, over := longest()
	t.Logf("longest request: %v; %d over 10ms", l, over)
	if n := rdb.ZCard(ctx, redis.KeysOf(redis.DefaultPrefix, "k")[4]).Val(); n != 0 {
		t.Errorf("%d entries left in the queue; want none", n)
	}
}

// TestAcquireBoundedByDeadPlaces: on a free key whose queue holds only
// dead places, each attempt drops 500 of them at most; attempts
// answer "locked" while dead places remain to search, and one takes the
// key within the bound of attempts that the search's bound gives.
func TestAcquireBoundedByDeadPlaces(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	rdb := newGoRedis(t, srv.Addr)
	b := redis.New(rdb)
	defer b.Close()
	q := redis.KeysOf(redis.DefaultPrefix, "k")[4]
	for _, via := range []string{"TryAcquire", "a place"} {
		t.Run(via, func(t *testing.T) {
			fillDeadPlaces(ctx, t, rdb, "k", deadPlaces)
			longest := watchSlowRequests(ctx, t, rdb)
			attempts, limit := 0, deadPlaces/500+2
			for ; ; attempts++ {
				if attempts == limit {
					t.Fatalf("no attempt took the free key in %d attempts", limit)
				}
				left := rdb.ZCard(ctx, q).Val()
				tok := newQueueToken()
				var err error
				if via == "TryAcquire" {
					_, err = b.Acquire(ctx, "k", tok, queueTTL)
				} else {
					q, qerr := b.Queue("k")
					if qerr != nil {
						t.Fatal(qerr)
					}
					_, err = q.Acquire(ctx, tok, queueTTL)
					q.Close(err == nil)
				}
				if err == nil {
					if err := b.Release(ctx, "k", tok); err != nil {
						t.Fatal(err)
					}
					break
				}
				if !errors.Is(err, backend.ErrLocked) {
					t.Fatalf("attempt %d: %v; want the lock or ErrLocked", attempts, err)
				}
				if dropped := left - rdb.ZCard(ctx, q).Val(); dropped > 500 {
					t.Fatalf("attempt %d dropped %d dead places; want at most 500", attempts, dropped)
				}
			}
			l, over := longest()
			t.Logf("%d attempts; longest request: %v; %d over 10ms", attempts+1, l, over)
		})
	}
}

// TestWaiterBehindDeadPlacesTakesExpiredKey: a waiter queued behind dead
// places, on a key whose holder expires without a release (no release
// sweeps the queue then), still takes the key: its attempts and its
// refreshes search on, a bounded step each.
func TestWaiterBehindDeadPlacesTakesExpiredKey(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	rdb := newGoRedis(t, srv.Addr)
	const ttl = 600 * time.Millisecond
	holder, err := lock.New(redis.New(rdb), lock.WithTTL(ttl), lock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.TryAcquire(ctx, "k"); err != nil { // left to expire
		t.Fatal(err)
	}
	fillDeadPlaces(ctx, t, rdb, "k", 3*500)
	waiter, err := lock.New(redis.New(newGoRedis(t, srv.Addr)), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	wctx, cancel := context.WithTimeout(ctx, 20*ttl)
	defer cancel()
	l, err := waiter.Acquire(wctx, "k")
	if err != nil {
		t.Fatalf("a place behind 1,500 dead ones, the holder expired: %v; want the lock", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkReleaseDeadPlaces measures how long the server is busy with
// one request while a release goes through 300,000 dead places before a
// live one: the longest request in the SLOWLOG (max-ms) and the requests
// over 10ms (over-10ms), per release.
func BenchmarkReleaseDeadPlaces(b *testing.B) {
	srv := redistest.Start(b, redistest.NoPersistence)
	ctx := context.Background()
	rdb := newGoRedis(b, srv.Addr)
	holder := redis.New(rdb)
	defer holder.Close()
	var longest time.Duration
	over := 0
	for b.Loop() {
		b.StopTimer()
		tok := newQueueToken()
		if _, err := holder.Acquire(ctx, "k", tok, queueTTL); err != nil {
			b.Fatal(err)
		}
		fillDeadPlaces(ctx, b, rdb, "k", deadPlaces)
		q, err := holder.Queue("k")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := q.Acquire(ctx, newQueueToken(), queueTTL); !errors.Is(err, backend.ErrLocked) {
			b.Fatalf("a place's attempt on the held key: %v; want ErrLocked", err)
		}
		slow := watchSlowRequests(ctx, b, rdb)
		b.StartTimer()
		if err := holder.Release(ctx, "k", tok); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		l, n := slow()
		longest, over = max(longest, l), over+n
		q.Close(false)
		rdb.Del(ctx, redis.KeysOf(redis.DefaultPrefix, "k")[4])
		b.StartTimer()
	}
	b.ReportMetric(float64(longest)/float64(time.Millisecond), "max-ms")
	b.ReportMetric(float64(over)/float64(b.N), "over-10ms/op")
}

// TestQueueCapped: with WithMaxWaiters(1), a second place finds the queue
// full: it neither queues nor writes a record, and its waiter still gets
// the key, by polling, once the first is done.
func TestQueueCapped(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	rdb := newGoRedis(t, srv.Addr)
	ks := redis.KeysOf(redis.DefaultPrefix, "k")
	holder := redis.New(rdb, redis.WithMaxWaiters(1))
	defer holder.Close()
	tok := holdKey(ctx, t, holder, "k")
	firstB := redis.New(newGoRedis(t, srv.Addr), redis.WithMaxWaiters(1))
	defer firstB.Close()
	first := queueUpOn(ctx, t, firstB, "k")

	second := redis.New(newGoRedis(t, srv.Addr), redis.WithMaxWaiters(1))
	defer second.Close()
	q, err := second.Queue("k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Acquire(ctx, newQueueToken(), queueTTL); !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("a place's attempt on a held key with a full queue: %v; want ErrLocked", err)
	}
	if n := rdb.ZCard(ctx, ks[4]).Val(); n != 1 {
		t.Fatalf("%d places queued; want 1 (the cap)", n)
	}
	if recs := rdb.Keys(ctx, ks[0]+":w:*").Val(); len(recs) != 1 {
		t.Fatalf("records %v; want the first place's alone", recs)
	}
	q.Close(false)

	// End to end: a waiter over the cap polls and gets the key after the
	// first waiter had it.
	c, err := lock.New(second, lock.WithTTL(queueTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		l, err := c.Acquire(wctx, "k")
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	h := first.Handed(t, "the queued waiter")
	if err := holder.Release(ctx, "k", h.Token); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter over the cap: %v; want the key once the queue had room", err)
	}
}
