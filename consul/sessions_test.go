package consul_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/consul"
	"github.com/distlock/lock/internal/consultest"
)

// The whole suite with shared sessions: the self-renewing leases of one TTL
// share a Consul session.
func TestConformanceSessions(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		return &harness{t: t, agent: consultest.Start(t), sessions: true}
	}, conformance.RequireHooks())
}

// Seeded randomized fault runs with shared sessions.
func TestFaultRunsSessions(t *testing.T) {
	conformance.RunFaults(t, func(t *testing.T) conformance.Harness {
		return &harness{t: t, agent: consultest.Start(t), sessions: true}
	})
}

var _ backend.TokenPrefixer = (*consul.Backend)(nil)

// sessionTokens returns n tokens of the shared session that b's leases of
// ttl join now, as package lock makes them.
func sessionTokens(t *testing.T, b *consul.Backend, ttl time.Duration, n int) []string {
	t.Helper()
	p, err := b.TokenPrefix(ttl)
	if err != nil || len(p) != backend.MaxTokenPrefix || p[0] != 'S' {
		t.Fatalf("TokenPrefix: %q, %v; want S and a session id", p, err)
	}
	out := make([]string, n)
	for i := range out {
		out[i] = p + rand.Text()[len(p):]
	}
	return out
}

// A batch of renewals of many locks of one shared session sends one
// session renewal, and each lock still gets its own answer: one deleted
// from outside is reported lost, the others renewed.
func TestSessionRenewsManyLocksWithOneRenewal(t *testing.T) {
	agent := consultest.Start(t)
	ct := &countingTransport{paths: map[string]int{}}
	b, err := consul.New(clientVia(t, agent.Addr, ct), consul.WithMinTTL(consultest.MinTTL), consul.WithSessions(true))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, cli := newBackend(t, agent.Addr)
	ctx := context.Background()
	const n, ttl = 100, 5 * time.Second
	toks := sessionTokens(t, b, ttl, n)
	rs := make([]backend.Renewal, n)
	sessions := map[string]bool{}
	for i, tok := range toks {
		rs[i] = backend.Renewal{Key: fmt.Sprintf("k%d", i), Token: tok, TTL: ttl}
		if _, err := b.Acquire(ctx, rs[i].Key, tok, ttl); err != nil {
			t.Fatalf("Acquire %s: %v", rs[i].Key, err)
		}
		sessions[sessionOf(t, cli, rs[i].Key)] = true
	}
	if len(sessions) != 1 {
		t.Fatalf("the %d locks are held by %d sessions; want one, the shared session", n, len(sessions))
	}
	if _, err := cli.KV().Delete(consul.DefaultPrefix+"k7", nil); err != nil {
		t.Fatal(err)
	}
	ct.mu.Lock()
	clear(ct.paths)
	ct.mu.Unlock()
	for i, r := range b.RenewBatch(ctx, rs) {
		switch {
		case i == 7 && !errors.Is(r.Err, backend.ErrNotHeld):
			t.Errorf("renewal of the lock deleted from outside: %v; want ErrNotHeld", r.Err)
		case i != 7 && (r.Err != nil || r.Grant.TTL < ttl):
			t.Errorf("renewal %d: %+v; want the TTL", i, r)
		}
	}
	ct.mu.Lock()
	defer ct.mu.Unlock()
	// One session renewal; two check transactions, and a third for the 63
	// checks that passed in the transaction that k7's check failed.
	if txns, renews := ct.paths["/v1/txn"], ct.paths["/v1/session/renew/"]; renews != 1 || txns > 3 {
		t.Errorf("a batch of %d renewals of one session sent %d session renewals and %d transactions (all: %v); want 1 and at most 3", n, renews, txns, ct.paths)
	}
}

// Consul lets a session lock an entry it already holds. A second lease of
// the same shared session must still find the key held, and a release or
// renewal of a lock that ended must leave the next lock of the same
// session on that key alone.
func TestSessionTakesNoKeyItHoldsForAnotherLease(t *testing.T) {
	agent := consultest.Start(t)
	b, cli := newBackend(t, agent.Addr, consul.WithSessions(true))
	defer b.Close()
	ctx := context.Background()
	const ttl = 5 * time.Second
	toks := sessionTokens(t, b.Backend, ttl, 3)
	g0, err := b.Acquire(ctx, "k", toks[0], ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "k", toks[1], ttl); !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("a second lease of the session acquiring a key the session holds: %v; want ErrLocked", err)
	}
	if h, err := b.Inspect(ctx, "k"); err != nil || h.Token != toks[0] || h.Fence != g0.Fence {
		t.Fatalf("Inspect after the refused acquire: %+v, %v; want the first lease's token and fence %d", h, err, g0.Fence)
	}
	sess := sessionOf(t, cli, "k")
	// The first lock ends from outside; the next lease of the session
	// takes the key.
	if _, err := cli.KV().Delete(consul.DefaultPrefix+"k", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "k", toks[2], ttl); err != nil {
		t.Fatalf("Acquire of the free key: %v", err)
	}
	if got := sessionOf(t, cli, "k"); got != sess {
		t.Fatalf("the next lock's session: %s; want the shared one, %s", got, sess)
	}
	if _, err := b.Renew(ctx, "k", toks[0], ttl); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Renew of the ended lock: %v; want ErrNotHeld", err)
	}
	if err := b.Release(ctx, "k", toks[0]); err != nil && !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release of the ended lock: %v; want nil or ErrNotHeld", err)
	}
	if h, err := b.Inspect(ctx, "k"); err != nil || h.Token != toks[2] {
		t.Fatalf("Inspect after the ended lock's renewal and release: %+v, %v; want the next lease's token", h, err)
	}
	if err := b.Release(ctx, "k", toks[2]); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if h, err := b.Inspect(ctx, "k"); err != nil || h.Held {
		t.Fatalf("Inspect after the release: %+v, %v; want free", h, err)
	}
}

// txnGate is a transport that plays one transaction whose body contains
// match the way a network can: lost (the store acts, the caller gets an
// error) or late (the caller gets an error at once, and the store gets the
// request when the test says).
type txnGate struct {
	mu    sync.Mutex
	match []byte
	late  bool
	held  *http.Request // a late request, not yet sent
	hit   chan struct{} // closed once the transaction was played
}

func newTxnGate() *txnGate { return &txnGate{hit: make(chan struct{})} }

func (g *txnGate) arm(match string, late bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.match, g.late = []byte(match), late
}

func (g *txnGate) RoundTrip(r *http.Request) (*http.Response, error) {
	body, ok, err := txnBody(r)
	if err != nil {
		return nil, err
	}
	if !ok {
		return http.DefaultTransport.RoundTrip(r)
	}
	g.mu.Lock()
	play := g.match != nil && bytes.Contains(body, g.match)
	late := g.late
	if play {
		g.match = nil
		if late {
			g.held = r.Clone(context.Background())
			g.held.Body = io.NopCloser(bytes.NewReader(body))
		}
	}
	g.mu.Unlock()
	if !play {
		return http.DefaultTransport.RoundTrip(r)
	}
	defer close(g.hit)
	if !late {
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	return nil, errors.New("txnGate: the reply was lost")
}

// deliver sends the late request and reports whether Consul committed it.
func (g *txnGate) deliver(t *testing.T) bool {
	t.Helper()
	g.mu.Lock()
	r := g.held
	g.held = nil
	g.mu.Unlock()
	if r == nil {
		t.Fatal("txnGate: no late request to deliver")
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		t.Fatalf("delivering the late transaction: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// sessionsTTL is the TTL of gatedSessions' tokens.
const sessionsTTL = 10 * time.Second

// gatedSessions returns a backend with shared sessions whose transactions
// go through a txnGate, a client of the same agent to look from outside,
// and two tokens of one shared session, for locks of sessionsTTL.
func gatedSessions(t *testing.T) (*consul.Backend, *txnGate, *api.Client, []string) {
	agent := consultest.Start(t)
	g := newTxnGate()
	b, err := consul.New(clientVia(t, agent.Addr, g), consul.WithMinTTL(consultest.MinTTL), consul.WithSessions(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	_, cli := newBackend(t, agent.Addr)
	return b, g, cli, sessionTokens(t, b, sessionsTTL, 2)
}

// lockOp is how a transaction's body spells the lock of entry for token.
func lockOp(entry, token string) string {
	return `"Verb":"lock","Key":"` + entry + `","Value":"` + base64.StdEncoding.EncodeToString([]byte(token)) + `"`
}

// An acquire of a shared session whose request is delayed past its
// release: the release buries the token (its outcome was unknown), and
// the acquire, when it lands, takes nothing, though the session still
// lives, kept by another lock. Without the burial the late lock would
// hold the key for as long as the session is renewed, with nobody to
// release it.
func TestSessionLateGrantOfABuriedTokenTakesNothing(t *testing.T) {
	b, g, cli, toks := gatedSessions(t)
	ctx := context.Background()
	if _, err := b.Acquire(ctx, "keep", toks[0], sessionsTTL); err != nil {
		t.Fatal(err)
	}
	sess := sessionOf(t, cli, "keep")
	g.arm(lockOp(b.Entry("late"), toks[1]), true)
	if _, err := b.Acquire(ctx, "late", toks[1], sessionsTTL); err == nil || errors.Is(err, backend.ErrLocked) {
		t.Fatalf("Acquire with its request held back: %v; want an error of unknown outcome", err)
	}
	if err := b.Release(ctx, "late", toks[1]); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release of the doubtful token: %v; want ErrNotHeld (its acquire has not landed)", err)
	}
	if g.deliver(t) {
		t.Error("the late acquire transaction was committed; want it refused")
	}
	if kv, _, err := cli.KV().Get(b.Entry("late"), nil); err != nil || kv != nil {
		t.Fatalf("entry of the late key after the late acquire: %+v, %v; want none", kv, err)
	}
	if got := sessionOf(t, cli, "keep"); got != sess {
		t.Fatalf("the other lock's session: %s; want %s, alive", got, sess)
	}
	if _, err := b.Renew(ctx, "keep", toks[0], sessionsTTL); err != nil {
		t.Fatalf("Renew of the other lock: %v", err)
	}
}

// A release whose reply is lost is sent again after the next renewal of
// its session: the lock does not live on with the session, which the
// session's other locks keep renewing.
func TestSessionReleaseOfUnknownOutcomeIsSentAgain(t *testing.T) {
	b, g, cli, toks := gatedSessions(t)
	ctx := context.Background()
	for i, tok := range toks {
		if _, err := b.Acquire(ctx, fmt.Sprint("k", i), tok, sessionsTTL); err != nil {
			t.Fatal(err)
		}
	}
	// The release is held back, so that it reaches the store only when
	// sent again.
	g.arm(`"Verb":"delete","Key":"`+b.Entry("k1")+`"`, true)
	if err := b.Release(ctx, "k1", toks[1]); err == nil || errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release with its request lost: %v; want an error of unknown outcome", err)
	}
	if _, err := b.Renew(ctx, "k0", toks[0], sessionsTTL); err != nil {
		t.Fatalf("Renew k0: %v", err)
	}
	waitFor(t, "the release sent again", func() bool {
		kv, _, err := cli.KV().Get(b.Entry("k1"), nil)
		return err == nil && kv == nil
	})
	sessionOf(t, cli, "k0")
}

// A shared session that expired while idle takes nothing: an acquire with
// a token of it answers ErrContended, with no entry written, and the next
// token prefix names a new session, whose acquire succeeds.
func TestSessionExpiredWhileIdleTakesNothing(t *testing.T) {
	agent := consultest.Start(t)
	b, cli := newBackend(t, agent.Addr, consul.WithSessions(true))
	defer b.Close()
	ctx := context.Background()
	ttl := consultest.MinTTL
	toks := sessionTokens(t, b.Backend, ttl, 2)
	if _, err := b.Acquire(ctx, "a", toks[0], ttl); err != nil {
		t.Fatal(err)
	}
	sess := sessionOf(t, cli, "a")
	if err := b.Release(ctx, "a", toks[0]); err != nil {
		t.Fatal(err)
	}
	// Waiting out the session's TTL: Consul expires it up to twice its
	// TTL after its last renewal.
	deadline := time.Now().Add(10 * ttl)
	for {
		e, _, err := cli.Session().Info(sess, nil)
		if err != nil {
			t.Fatal(err)
		}
		if e == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s still alive %v after its last renewal", sess, 10*ttl)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := b.Acquire(ctx, "b", toks[1], ttl); !errors.Is(err, backend.ErrContended) {
		t.Fatalf("Acquire with a token of the expired session: %v; want ErrContended", err)
	}
	if kv, _, err := cli.KV().Get(b.Entry("b"), nil); err != nil || kv != nil {
		t.Fatalf("entry after the refused acquire: %+v, %v; want none", kv, err)
	}
	next := sessionTokens(t, b.Backend, ttl, 1)[0]
	if next[:backend.MaxTokenPrefix] == toks[1][:backend.MaxTokenPrefix] {
		t.Fatalf("token prefix after the session expired: %q; want a new session's", next[:backend.MaxTokenPrefix])
	}
	if _, err := b.Acquire(ctx, "b", next, ttl); err != nil {
		t.Fatalf("Acquire with the new session: %v", err)
	}
	if got := sessionOf(t, cli, "b"); got == sess {
		t.Fatalf("the new lock is held by the expired session %s", sess)
	}
	b.Release(ctx, "b", next)
}

// Through package lock: many self-renewing leases of one TTL are held by
// one session and stay valid over several renewal rounds; a lease without
// automatic renewal gets a session of its own. (TryAcquire: a waiting
// Acquire's attempts go through the queue, whose waiters have sessions of
// their own.)
func TestSessionLeasesOfALockClient(t *testing.T) {
	agent := consultest.Start(t)
	_, cli := newBackend(t, agent.Addr)
	c := newClient(t, agent.Addr, []consul.Option{consul.WithSessions(true)}, lock.WithAutoRenew(true))
	ctx := context.Background()
	const n, ttl = 20, 2 * time.Second
	var leases []*lock.Lease
	for i := range n {
		l, err := c.TryAcquire(ctx, fmt.Sprint("k", i), lock.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	sessions := map[string]bool{}
	for i := range n {
		sessions[sessionOf(t, cli, fmt.Sprint("k", i))] = true
	}
	if len(sessions) != 1 {
		t.Fatalf("%d self-renewing leases are held by %d sessions; want 1", n, len(sessions))
	}
	time.Sleep(2 * ttl) // waiting out two TTLs: the leases must renew
	for i, l := range leases {
		select {
		case <-l.Done():
			t.Fatalf("lease %d ended: %v", i, l.Err())
		default:
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release %d: %v", i, err)
		}
	}
	one, err := c.TryAcquire(ctx, "single", lock.WithTTL(ttl), lock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	defer one.Release(ctx)
	if sessions[sessionOf(t, cli, "single")] {
		t.Errorf("a lease without automatic renewal is held by the shared session")
	}
}

// A release whose reply is lost after the store acted is sent again after
// the next renewal of its session, when the same session may already hold
// the key again for another lease: the copy, checked by the first lock's
// index, must leave that lock alone.
func TestSessionReleaseSentAgainLeavesTheNextLockAlone(t *testing.T) {
	b, g, cli, toks := gatedSessions(t)
	ctx := context.Background()
	next := sessionTokens(t, b, sessionsTTL, 1)[0]
	for i, tok := range toks {
		if _, err := b.Acquire(ctx, fmt.Sprint("k", i), tok, sessionsTTL); err != nil {
			t.Fatal(err)
		}
	}
	g.arm(`"Verb":"delete","Key":"`+b.Entry("k1")+`"`, false) // the store acts, the reply is lost
	if err := b.Release(ctx, "k1", toks[1]); err == nil || errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release with its reply lost: %v; want an error of unknown outcome", err)
	}
	if _, err := b.Acquire(ctx, "k1", next, sessionsTTL); err != nil {
		t.Fatalf("Acquire of k1 by the next lease of the session: %v", err)
	}
	if n := b.PendingReleases(toks[1]); n != 1 {
		t.Fatalf("pending releases after the lost reply: %d; want 1", n)
	}
	if _, err := b.Renew(ctx, "k0", toks[0], sessionsTTL); err != nil { // sends the pending release again
		t.Fatalf("Renew k0: %v", err)
	}
	waitFor(t, "the release sent again to settle", func() bool { return b.PendingReleases(toks[1]) == 0 })
	kv, _, err := cli.KV().Get(b.Entry("k1"), nil)
	if err != nil || kv == nil || string(kv.Value) != next {
		t.Fatalf("k1 after the release was sent again: %+v, %v; want held by the next lease", kv, err)
	}
}
