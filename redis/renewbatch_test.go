package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// TestRenewalsShareAScript: renewals that queue while the wire is busy
// go to the server as one script, and each caller gets its own answer: a
// lease whose key another token took is reported not held, the others
// are renewed.
func TestRenewalsShareAScript(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	direct := newGoRedis(t, srv.Addr)
	px := faultproxy.Start(t, srv.Addr)
	b := redis.New(newGoRedis(t, px.Addr))
	defer b.Close()

	const n, stolen = 64, 7
	toks := make([]string, n)
	for i := range toks {
		toks[i] = newQueueToken()
		if _, err := b.Acquire(ctx, fmt.Sprint("k", i), toks[i], 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	lk := redis.KeysOf(redis.DefaultPrefix, fmt.Sprint("k", stolen))[0]
	if err := direct.Set(ctx, lk, "another owner's token", 30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}

	before := calls(ctx, t, direct, "evalsha")
	px.Hold(faultproxy.ToClient) // the first requests wait on the wire; the rest queue
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range toks {
		wg.Go(func() {
			_, errs[i] = b.Renew(ctx, fmt.Sprint("k", i), toks[i], 50*time.Second)
		})
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for redis.QueuedCalls(b) < n-4 {
		select {
		case <-wctx.Done():
			t.Fatalf("%d renewals queued; want %d behind the 4 on the wire", redis.QueuedCalls(b), n-4)
		case <-time.After(time.Millisecond):
		}
	}
	px.Deliver(faultproxy.ToClient)
	wg.Wait()

	for i, err := range errs {
		switch {
		case i == stolen && !errors.Is(err, backend.ErrNotHeld):
			t.Errorf("the renewal of the key another token took: %v; want ErrNotHeld", err)
		case i != stolen && err != nil:
			t.Errorf("renewal %d: %v; want it renewed", i, err)
		case i != stolen:
			k := redis.KeysOf(redis.DefaultPrefix, fmt.Sprint("k", i))[0]
			if ttl := direct.PTTL(ctx, k).Val(); ttl <= 30*time.Second {
				t.Errorf("renewal %d answered renewed, but the lock's TTL is %v; want over 30s", i, ttl)
			}
		}
	}
	if sent := calls(ctx, t, direct, "evalsha") - before; sent > 8 {
		t.Errorf("the server ran %d scripts for %d renewals; want the queued ones to share one (at most 8)", sent, n)
	}
	if got := direct.Get(ctx, lk).Val(); got != "another owner's token" {
		t.Errorf("the other owner's lock now holds %q", got)
	}
}

// TestRenewBatch: a batch of renewals goes to the server as a few scripts
// (600 renewals: at most 3 of 256), and each renewal gets its own answer:
// renewed, not held (a key another token took), or invalid (a TTL out of
// range, not sent).
func TestRenewBatch(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	direct := newGoRedis(t, srv.Addr)
	b := redis.New(newGoRedis(t, srv.Addr))
	defer b.Close()

	const n, stolen, invalid = 600, 123, 456
	rs := make([]backend.Renewal, n)
	for i := range rs {
		rs[i] = backend.Renewal{Key: fmt.Sprint("k", i), Token: newQueueToken(), TTL: 50 * time.Second}
		if _, err := b.Acquire(ctx, rs[i].Key, rs[i].Token, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	lk := redis.KeysOf(redis.DefaultPrefix, rs[stolen].Key)[0]
	if err := direct.Set(ctx, lk, "another owner's token", 30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	rs[invalid].TTL = time.Hour // over the default maximum
	b.RenewBatch(ctx, rs[:2])   // loads the script (NOSCRIPT the first time)

	before := calls(ctx, t, direct, "evalsha")
	res := b.RenewBatch(ctx, rs)
	sent := calls(ctx, t, direct, "evalsha") - before
	if len(res) != n {
		t.Fatalf("%d results for %d renewals", len(res), n)
	}
	for i, r := range res {
		k := redis.KeysOf(redis.DefaultPrefix, rs[i].Key)[0]
		switch {
		case i == stolen:
			if !errors.Is(r.Err, backend.ErrNotHeld) {
				t.Errorf("the renewal of the key another token took: %v; want ErrNotHeld", r.Err)
			}
		case i == invalid:
			if !errors.Is(r.Err, backend.ErrInvalid) {
				t.Errorf("the renewal with a TTL of an hour: %v; want ErrInvalid", r.Err)
			}
			if ttl := direct.PTTL(ctx, k).Val(); ttl > 30*time.Second {
				t.Errorf("the refused renewal changed the lock's TTL to %v", ttl)
			}
		case r.Err != nil:
			t.Errorf("renewal %d: %v; want it renewed", i, r.Err)
		case r.Grant.TTL != 50*time.Second:
			t.Errorf("renewal %d granted %v; want 50s", i, r.Grant.TTL)
		default:
			if ttl := direct.PTTL(ctx, k).Val(); ttl <= 30*time.Second {
				t.Errorf("renewal %d answered renewed, but the lock's TTL is %v; want over 30s", i, ttl)
			}
		}
	}
	if sent > 3 {
		t.Errorf("the server ran %d scripts for a batch of %d renewals; want at most 3 (256 a script)", sent, n)
	}
	if got := direct.Get(ctx, lk).Val(); got != "another owner's token" {
		t.Errorf("the other owner's lock now holds %q", got)
	}

	// A batch whose context ended answers every renewal with its error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	for i, r := range b.RenewBatch(cctx, rs[:10]) {
		if !errors.Is(r.Err, context.Canceled) {
			t.Errorf("renewal %d of a cancelled batch: %v; want context.Canceled", i, r.Err)
		}
	}
}

// A batch of automatic renewals whose reply is held past the leases'
// deadlines (a fake clock advanced in one step, the real store behind a
// proxy holding its replies): every lease ends lost at its deadline while
// the batch hangs; the late reply (the store did renew them) does not
// bring any back, and the locks it extended are freed, not left for a
// TTL.
func TestLateBatchRevivesNoLease(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	direct := newGoRedis(t, srv.Addr)
	px := faultproxy.Start(t, srv.Addr)
	rdb := goredis.NewClient(&goredis.Options{Addr: px.Addr, MaxRetries: -1, ReadTimeout: -1, WriteTimeout: -1})
	t.Cleanup(func() { rdb.Close() })
	fake := clock.NewFake(time.Now())
	const n, ttl = 40, 6 * time.Second
	locks, err := lock.New(redis.New(rdb), lock.WithClock(fake), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	held := make([]*lock.Lease, n)
	for i := range held {
		if held[i], err = locks.TryAcquire(ctx, fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	before := calls(ctx, t, direct, "evalsha")
	px.Hold(faultproxy.ToClient)
	replies := px.Received(faultproxy.ToClient)
	fake.Advance(ttl / 3) // all due in one firing: one batch, its reply held
	if err := px.WaitReceived(ctx, faultproxy.ToClient, replies+1); err != nil {
		t.Fatal(err)
	}
	fake.AdvanceWait(ttl) // past every deadline
	for i, l := range held {
		select {
		case <-l.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("lease %d not ended past its deadline while its batch hung", i)
		}
	}
	px.Deliver(faultproxy.ToClient)
	if sent := calls(ctx, t, direct, "evalsha") - before; sent > 3 {
		t.Errorf("%d scripts for %d renewals due together; want them in one batch", sent, n)
	}
	// The late reply renewed every lock on the store; the client frees
	// them. Polled for 3s: they would expire on their own 6s after the
	// test began, which takes well under a second.
	lockKeys := make([]string, n)
	for i := range lockKeys {
		lockKeys[i] = redis.KeysOf(redis.DefaultPrefix, fmt.Sprint("k", i))[0]
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		left := direct.Exists(ctx, lockKeys...).Val()
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d locks the late batch extended are still held; want them freed", left, n)
		}
		time.Sleep(10 * time.Millisecond) // polling the store
	}
	for i, l := range held {
		if !errors.Is(l.Err(), lock.ErrLost) {
			t.Errorf("lease %d after the late reply: Err %v; want ErrLost", i, l.Err())
		}
	}
}

// Redlock's batch: each node gets the whole batch in one request, and each
// renewal is decided by its own answers of every node, as Renew decides
// it: a key a majority no longer holds is not held, one a minority lost is
// still renewed, and with a node stopped, one the two others disagree on
// has an unknown outcome (not "not held"); the rest are renewed by the two
// nodes that answer.
func TestRedlockRenewBatch(t *testing.T) {
	srvs := startN(t, 3, redistest.NoPersistence)
	r, rdbs := redlockOver(t, srvs)
	ctx := context.Background()
	const n, gone, minority, invalid = 12, 3, 5, 7
	rs := make([]backend.Renewal, n)
	for i := range rs {
		rs[i] = backend.Renewal{Key: fmt.Sprint("k", i), Token: newQueueToken(), TTL: 20 * time.Second}
		if _, err := r.Acquire(ctx, rs[i].Key, rs[i].Token, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	key := func(i int) string { return redis.KeysOf(redis.DefaultPrefix, rs[i].Key)[0] }
	for i := range rdbs { // every node has every lock (the acquires return on a majority)
		for j := range rs {
			for start := time.Now(); rdbs[i].Exists(ctx, key(j)).Val() == 0; {
				if time.Since(start) > 5*time.Second {
					t.Fatalf("node %d did not get lock %d within 5s", i, j)
				}
				time.Sleep(time.Millisecond) // poll the node
			}
		}
	}
	rdbs[0].Del(ctx, key(gone))
	rdbs[1].Del(ctx, key(gone))
	rdbs[0].Del(ctx, key(minority))
	rs[invalid].TTL = time.Hour

	check := func(res []backend.RenewResult, unknownMinority bool) {
		t.Helper()
		if len(res) != n {
			t.Fatalf("%d results for %d renewals", len(res), n)
		}
		for i, x := range res {
			switch {
			case i == gone:
				if !errors.Is(x.Err, backend.ErrNotHeld) {
					t.Errorf("the lock two nodes lost: %v; want ErrNotHeld", x.Err)
				}
			case i == invalid:
				if !errors.Is(x.Err, backend.ErrInvalid) {
					t.Errorf("the renewal for an hour: %v; want ErrInvalid", x.Err)
				}
			case i == minority && unknownMinority:
				if x.Err == nil || errors.Is(x.Err, backend.ErrNotHeld) {
					t.Errorf("the lock node 0 lost, node 2 stopped: %v; want an unknown outcome", x.Err)
				}
			case x.Err != nil:
				t.Errorf("renewal %d: %v; want it renewed", i, x.Err)
			}
		}
	}
	before := calls(ctx, t, rdbs[1], "evalsha") + calls(ctx, t, rdbs[1], "eval")
	check(r.RenewBatch(ctx, rs), false)
	if sent := calls(ctx, t, rdbs[1], "evalsha") + calls(ctx, t, rdbs[1], "eval") - before; sent > 3 {
		t.Errorf("node 1 ran %d scripts for a batch of %d; want one (and the script's first load)", sent, n)
	}
	if ttl := rdbs[1].PTTL(ctx, key(0)).Val(); ttl <= 10*time.Second {
		t.Errorf("lock 0 on node 1 has %v left after the batch renewed it for 20s", ttl)
	}

	srvs[2].Stop()
	t.Cleanup(srvs[2].Continue)
	check(r.RenewBatch(ctx, rs), true)
	srvs[2].Continue()
}
