package redis_test

// One test per history of issue 8: each reproduced two leases valid at once,
// a late lost signal, or a lock left behind, on real redis-server processes.

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock"
	"github.com/distlock/lock/clock"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/internal/tcpproxy"
	"github.com/distlock/lock/redis"
)

// checkWithinStore fails t when l's deadline is later than the store's
// expiry of l's lock: the store's PTTL for the lock key, read now, counted
// from the end of the read (the latest the store can have measured it), and
// the lock must be l's.
func checkWithinStore(t *testing.T, rdb *goredis.Client, key string, l *lock.Lease) {
	t.Helper()
	ctx := context.Background()
	lk := "lock:{" + key + "}"
	v, err := rdb.Get(ctx, lk).Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		t.Fatal(err)
	}
	pttl, err := rdb.PTTL(ctx, lk).Result()
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if l.Err() != nil {
		return // lost: no claim left to check
	}
	if v != l.Token() && v != l.Token()+"+" {
		t.Fatalf("lease valid until %v (%v from now), but the store holds the lock for %q, not for its token %q", l.Deadline(), time.Until(l.Deadline()), v, l.Token())
	}
	if storeExpiry := after.Add(pttl + time.Millisecond); l.Deadline().After(storeExpiry) {
		t.Fatalf("lease valid until %v from now, the store expires its lock %v from now: the deadline is later than the store's expiry", time.Until(l.Deadline()).Round(time.Millisecond), pttl)
	}
}

// History 1: a lock handed over ahead of the store, to a waiter with a
// shorter TTL than the releasing holder's. The handed lease started with
// the previous holder's deadline (10 s away) while the transfer set the
// store's expiry to 500 ms: another client took the key while the lease
// still reported Err nil. A handed lease is now bounded by its own TTL
// from before the transfer was sent (validity.inherit).
func TestHandoverToShorterTTL(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	locks := newLocks(t, redis.New(newGoRedis(t, srv.Addr)), lock.WithTTL(10*time.Second))
	ctx := context.Background()

	a, err := locks.Acquire(ctx, "short")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lock.Lease, 2)
	acquire := func(opts ...lock.Option) {
		l, err := locks.Acquire(ctx, "short", opts...)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}
	go acquire() // B, TTL 10 s
	waitQueued(t, locks, "short", 1)
	go acquire(lock.WithTTL(500*time.Millisecond), lock.WithAutoRenew(false)) // C
	waitQueued(t, locks, "short", 2)
	if err := a.Release(ctx); err != nil { // to B, reserving C's fence
		t.Fatal(err)
	}
	b := <-got
	if err := b.Release(ctx); err != nil { // to C, ahead of the store
		t.Fatal(err)
	}
	c := <-got
	if c.TTL() != 500*time.Millisecond {
		t.Fatalf("C's TTL %v", c.TTL())
	}
	if left := time.Until(c.Deadline()); left > 500*time.Millisecond {
		t.Fatalf("a lease of TTL 500ms handed over ahead of the store is valid for %v", left)
	}
	// Once the handover has landed, the store's expiry is C's own.
	if err := c.Renew(ctx); err != nil { // waits for the handover
		t.Fatal(err)
	}
	checkWithinStore(t, rdb, "short", c)

	// Another client takes the key when the store frees it; C must be lost
	// by then.
	other := newLocks(t, redis.New(newGoRedis(t, srv.Addr)))
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	o, err := other.Acquire(wctx, "short")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Release(ctx)
	if c.Err() == nil {
		t.Fatalf("another client holds the key while the handed-over lease reports Err nil, valid %v more", time.Until(c.Deadline()))
	}
	if o.Fence() <= c.Fence() {
		t.Fatalf("fence %d after %d", o.Fence(), c.Fence())
	}
}

// History 3: the lost signal starved behind hanging renewals. A process
// holds 70 auto-renewed leases and one lease Z without renewal; its network
// is cut and a pause makes every renewal and Z's deadline fall due in one
// firing of the scheduler (here the pause is a fake clock advanced in one
// step: deterministic, with the real store behind a cut proxy). Z's tick
// waited for a slot among 64 renewals that hung; now deadlines are checked
// before any renewal starts.
func TestLostSignalNotBehindHangingRenewals(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	px := tcpproxy.Start(t, srv.Addr)
	rdb := goredis.NewClient(&goredis.Options{Addr: px.Addr, MaxRetries: -1, ReadTimeout: -1, WriteTimeout: -1, PoolSize: 100})
	t.Cleanup(func() { rdb.Close() })
	fake := clock.NewFake(time.Now())
	locks := newLocks(t, redis.New(rdb), lock.WithClock(fake), lock.WithTTL(6*time.Second))
	ctx := context.Background()
	var held []*lock.Lease
	for i := range 70 {
		l, err := locks.TryAcquire(ctx, "renewed:"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	fake.AdvanceWait(1500 * time.Millisecond) // the renewals are due at 2s
	z, err := locks.TryAcquire(ctx, "z", lock.WithTTL(time.Second), lock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	zDone := z.Done() // taken before the pause: Done checks the deadline itself
	px.Cut()          // renewals hang from now on
	defer px.Heal()
	// Past the renewals' time and then Z's deadline (2.49s), at once.
	fake.Advance(1500 * time.Millisecond)
	select {
	case <-zDone:
	case <-time.After(10 * time.Second): // a hang bound: the renewals never return while cut
		t.Fatal("Z's deadline passed, but its lost signal waits behind renewals hanging on a cut network")
	}
	if !errors.Is(z.Err(), lock.ErrLost) {
		t.Fatalf("Z: %v", z.Err())
	}
	for _, l := range held {
		if l.Err() != nil {
			t.Fatalf("a lease with 2.9s of validity left is lost: %v", l.Err())
		}
	}
	px.Heal()
}
