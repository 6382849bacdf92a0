package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/etcd"
)

// The whole suite with sessions: the self-renewing leases of one TTL share
// an etcd lease.
func TestConformanceSessions(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		return &harness{t: t, srv: startEtcd(t), sessions: true}
	}, conformance.RequireHooks())
}

// Seeded randomized fault runs with sessions.
func TestFaultRunsSessions(t *testing.T) {
	conformance.RunFaults(t, func(t *testing.T) conformance.Harness {
		return &harness{t: t, srv: startEtcd(t), sessions: true}
	})
}

// sessionTokens returns n tokens of the session that b's leases of ttl
// join now, as package lock makes them.
func sessionTokens(t *testing.T, b *etcd.Backend, ttl time.Duration, n int) []string {
	t.Helper()
	p, err := b.TokenPrefix(ttl)
	if err != nil || len(p) != 8 || p[0] != 'S' {
		t.Fatalf("TokenPrefix: %q, %v; want S and a session id", p, err)
	}
	out := make([]string, n)
	for i := range out {
		out[i] = p + newToken()[len(p):]
	}
	return out
}

// A batch of renewals of many locks of one session sends one keep-alive,
// and each lock still gets its own answer: one deleted from outside is
// reported lost, the others renewed.
func TestSessionRenewsManyLocksWithOneKeepAlive(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	var n atomic.Int64
	cli := countingClient(t, &n, srv.Addr)
	b, err := etcd.New(cli, etcd.WithElectionTimeout(electionTimeout), etcd.WithSessions(true))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ttl := 2 * time.Second
	toks := sessionTokens(t, b, ttl, 50)
	var rs []backend.Renewal
	for i, tok := range toks {
		key := fmt.Sprintf("k%d", i)
		if _, err := b.Acquire(ctx, key, tok, ttl); err != nil {
			t.Fatalf("Acquire %s: %v", key, err)
		}
		rs = append(rs, backend.Renewal{Key: key, Token: tok, TTL: ttl})
	}
	leases := map[clientv3.LeaseID]bool{}
	for _, tok := range toks {
		leases[leaseOf(ctx, t, cli, tok)] = true
	}
	if len(leases) != 1 {
		t.Fatalf("the 50 locks are on %d leases; want one, the session's", len(leases))
	}
	if _, err := cli.Delete(ctx, etcd.LockKey(b, "k7")); err != nil {
		t.Fatal(err)
	}
	before := n.Load()
	res := b.RenewBatch(ctx, rs)
	sent := n.Load() - before
	for i, r := range res {
		switch {
		case i == 7 && !errors.Is(r.Err, backend.ErrNotHeld):
			t.Errorf("renewal of the lock deleted from outside: %v; want ErrNotHeld", r.Err)
		case i != 7 && (r.Err != nil || r.Grant.TTL < ttl):
			t.Errorf("renewal %d: %+v; want the TTL", i, r)
		}
	}
	// One keep-alive message and one read-only transaction.
	if sent > 3 {
		t.Errorf("a batch of 50 renewals of one session sent %d requests; want at most 3 (one keep-alive, one read)", sent)
	}
}

// Releasing one lock of a session leaves the others held and renewing:
// the session's lease is never revoked.
func TestSessionReleaseLeavesTheOtherLocks(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	b, cli := newBackend(t, srv.Addr, etcd.WithSessions(true))
	ttl := 2 * time.Second
	toks := sessionTokens(t, b, ttl, 2)
	for i, tok := range toks {
		if _, err := b.Acquire(ctx, fmt.Sprint("k", i), tok, ttl); err != nil {
			t.Fatal(err)
		}
	}
	id := leaseOf(ctx, t, cli, toks[1])
	if err := b.Release(ctx, "k0", toks[0]); err != nil {
		t.Fatalf("Release k0: %v", err)
	}
	if _, err := b.Renew(ctx, "k1", toks[1], ttl); err != nil {
		t.Fatalf("Renew k1 after k0's release: %v", err)
	}
	if got := leaseOf(ctx, t, cli, toks[1]); got != id || id == clientv3.NoLease {
		t.Errorf("k1's lease after k0's release: %x; want the session's %x", got, id)
	}
	// A release of a token the store no longer has (a cleanup) revokes
	// nothing either.
	if err := b.Release(ctx, "k0", toks[0]); err != nil {
		t.Fatalf("Release k0 again: %v; want nil (released before)", err)
	}
	if _, err := b.Renew(ctx, "k1", toks[1], ttl); err != nil {
		t.Fatalf("Renew k1: %v", err)
	}
}

// Another backend releasing a token of a session (the right token, say
// from lockctl) must not revoke the lease it finds under the key: that
// lease carries the session's other locks, whose holders' deadlines lie
// ahead. And it does not renew another client's session either.
func TestForeignReleaseRevokesNoSessionLease(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	b, cli := newBackend(t, srv.Addr, etcd.WithSessions(true))
	other, _ := newBackend(t, srv.Addr)
	ttl := 2 * time.Second
	toks := sessionTokens(t, b, ttl, 2)
	for i, tok := range toks {
		if _, err := b.Acquire(ctx, fmt.Sprint("k", i), tok, ttl); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.Renew(ctx, "k1", toks[1], ttl); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("another backend's Renew of a session's lock: %v; want ErrInvalid", err)
	}
	if err := other.Release(ctx, "k0", toks[0]); err != nil {
		t.Fatalf("another backend's Release of k0: %v", err)
	}
	if leaseOf(ctx, t, cli, toks[1]) == clientv3.NoLease {
		t.Fatalf("k1 is gone after another backend released k0: the session's lease was revoked")
	}
	if _, err := b.Renew(ctx, "k1", toks[1], ttl); err != nil {
		t.Fatalf("Renew k1: %v", err)
	}
}

// A client cut off from the store for longer than its TTL loses every
// lock of its session by its own deadline, before another client takes
// any of them; back, its renewals find them lost, and a new lease joins a
// new session.
func TestSessionCutOffLosesItsLocksBeforeOthersTakeThem(t *testing.T) {
	cut, px, addr := proxiedSessions(t)
	ctx := ctxFor(t)
	ttl := time.Second
	a, err := lock.New(cut, lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ob, _ := newBackend(t, addr)
	o, err := lock.New(ob, lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	var held []*lock.Lease
	for i := range 3 {
		l, err := a.Acquire(ctx, fmt.Sprint("k", i))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	before, err := cut.TokenPrefix(ttl)
	if err != nil {
		t.Fatal(err)
	}
	px.Cut()
	for i, l := range held {
		key := fmt.Sprint("k", i)
		lo, err := o.Acquire(ctx, key) // waits for the session's lease to expire
		if err != nil {
			t.Fatalf("Acquire %s by the other client: %v", key, err)
		}
		select {
		case <-l.Done():
		default:
			t.Fatalf("the other client took %s while the cut-off lease was valid (deadline %v from now)", key, time.Until(l.Deadline()))
		}
		defer lo.Release(ctx)
	}
	px.Heal()
	if err := held[0].Renew(ctx); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Renew of a cut-off lease after the cut healed: %v; want ErrLost", err)
	}
	l, err := a.Acquire(ctx, "fresh")
	if err != nil {
		t.Fatalf("Acquire after the session ended: %v", err)
	}
	defer l.Release(ctx)
	if after, err := cut.TokenPrefix(ttl); err != nil || after == before {
		t.Errorf("TokenPrefix after the session ended: %q, %v; want a new session (it was %q)", after, err, before)
	}
}

// The release of a token whose acquire had an unknown outcome writes the
// token's tombstone under the session's lease, which lives as long as the
// acquire could still attach a key to it (the tombstones' own lease lives
// 15 to 30s): the acquire, arriving late, takes nothing.
func TestSessionDoubtfulTokensTombstoneLivesWithTheSession(t *testing.T) {
	b, px, addr := proxiedSessions(t)
	ctx := ctxFor(t)
	ttl := 2 * time.Second
	toks := sessionTokens(t, b, ttl, 2)
	if _, err := b.Acquire(ctx, "k1", toks[1], ttl); err != nil { // the session's lease
		t.Fatal(err)
	}
	direct := newClient(t, addr)
	session := leaseOf(ctx, t, direct, toks[1])
	px.Hold(faultproxy.ToServer)
	actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := b.Acquire(actx, "k0", toks[0], ttl)
	cancel()
	if err == nil || errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("Acquire through a held link: %v; want an error of unknown outcome", err)
	}
	px.Reset() // the acquire never arrives
	px.Deliver(faultproxy.ToServer)
	// The cleanup release, sent again while its outcome is unknown (the
	// client meets the reset connection first), as package lock does.
	for i := 0; ; i++ {
		err := b.Release(ctx, "k0", toks[0])
		if errors.Is(err, backend.ErrNotHeld) {
			break
		}
		if i == 10 {
			t.Fatalf("cleanup Release: %v; want ErrNotHeld", err)
		}
	}
	resp, err := direct.Get(ctx, "", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	tombs := 0
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Key), "/t/"+toks[0]+"/") {
			tombs++
			if clientv3.LeaseID(kv.Lease) != session {
				t.Errorf("the doubtful token's tombstone %q is on lease %x; want the session's %x", kv.Key, kv.Lease, session)
			}
		}
	}
	if tombs != 1 {
		t.Fatalf("%d tombstones of the doubtful token; want one", tombs)
	}
	// The late acquire is refused.
	if _, err := b.Acquire(ctx, "k0", toks[0], ttl); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("the acquire sent again after its cleanup: %v; want ErrInvalid (dead token)", err)
	}
}

// A release of unknown outcome (here it never reached the store) must not
// leave its lock on the session's lease, which the session's other locks
// keep alive: the backend sends it again after the session's renewals,
// and the key is free soon after, while the other lock stays held.
func TestSessionReleaseOfUnknownOutcomeIsSentAgain(t *testing.T) {
	b, px, addr := proxiedSessions(t)
	ctx := ctxFor(t)
	ttl := 2 * time.Second
	toks := sessionTokens(t, b, ttl, 2)
	for i, tok := range toks {
		if _, err := b.Acquire(ctx, fmt.Sprint("k", i), tok, ttl); err != nil {
			t.Fatal(err)
		}
	}
	px.Hold(faultproxy.ToServer)
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := b.Release(rctx, "k0", toks[0])
	cancel()
	if err == nil || errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release through a held link: %v; want an error of unknown outcome", err)
	}
	px.Reset() // the release never arrives
	px.Deliver(faultproxy.ToServer)
	direct := newClient(t, addr)
	for deadline := time.Now().Add(3 * ttl); ; {
		b.Renew(ctx, "k1", toks[1], ttl) // the session's renewal; may meet the reset link first
		if leaseOf(ctx, t, direct, toks[0]) == clientv3.NoLease {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("k0, released with an unknown outcome, is still held %v later while its session lives on", 3*ttl)
		}
		time.Sleep(ttl / 6) // renew k1 on time, as package lock would
	}
	if _, err := b.Renew(ctx, "k1", toks[1], ttl); err != nil {
		t.Errorf("Renew k1, the session's other lock: %v", err)
	}
}

// A session whose lease expired while idle takes no lock: an acquire with
// a token of it finds the lease gone (its transaction did nothing) and
// answers ErrContended, so that package lock tries again, and the next
// prefix names a new session.
func TestSessionExpiredWhileIdleTakesNothing(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	b, cli := newBackend(t, srv.Addr, etcd.WithSessions(true))
	ttl := time.Second
	toks := sessionTokens(t, b, ttl, 2)
	if _, err := b.Acquire(ctx, "k0", toks[0], ttl); err != nil {
		t.Fatal(err)
	}
	id := leaseOf(ctx, t, cli, toks[0])
	for { // wait out the lease, with nothing renewing it
		left, err := cli.TimeToLive(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if left.TTL == -1 { // expired (0 is its last second)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	_, err := b.Acquire(ctx, "k1", toks[1], ttl)
	if !errors.Is(err, backend.ErrContended) {
		t.Fatalf("Acquire with a token of the expired session: %v; want ErrContended", err)
	}
	if h, err := b.Inspect(ctx, "k1"); err != nil || h.Held {
		t.Errorf("Inspect k1 after the refused acquire: %+v, %v; want free", h, err)
	}
	p, err := b.TokenPrefix(ttl)
	if err != nil || p == toks[0][:8] {
		t.Errorf("TokenPrefix after the session ended: %q, %v; want a new session (it was %q)", p, err, toks[0][:8])
	}
}

// proxiedSessions returns a backend with sessions that reaches a new etcd
// member through a fault proxy, with both; the backend closes at the end
// of the test.
func proxiedSessions(t *testing.T) (*etcd.Backend, *faultproxy.Proxy, string) {
	t.Helper()
	srv := startEtcd(t)
	px := faultproxy.Start(t, srv.Addr)
	b, err := etcd.New(newClient(t, px.Addr), etcd.WithElectionTimeout(electionTimeout), etcd.WithSessions(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, px, srv.Addr
}
