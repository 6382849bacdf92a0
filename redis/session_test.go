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
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// sessionClient is a lock.Client over a backend with sessions on srv.
func sessionClient(t *testing.T, srv *redistest.Server, opts ...lock.Option) *lock.Client {
	t.Helper()
	c, err := lock.New(redis.New(newGoRedis(t, srv.Addr), redis.WithSessions(true)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// commandCalls returns how many times the server ran each command.
func commandCalls(t *testing.T, srv *redistest.Server) map[string]int64 {
	t.Helper()
	info, err := newGoRedis(t, srv.Addr).Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		var n int64
		fmt.Sscan(strings.SplitN(rest, ",", 2)[0], &n)
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// A session's leases renew with one PEXPIRE of the session key per batch,
// not a GET and a PEXPIRE per lease: 200 leases renewed together cost the
// server a handful of commands.
func TestSessionRenewsManyLeasesAtOnce(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	b := redis.New(newGoRedis(t, srv.Addr), redis.WithSessions(true))
	defer b.Close()
	ctx := context.Background()
	const n = 200
	ttl := 10 * time.Second
	prefix, err := b.TokenPrefix(ttl)
	if err != nil || !strings.HasPrefix(prefix, "S") || len(prefix) > backend.MaxTokenPrefix {
		t.Fatalf("TokenPrefix: %q, %v; want a session's prefix", prefix, err)
	}
	var rs []backend.Renewal
	for i := range n {
		token := prefix + fmt.Sprintf("%024x", i)
		key := fmt.Sprint("k", i)
		if _, err := b.Acquire(ctx, key, token, ttl); err != nil {
			t.Fatal(err)
		}
		rs = append(rs, backend.Renewal{Key: key, Token: token, TTL: ttl})
	}
	before := commandCalls(t, srv)
	for _, r := range b.RenewBatch(ctx, rs) {
		if r.Err != nil || r.Grant.TTL < ttl {
			t.Fatalf("renewal: %+v; want a grant of %v", r, ttl)
		}
	}
	after := commandCalls(t, srv)
	var ran int64
	for name, calls := range after {
		if name != "info" && name != "hello" && name != "ping" && !strings.HasPrefix(name, "client") {
			ran += calls - before[name]
		}
	}
	if ran > 4 {
		t.Errorf("renewing %d leases of one session ran %d commands on the server (%v before, %v after); want one script and its PEXPIRE", n, ran, before, after)
	}
}

// A lock whose session key is gone is free: another client takes it at
// once, and the holder's next renewal finds its lease lost.
func TestSessionEndedFreesItsLocks(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	a := sessionClient(t, srv, lock.WithTTL(5*time.Second))
	other := sessionClient(t, srv, lock.WithTTL(5*time.Second))
	l, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryAcquire of a held key: %v; want ErrLocked", err)
	}
	rdb := newGoRedis(t, srv.Addr)
	sessions, err := rdb.Keys(ctx, "lock:session:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var ended int
	for _, k := range sessions {
		if !strings.HasSuffix(k, ":locks") {
			rdb.Del(ctx, k) // as if it had expired: the holder's process stopped
			ended++
		}
	}
	if ended != 2 {
		t.Fatalf("session keys %q; want one per client", sessions)
	}
	l2, err := other.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("TryAcquire of a key whose holder's session ended: %v; want the lock", err)
	}
	defer l2.Release(ctx)
	if err := l.Renew(ctx); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Renew of a lease whose session ended: %v; want ErrLost", err)
	}
}

// A lock deleted from outside (lockctl break) while its session lives is
// found by the session's next walk of its lock table: the lease is lost
// within the walk's period (2.5 TTLs) and a renewal.
func TestSessionWalkFindsALockDeletedFromOutside(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	ttl := 200 * time.Millisecond
	a := sessionClient(t, srv, lock.WithTTL(ttl))
	l, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	kept, err := a.Acquire(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Release(ctx)
	if err := newGoRedis(t, srv.Addr).Del(ctx, "lock:{k}").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
		if err := l.Err(); !errors.Is(err, lock.ErrLost) {
			t.Errorf("lease whose lock was deleted from outside ended with %v; want ErrLost", err)
		}
	case <-time.After(10 * ttl):
		t.Fatal("lease whose lock was deleted from outside still held after 10 TTLs")
	}
	if err := kept.Err(); err != nil {
		t.Errorf("the session's other lease: %v; want it held", err)
	}
}

// A session whose key expired never lives again: a grant with one of its
// tokens is refused, whatever arrives late, and takes nothing.
func TestSessionNeverLivesAgain(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	b := redis.New(newGoRedis(t, srv.Addr), redis.WithSessions(true))
	defer b.Close()
	ctx := context.Background()
	ttl := 5 * time.Second
	prefix, err := b.TokenPrefix(ttl)
	if err != nil {
		t.Fatal(err)
	}
	token := prefix + strings.Repeat("a", 32-len(prefix))
	if _, err := b.Acquire(ctx, "k", token, ttl); err != nil {
		t.Fatal(err)
	}
	rdb := newGoRedis(t, srv.Addr)
	sk := "lock:session:" + prefix[1:]
	if err := rdb.Del(ctx, sk).Err(); err != nil {
		t.Fatal(err)
	}
	late := prefix + strings.Repeat("b", 32-len(prefix))
	if _, err := b.Acquire(ctx, "other", late, ttl); !errors.Is(err, backend.ErrContended) {
		t.Errorf("Acquire with a token of an ended session: %v; want a refusal that asks for a new attempt (ErrContended)", err)
	}
	if n := rdb.Exists(ctx, sk, "lock:{other}").Val(); n != 0 {
		t.Errorf("after a grant for an ended session, %d of its session key and the lock exist; want none", n)
	}
	next, err := b.TokenPrefix(ttl)
	if err != nil || next == prefix {
		t.Errorf("TokenPrefix after the session ended: %q, %v; want a new session", next, err)
	}
}

// A lock handed to a waiter of another process with sessions is brought
// into the waiter's session when the waiter confirms it: it then lives as
// long as the waiter's session renews, not only the waiter's TTL. Another
// client never gets it while the waiter holds it, for many TTLs.
func TestSessionHandoverToAnotherProcessLivesWithItsSession(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	ttl := 300 * time.Millisecond
	a := sessionClient(t, srv, lock.WithTTL(ttl))
	b := sessionClient(t, srv, lock.WithTTL(ttl))
	c := sessionClient(t, srv, lock.WithTTL(ttl))
	la, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lock.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := b.Acquire(ctx, "k")
		errc <- err
		got <- l
	}()
	rdb := newGoRedis(t, srv.Addr)
	for rdb.ZCard(ctx, "lock:{k}:q").Val() == 0 {
		time.Sleep(5 * time.Millisecond) // poll the store: b queued
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("the waiter's Acquire: %v", err)
	}
	lb := <-got
	defer lb.Release(ctx)
	until := time.Now().Add(6 * ttl)
	for time.Now().Before(until) {
		if l, err := c.TryAcquire(ctx, "k"); err == nil {
			l.Release(ctx)
			t.Fatalf("another client took the key %v after the handover while its waiter held it (%v)", time.Since(until.Add(-6*ttl)).Round(time.Millisecond), lb.Err())
		}
		if err := lb.Err(); err != nil {
			t.Fatalf("the waiter's lease ended: %v", err)
		}
		time.Sleep(ttl / 6) // poll the store while the lease renews
	}
}

// A client cut off from the server (a partition, or a process stopped for
// longer than its TTL) loses its session: its lease is lost by its own
// deadline, before another client can take the lock (the session key's
// expiry counts from a renewal's arrival, the lease's deadline from its
// send), and once it is back its renewals find the lease lost: a session
// that ended never lives again, and new leases join a new one.
func TestSessionCutOffLosesItsLocksBeforeOthersTakeThem(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	ttl := 300 * time.Millisecond
	px := faultproxy.Start(t, srv.Addr)
	rdb := goredis.NewClient(&goredis.Options{Addr: px.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	cut := redis.New(rdb, redis.WithSessions(true))
	a, err := lock.New(cut, lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	other := sessionClient(t, srv, lock.WithTTL(ttl))
	la, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	before, err := cut.TokenPrefix(ttl)
	if err != nil {
		t.Fatal(err)
	}
	px.Cut()
	var lo *lock.Lease
	// The session key expires a TTL after the last renewal that reached
	// it; the lock key lives sessionSpan TTLs, and must not matter.
	for deadline := time.Now().Add(4 * ttl); lo == nil; {
		if time.Now().After(deadline) {
			t.Fatalf("the key of a client cut off for 4 TTLs is still held: a lock of an ended session is not free")
		}
		if lo, err = other.TryAcquire(ctx, "k"); err == nil {
			select {
			case <-la.Done():
			default:
				t.Fatalf("another client took the key while the cut-off lease was still valid (deadline %v from now)", time.Until(la.Deadline()))
			}
		}
		time.Sleep(ttl / 10) // poll the store while the session expires
	}
	defer lo.Release(ctx)
	px.Heal()
	if err := la.Renew(ctx); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Renew of the cut-off lease after the cut healed: %v; want ErrLost", err)
	}
	if _, err := a.TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
		t.Errorf("TryAcquire by the client that was cut off: %v; want ErrLocked (the other client holds the key)", err)
	}
	after, err := cut.TokenPrefix(ttl)
	if err != nil || after == before {
		t.Errorf("TokenPrefix after the session ended: %q, %v; want a new session (it was %q)", after, err, before)
	}
	if h, err := redis.New(newGoRedis(t, srv.Addr)).Inspect(ctx, "k"); err != nil || h.Token != lo.Token() {
		t.Errorf("Inspect: %+v, %v; want the other client's lease %s", h, err, lo.Token())
	}
}

// Walks that fail (here the session's table is clobbered, so that every
// walk's HSCAN errs) stop extending the session's lock keys: renewals then
// stop granting before the horizon, and the lease is lost by its deadline
// while its lock key still lives. Nobody else can take the key while the
// lease is valid; without the horizon check, the lease would renew on past
// its lock key's expiry (sessionSpan TTLs after the grant).
func TestSessionLateWalksEndTheLeaseBeforeItsLockExpires(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	ttl := 200 * time.Millisecond
	a := sessionClient(t, srv, lock.WithTTL(ttl))
	other := sessionClient(t, srv, lock.WithTTL(ttl))
	l, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	rdb := newGoRedis(t, srv.Addr)
	tables, err := rdb.Keys(ctx, "lock:session:*:locks").Result()
	if err != nil || len(tables) != 1 {
		t.Fatalf("session tables %q, %v; want one", tables, err)
	}
	if err := rdb.Set(ctx, tables[0], "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * ttl); ; {
		if time.Now().After(deadline) {
			t.Fatal("the lease whose walks fail is still held after 30 TTLs")
		}
		if lo, err := other.TryAcquire(ctx, "k"); err == nil {
			left := time.Until(l.Deadline())
			lo.Release(ctx)
			if left > 0 {
				t.Fatalf("another client took the key while the lease was valid (%v left): the lock key expired under it", left)
			}
			break
		}
		time.Sleep(ttl / 10) // poll the store while the walks fail
	}
	if !errors.Is(l.Err(), lock.ErrLost) {
		t.Errorf("lease: %v; want ErrLost", l.Err())
	}
}

// A release whose request never reached the server (its outcome unknown)
// must not leave its lock to the session: the session's walks extend every
// lock in its table for as long as other leases keep the session alive, so
// the lock would outlive its release by any amount (without sessions it
// expires a TTL later). The backend sends the release again at the
// session's next walk, and the lock is free soon after, while the
// session's other lease stays held.
func TestSessionReleaseOfUnknownOutcomeIsSentAgain(t *testing.T) {
	ctx := context.Background()
	ttl := 300 * time.Millisecond
	srv, px, be, token := proxiedSessions(t, ttl)
	var err error
	ta, tb := token(1), token(2)
	for _, l := range []struct{ key, token string }{{"a", ta}, {"b", tb}} {
		if _, err := be.Acquire(ctx, l.key, l.token, ttl); err != nil {
			t.Fatalf("Acquire %s: %v", l.key, err)
		}
	}
	px.Cut()
	rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = be.Release(rctx, "a", ta)
	cancel()
	if err == nil || errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release through a cut connection: %v; want an error of unknown outcome", err)
	}
	px.Reset() // the held release never reaches the server
	px.Heal()
	watch := redis.New(newGoRedis(t, srv.Addr), redis.WithSessions(true))
	defer watch.Close()
	// The session's walks come every 2.5 TTLs; a lock key lives 8 TTLs
	// from its grant without them.
	deadline := time.Now().Add(5 * ttl)
	for {
		if _, err := be.Renew(ctx, "b", tb, ttl); err != nil {
			t.Fatalf("Renew b, the session's other lease: %v", err)
		}
		h, err := watch.Inspect(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		if !h.Held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lock of a release of unknown outcome is still held %v after the fault ended, by %s, while the session lives on", 5*ttl, h.Token)
		}
		time.Sleep(ttl / 3) // renew b on time, as package lock would
	}
	if h, err := watch.Inspect(ctx, "b"); err != nil || h.Token != tb {
		t.Errorf("Inspect b: %+v, %v; want the session's other lease still held", h, err)
	}
}

// A grant of unknown outcome that arrives after its token's cleanup
// release and after the token's tombstone expired (a request stuck on the
// wire for longer than 15s; here the tombstone is deleted instead) would
// take a free key into a live session, whose walks would keep it for as
// long as the session lives. The release of such a token buries it in the
// session's table, and the late grant is refused as for a dead token.
func TestSessionLateGrantOfABuriedTokenTakesNothing(t *testing.T) {
	ctx := context.Background()
	ttl := time.Second
	srv, px, be, token := proxiedSessions(t, ttl)
	var err error
	ta, tb := token(1), token(2)
	if _, err := be.Acquire(ctx, "b", tb, ttl); err != nil {
		t.Fatalf("Acquire b: %v", err)
	}
	px.Freeze(faultproxy.ToServer) // the connection the acquire of a goes out on
	actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = be.Acquire(actx, "a", ta, ttl)
	cancel()
	if err == nil || errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("Acquire through a frozen connection: %v; want an error of unknown outcome", err)
	}
	// The cleanup release goes out on a new connection and is answered.
	if err := be.Release(ctx, "a", ta); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("cleanup Release: %v; want ErrNotHeld (the acquire has not arrived)", err)
	}
	direct := newGoRedis(t, srv.Addr)
	tombs, err := direct.Keys(ctx, "lock:{a}:dead:*").Result()
	if err != nil || len(tombs) != 1 {
		t.Fatalf("tombstones of a: %q, %v; want one", tombs, err)
	}
	if err := direct.Del(ctx, tombs[0]).Err(); err != nil { // as if 15s had passed
		t.Fatal(err)
	}
	if _, err := be.Renew(ctx, "b", tb, ttl); err != nil {
		t.Fatalf("Renew b, which keeps the session alive: %v", err)
	}
	px.Thaw(faultproxy.ToServer) // the acquire of a arrives
	for {
		h, err := direct.Info(ctx, "errorstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(h, "errorstat_DEAD:") {
			break
		}
		if held, err := be.Inspect(ctx, "a"); err != nil || held.Held {
			t.Fatalf("the late grant of a token released before took the key into the live session: %+v, %v", held, err)
		}
		time.Sleep(time.Millisecond) // poll the server until the late grant ran
	}
	if h, err := be.Inspect(ctx, "a"); err != nil || h.Held {
		t.Errorf("Inspect a after the late grant: %+v, %v; want free", h, err)
	}
}

// proxiedSessions starts a server and a backend with sessions that
// reaches it through a fault proxy (go-redis sends nothing again), and
// returns them with a maker of the n-th token of the session that leases
// of ttl join.
func proxiedSessions(t *testing.T, ttl time.Duration) (*redistest.Server, *faultproxy.Proxy, *redis.Backend, func(n int) string) {
	t.Helper()
	srv := redistest.Start(t, redistest.NoPersistence)
	px := faultproxy.Start(t, srv.Addr)
	rdb := goredis.NewClient(&goredis.Options{Addr: px.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	be := redis.New(rdb, redis.WithSessions(true))
	t.Cleanup(func() { be.Close() })
	prefix, err := be.TokenPrefix(ttl)
	if err != nil {
		t.Fatal(err)
	}
	return srv, px, be, func(n int) string { return prefix + fmt.Sprintf("%032x", n)[len(prefix):] }
}
