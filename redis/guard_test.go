package redis_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// SetIfHeld writes only while the lease's token holds the lock on the
// server: a holder whose lock is gone (here deleted from outside, as an
// expiry during a pause would) is refused, before and after a successor
// took the key, while its own client still counts the lease as valid.
func TestSetIfHeld(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	b := redis.New(rdb)
	locks := newLocks(t, b, lock.WithTTL(10*time.Second))
	other := newLocks(t, redis.New(newGoRedis(t, srv.Addr)), lock.WithTTL(10*time.Second))
	ctx := context.Background()

	l, err := locks.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	data := "result" + b.HashTag("job")
	if err := b.SetIfHeld(ctx, l, data, "1", 0); err != nil {
		t.Fatalf("SetIfHeld while held: %v", err)
	}
	if err := b.SetIfHeld(ctx, l, data, "2", time.Minute); err != nil {
		t.Fatalf("SetIfHeld with an expiry while held: %v", err)
	}
	if v, _ := rdb.Get(ctx, data).Result(); v != "2" {
		t.Fatalf("data key holds %q; want 2", v)
	}
	if ttl, _ := rdb.PTTL(ctx, data).Result(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("data key expiry %v; want within a minute", ttl)
	}

	// The lock vanishes on the server (what an expiry during a long pause
	// does); the client still counts the lease as valid.
	lockKeys, err := rdb.Keys(ctx, "*"+b.HashTag("job")).Result()
	if err != nil {
		t.Fatal(err)
	}
	deleted := 0
	for _, k := range lockKeys {
		if v, _ := rdb.Get(ctx, k).Result(); v == l.Token() || v == l.Token()+"+" {
			rdb.Del(ctx, k)
			deleted++
		}
	}
	if deleted != 1 {
		t.Fatalf("found %d lock keys holding the token among %v: the case tests nothing", deleted, lockKeys)
	}
	if l.Err() != nil {
		t.Fatalf("the lease ended already (%v): the case tests nothing", l.Err())
	}
	if err := b.SetIfHeld(ctx, l, data, "stale-1", 0); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("SetIfHeld after the lock vanished: %v; want ErrNotHeld", err)
	}
	succ, err := other.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatalf("the successor's TryAcquire: %v", err)
	}
	if err := b.SetIfHeld(ctx, l, data, "stale-2", 0); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("SetIfHeld of the old holder while a successor holds the key: %v; want ErrNotHeld", err)
	}
	if v, _ := rdb.Get(ctx, data).Result(); v != "2" {
		t.Fatalf("data key holds %q after refused writes; want 2", v)
	}
	succ.Release(ctx)

	// An ended lease sends nothing; bad input changes nothing.
	l.Release(ctx)
	if err := b.SetIfHeld(ctx, l, data, "3", 0); !errors.Is(err, lock.ErrLost) && !errors.Is(err, lock.ErrReleased) {
		t.Fatalf("SetIfHeld with an ended lease: %v; want ErrLost or ErrReleased", err)
	}
	l2, err := locks.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(ctx)
	for name, err := range map[string]error{
		"nil lease":        b.SetIfHeld(ctx, nil, data, "x", 0),
		"empty key":        b.SetIfHeld(ctx, l2, "", "x", 0),
		"negative expiry":  b.SetIfHeld(ctx, l2, data, "x", -time.Second),
		"expiry below 1ms": b.SetIfHeld(ctx, l2, data, "x", time.Microsecond),
		"nil context":      b.SetIfHeld(nil, l2, data, "x", 0),
	} {
		if !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", name, err)
		}
	}
	if v, _ := rdb.Get(ctx, data).Result(); v != "2" {
		t.Fatalf("data key holds %q after bad input; want 2", v)
	}
}

// A lease that goroutines of one client hand over ahead of the store is
// confirmed before the guarded write: every holder's write goes through,
// and the writes never interleave.
func TestSetIfHeldAfterLocalHandover(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	b := redis.New(rdb)
	locks := newLocks(t, b, lock.WithTTL(10*time.Second))
	ctx := context.Background()
	data := "counter" + b.HashTag("hot")
	const goroutines, rounds = 4, 25
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range rounds {
				l, err := locks.Acquire(ctx, "hot")
				if err != nil {
					t.Error(err)
					return
				}
				n, err := rdb.Get(ctx, data).Int()
				if err != nil && !errors.Is(err, goredis.Nil) {
					t.Error(err)
				}
				if err := b.SetIfHeld(ctx, l, data, strconv.Itoa(n+1), 0); err != nil {
					t.Errorf("SetIfHeld: %v", err)
				}
				l.Release(ctx)
			}
		})
	}
	wg.Wait()
	if n, _ := rdb.Get(ctx, data).Int(); n != goroutines*rounds {
		t.Fatalf("counter %d after %d guarded increments; want %d", n, goroutines*rounds, goroutines*rounds)
	}
}
