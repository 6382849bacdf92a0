package redis_test

// One test per history of issue 8: each reproduced two leases valid at once,
// a late lost signal, or a lock left behind, on real redis-server processes.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock"
	"github.com/distlock/lock/clock"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/internal/redistest"
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
	px := faultproxy.Start(t, srv.Addr)
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

// proxiedLocks returns a client of srv whose every byte passes through a
// fault proxy of its own, and the proxy. retries turns go-redis's own
// retries on (its default: three), as an application's client has them.
func proxiedLocks(t *testing.T, srv *redistest.Server, retries bool, opts ...lock.Option) (*lock.Client, *faultproxy.Proxy) {
	t.Helper()
	px := faultproxy.Start(t, srv.Addr)
	o := &goredis.Options{Addr: px.Addr, ContextTimeoutEnabled: true, MaxRetries: -1}
	if retries {
		o.MaxRetries = 0 // go-redis's default
	}
	rdb := goredis.NewClient(o)
	t.Cleanup(func() { rdb.Close() })
	return newLocks(t, redis.New(rdb), opts...), px
}

// warmUp runs a handoff between two goroutines of locks on a key of its
// own, so that the server has cached the acquire, transfer and release
// scripts: a fault test's request then runs at once instead of being
// answered NOSCRIPT and sent again.
func warmUp(t *testing.T, locks *lock.Client) {
	t.Helper()
	ctx := context.Background()
	a, err := locks.Acquire(ctx, "warm-up")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lock.Lease, 1)
	go func() {
		l, err := locks.Acquire(ctx, "warm-up")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitQueued(t, locks, "warm-up", 1)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if b := <-got; b != nil {
		b.Release(ctx)
	}
}

// History 2: a transfer whose reply is late, then the waiter asks the store
// with the token the transfer gave the lock to. The store had moved the
// lock to the waiter's token (expiry +1 s); the release gave up after 300
// ms; the waiter acquired with the same token, the script answered "already
// yours" without touching the expiry, and the lease's deadline was counted
// from this later send. Every store attempt now has a fresh token, and the
// transfer's token is freed.
func TestLateTransferReplyThenAcquire(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	locks, px := proxiedLocks(t, srv, false, lock.WithTTL(time.Second), lock.WithAutoRenew(false))
	ctx := context.Background()
	warmUp(t, locks)
	a, err := locks.Acquire(ctx, "late")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lock.Lease, 1)
	go func() {
		l, err := locks.Acquire(ctx, "late")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitQueued(t, locks, "late", 1)

	px.Hold(faultproxy.ToClient) // the store acts; its replies are late
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := a.Release(rctx); err == nil {
		t.Fatal("Release returned nil while its reply was held")
	}
	px.Deliver(faultproxy.ToClient)
	w := <-got
	if w == nil {
		t.FailNow()
	}
	checkWithinStore(t, rdb, "late", w)

	other := newLocks(t, redis.New(newGoRedis(t, srv.Addr)))
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	o, err := other.Acquire(wctx, "late")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Release(ctx)
	if w.Err() == nil {
		t.Fatalf("another client holds the key while the waiter's lease reports Err nil, valid %v more", time.Until(w.Deadline()))
	}
}

// History 7: a release that go-redis sent again after the reply to the
// first was lost (connection reset after the store ran it) found the key
// free and reported the lease as lost, for a lease held until its release.
// A released token's tombstone now answers the second release.
func TestRetriedReleaseSucceeds(t *testing.T) {
	rdb, _, px, l := heldBehindProxy(t, "retried")
	ctx := context.Background()
	// The release runs on the store; its reply is lost with the
	// connection, and go-redis sends it again.
	if err := releaseReplyLost(t, px, l, func() bool { return rdb.Exists(ctx, "lock:{retried}").Val() == 0 }, func() {}); err != nil {
		t.Fatalf("Release of a lease held until its release, after a lost reply: %v; want nil", err)
	}
	if !errors.Is(l.Err(), lock.ErrReleased) {
		t.Fatalf("Err after the release: %v", l.Err())
	}
}

// History 8 (found by the simulation, seeds 6317847534956863407 and
// 391199497366984431 of TestSimRedis): a lease that handed its lock to the
// next goroutine of its client reported itself lost. The transfer ran on
// the store, its reply was lost with the connection, and go-redis sent it
// again; the copy landed after the waiter's TTL had run out (the waiter
// never learned that it held the lock), found the lock gone, and answered
// "not held": Release returned ErrLost for a lease held until its release.
// A transfer now kills its from token as a release does: the copy answers
// that the lock was handed on (an unknown outcome for the waiter, who asks
// the store again), and the release of from succeeds.
func TestRetriedTransferAfterTheWaitersTTLIsNoLoss(t *testing.T) {
	const key = "retried-transfer"
	rdb, locks, px, l := heldBehindProxy(t, key)
	ctx := context.Background()
	const waiterTTL = 300 * time.Millisecond
	waiter := make(chan error, 1)
	go func() {
		w, err := locks.Acquire(ctx, key, lock.WithTTL(waiterTTL))
		if err == nil {
			err = w.Release(ctx)
		}
		waiter <- err
	}()
	for locks.Waiting(key) < 1 {
		time.Sleep(time.Millisecond)
	}
	// The transfer runs on the store (the lock is the waiter's); its
	// reply is lost with the connection once the waiter's TTL has run
	// out, and go-redis sends the transfer again.
	transferred := func() bool { return rdb.Get(ctx, "lock:{"+key+"}").Val() != l.Token() }
	waitOut := func() { time.Sleep(waiterTTL + 50*time.Millisecond) } // the waiter's lock expires unused
	if err := releaseReplyLost(t, px, l, transferred, waitOut); err != nil {
		t.Fatalf("Release of a lease held until it handed its lock on, after the transfer's lost reply: %v; want nil", err)
	}
	if !errors.Is(l.Err(), lock.ErrReleased) {
		t.Fatalf("Err after the release: %v", l.Err())
	}
	if err := <-waiter; err != nil {
		t.Fatalf("the waiter, which asks the store again after the transfer's unknown outcome: %v", err)
	}
}

// heldBehindProxy starts redis-server and a client whose connection goes
// through a fault proxy (go-redis retries on), TTL 5s without automatic
// renewal, and returns a direct client, the lock client, the proxy and a
// lease of key.
func heldBehindProxy(t *testing.T, key string) (*goredis.Client, *lock.Client, *faultproxy.Proxy, *lock.Lease) {
	t.Helper()
	srv := redistest.Start(t, redistest.NoPersistence)
	locks, px := proxiedLocks(t, srv, true, lock.WithTTL(5*time.Second), lock.WithAutoRenew(false))
	warmUp(t, locks)
	l, err := locks.Acquire(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return newGoRedis(t, srv.Addr), locks, px, l
}

// releaseReplyLost releases l with the proxy holding the replies, waits
// until the release's request reached the store and ran (ran polls the
// store), calls meanwhile, and then loses the reply with the connection, so
// that go-redis sends the request again; it returns Release's answer.
func releaseReplyLost(t *testing.T, px *faultproxy.Proxy, l *lock.Lease, ran func() bool, meanwhile func()) error {
	t.Helper()
	ctx := context.Background()
	px.Hold(faultproxy.ToClient)
	sent := px.Forwarded(faultproxy.ToServer)
	released := make(chan error, 1)
	go func() { released <- l.Release(ctx) }()
	if err := px.WaitForwarded(ctx, faultproxy.ToServer, sent); err != nil {
		t.Fatal(err)
	}
	for !ran() {
		time.Sleep(time.Millisecond) // poll the store until the request ran
	}
	meanwhile()
	px.Reset()
	px.Deliver(faultproxy.ToClient)
	return <-released
}

// History 6: acquires cancelled under ordinary load left their locks on the
// store: a call already taken into a pipeline returned at once when its
// context ended, and the cleanup release, sent on another connection, ran
// before the pipeline's acquire. The release now kills the token, and the
// late acquire is refused.
func TestCancelledAcquiresLeaveNothing(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	locks := newLocks(t, redis.New(newGoRedis(t, srv.Addr)), lock.WithTTL(time.Minute))
	ctx := context.Background()
	const goroutines = 48
	stop := time.Now().Add(2 * time.Second)
	var cancelled atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			key := fmt.Sprintf("cancel:%d", g)
			for i := 0; time.Now().Before(stop); i++ {
				actx, cancel := context.WithTimeout(ctx, time.Duration(i%4)*time.Millisecond)
				l, err := locks.Acquire(actx, key)
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Error(err)
						return
					}
					cancelled.Add(1)
					continue
				}
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := locks.Close(); err != nil { // waits for the cleanups
		t.Fatal(err)
	}
	left := 0
	for _, k := range keysLeft(t, rdb) {
		if strings.HasSuffix(k, "}") { // a lock key, not a fence counter
			left++
		}
	}
	t.Logf("%d acquires cancelled; %d locks left", cancelled.Load(), left)
	if cancelled.Load() == 0 {
		t.Fatal("no acquire was cancelled: the test did not test anything")
	}
	if left != 0 {
		t.Fatalf("%d locks left on the store after %d cancelled acquires and Close", left, cancelled.Load())
	}
}

// proxiedRedlock returns a Redlock client over srvs whose links to each node
// pass through fault proxies of its own, and the proxies, in node order.
func proxiedRedlock(t *testing.T, srvs []*redistest.Server, opts ...lock.Option) (*lock.Client, []*faultproxy.Proxy) {
	return proxiedRedlockWith(t, srvs, nil, opts...)
}

// proxiedRedlockWith is proxiedRedlock with options for the Redlock.
func proxiedRedlockWith(t *testing.T, srvs []*redistest.Server, ropts []redis.Option, opts ...lock.Option) (*lock.Client, []*faultproxy.Proxy) {
	t.Helper()
	var nodes []redis.Conn
	var proxies []*faultproxy.Proxy
	for _, s := range srvs {
		px := faultproxy.Start(t, s.Addr)
		proxies = append(proxies, px)
		nodes = append(nodes, newGoRedis(t, px.Addr))
	}
	r, err := redis.NewRedlock(nodes, append([]redis.Option{redis.WithNodeTimeout(200 * time.Millisecond)}, ropts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return newLocks(t, r, opts...), proxies
}

// exclusive records holders of one key and fails t when one acquires while
// another's lease is still valid.
type exclusive struct {
	mu  sync.Mutex
	cur *lock.Lease
	who string
}

func (e *exclusive) acquired(t *testing.T, who string, l *lock.Lease) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur != nil && e.cur.Err() == nil {
		t.Errorf("%s acquired while %s's lease is valid for %v more: two valid leases", who, e.who, time.Until(e.cur.Deadline()))
	}
	e.cur, e.who = l, who
	t.Logf("%s acquired, fence %d, valid for %v", who, l.Fence(), time.Until(l.Deadline()).Round(time.Millisecond))
}

// History 5: Redlock, a lost undo, and the next attempt reused the token.
// W's first attempt took node A; its undo there was lost. W's next attempt,
// with the same token, counted A's lock from the first attempt with B as a
// majority, and got a deadline counted from the second attempt; Y took
// {A, C} when A's lock expired, while W's lease was valid. Every attempt
// now has a fresh token, so a lock left by an earlier one is another
// owner's.
func TestRedlockAttemptCountsOnlyItsOwnGrants(t *testing.T) {
	srvs := startN(t, 3, redistest.NoPersistence)
	opts := []lock.Option{lock.WithTTL(4 * time.Second), lock.WithAutoRenew(false)}
	warm, _ := proxiedRedlock(t, srvs, opts...)
	warmUp(t, warm)
	x, xp := proxiedRedlock(t, srvs, opts...)
	w, wp := proxiedRedlock(t, srvs, opts...)
	y, yp := proxiedRedlock(t, srvs, opts...)
	ctx := context.Background()
	const A, B, C = 0, 1, 2

	xp[A].Cut() // X holds {B, C}
	xl, err := x.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var ex exclusive
	ex.acquired(t, "X", xl)

	// W's first attempt takes A; B and C are X's. B's reply to W is held
	// until W's link to A drops requests, so that W's undo on A is lost
	// (and so is W's subscription to A's wake-ups, which holds W's next
	// attempt back for the notifier's confirmation timeout, 2s).
	wp[B].Hold(faultproxy.ToClient)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		l, err := w.Acquire(wctx, "k")
		if err != nil {
			if wctx.Err() == nil {
				t.Errorf("W: %v", err)
			}
			return
		}
		ex.acquired(t, "W", l)
	})
	nodeA := newGoRedis(t, srvs[A].Addr)
	for nodeA.Get(ctx, "lock:{k}").Val() == "" {
		time.Sleep(time.Millisecond) // poll node A until W's attempt took it
	}
	wp[A].Drop(faultproxy.ToServer)
	wp[B].Deliver(faultproxy.ToClient)
	time.Sleep(400 * time.Millisecond) // the lost undo and subscription are sent
	// C goes away for W, X releases, and A comes back for W: W's next
	// attempt sees A (still locked by its first attempt) and B (free).
	wp[C].Cut()
	ex.mu.Lock()
	ex.cur = nil // X's release is in order
	ex.mu.Unlock()
	if err := xl.Release(ctx); err != nil {
		t.Fatalf("X's release: %v", err)
	}
	wp[A].Pass(faultproxy.ToServer)
	// Y cannot reach B: it can only ever hold {A, C}.
	yp[B].Cut()
	yctx, ycancel := context.WithTimeout(ctx, 10*time.Second)
	defer ycancel()
	yl, err := y.Acquire(yctx, "k")
	if err != nil {
		t.Fatalf("Y: %v", err)
	}
	ex.acquired(t, "Y", yl)
	yl.Release(ctx)
	wcancel()
}

// History 4: Redlock, one node restarted empty, under partial partitions.
// Nodes A, B, C; B and C run appendfsync always and never restart. X
// acquired while C was out of its reach: X held {A, B}. A was killed and
// restarted empty. Y, cut off from B, acquired {A, C} while X's lease was
// valid, with X's fence. A node that comes back empty now votes only after
// the maximum TTL, once it has adopted the others' fence counters.
func TestRedlockNodeBackEmptyDoesNotVote(t *testing.T) {
	a := redistest.Start(t, redistest.NoPersistence)
	srvs := []*redistest.Server{a, redistest.Start(t, redistest.AOFAlways), redistest.Start(t, redistest.AOFAlways)}
	initNodes(t, srvs)
	const A, B, C = 0, 1, 2
	const maxTTL = 2 * time.Second
	ropts := []redis.Option{redis.WithMaxTTL(maxTTL)}
	opts := []lock.Option{lock.WithTTL(maxTTL)} // renewed automatically
	warm, _ := proxiedRedlockWith(t, srvs, ropts, opts...)
	warmUp(t, warm)
	x, xp := proxiedRedlockWith(t, srvs, ropts, opts...)
	y, yp := proxiedRedlockWith(t, srvs, ropts, opts...)
	z, _ := proxiedRedlockWith(t, srvs, ropts, opts...)
	ctx := context.Background()

	xp[C].Cut() // X holds {A, B}
	xl, err := x.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var ex exclusive
	ex.acquired(t, "X", xl)
	a.Restart(false) // A forgets X's lock and the fence counter
	yp[B].Cut()      // Y can only ever hold {A, C}

	// Y tries every 50ms; Z, which reaches every node, makes A adopt the
	// counters once its wait is over.
	deadline := time.Now().Add(20 * time.Second)
	var yl *lock.Lease
	for yl == nil {
		if time.Now().After(deadline) {
			t.Fatal("Y never acquired {A, C}: A never voted again")
		}
		l, err := y.TryAcquire(ctx, "k")
		switch {
		case err == nil:
			yl = l
		case errors.Is(err, lock.ErrInvalid) || errors.Is(err, lock.ErrClosed):
			t.Fatal(err)
		default:
			if zl, err := z.TryAcquire(ctx, "elsewhere"); err == nil {
				zl.Release(ctx)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ex.acquired(t, "Y", yl)
	if yl.Fence() <= xl.Fence() {
		t.Errorf("Y's fence %d after X's %d: a node back empty repeated a fence", yl.Fence(), xl.Fence())
	}
	if !errors.Is(xl.Err(), lock.ErrLost) {
		t.Errorf("X after A forgot its lock: %v; want lost", xl.Err())
	}
	yl.Release(ctx)
}
