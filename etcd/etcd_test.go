package etcd_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/etcd"
)

// newToken returns a token as package lock makes them.
func newToken() string {
	var b [16]byte
	crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newBackend returns a backend over a new client of addr, both closed at the
// end of the test.
func newBackend(t *testing.T, addr string, opts ...etcd.Option) (*etcd.Backend, *clientv3.Client) {
	t.Helper()
	cli := newClient(t, addr)
	b, err := etcd.New(cli, append([]etcd.Option{etcd.WithElectionTimeout(electionTimeout)}, opts...)...)
	if err != nil {
		t.Fatalf("etcd.New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b, cli
}

func TestNewBadInput(t *testing.T) {
	if _, err := etcd.New(nil); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("New(nil): %v; want ErrInvalid", err)
	}
	srv := startEtcd(t)
	cli := newClient(t, srv.Addr)
	if _, err := etcd.New(cli, etcd.WithElectionTimeout(0)); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("New with election timeout 0: %v; want ErrInvalid", err)
	}
	b, _ := newBackend(t, srv.Addr)
	b.Close()
	ctx := ctxFor(t)
	if _, err := b.Acquire(ctx, "k", newToken(), time.Second); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Acquire after Close: %v; want ErrClosed", err)
	}
	if _, err := b.Watch(ctx, "k"); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Watch after Close: %v; want ErrClosed", err)
	}
}

// A key deleted from outside while its lease lives is lost: Renew reports
// it not held, and does not put it back.
func TestRenewKeyDeletedOutside(t *testing.T) {
	srv := startEtcd(t)
	b, cli := newBackend(t, srv.Addr)
	ctx := ctxFor(t)
	tok := newToken()
	if _, err := b.Acquire(ctx, "k", tok, 10*time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if _, err := cli.Delete(ctx, etcd.DefaultPrefix+"k/k\xff"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := b.Renew(ctx, "k", tok, 10*time.Second); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Renew of a key deleted from outside: %v; want ErrNotHeld", err)
	}
	if h, err := b.Inspect(ctx, "k"); err != nil || h.Held {
		t.Fatalf("Inspect after the renew: %+v, %v; want free", h, err)
	}
	// Nor does a renew after a successor took the key touch it.
	other := newToken()
	g, err := b.Acquire(ctx, "k", other, 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire by a successor: %v", err)
	}
	if _, err := b.Renew(ctx, "k", tok, 10*time.Second); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Renew by the old owner: %v; want ErrNotHeld", err)
	}
	if h, err := b.Inspect(ctx, "k"); err != nil || h.Token != other || h.Fence != g.Fence {
		t.Fatalf("Inspect: %+v, %v; want the successor's token and fence %d", h, err, g.Fence)
	}
}

// A released token is dead: an acquire with it arriving after its release
// (package lock's undo overtook it) takes nothing, and a release sent
// again answers as the first did.
func TestDeadToken(t *testing.T) {
	srv := startEtcd(t)
	b, _ := newBackend(t, srv.Addr)
	ctx := ctxFor(t)

	early := newToken()
	if err := b.Release(ctx, "k", early); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release of a token that never held the key: %v; want ErrNotHeld", err)
	}
	if _, err := b.Acquire(ctx, "k", early, time.Second); !errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("Acquire arriving after its undo: %v; want ErrInvalid", err)
	}
	if err := b.Release(ctx, "k", early); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("the undo sent again: %v; want ErrNotHeld", err)
	}

	tok := newToken()
	if _, err := b.Acquire(ctx, "k", tok, time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := b.Release(ctx, "k", newToken()); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release by another token: %v; want ErrNotHeld", err)
	}
	for i := range 2 {
		if err := b.Release(ctx, "k", tok); err != nil {
			t.Fatalf("Release %d: %v; want nil", i+1, err)
		}
	}
	if _, err := b.Acquire(ctx, "k", tok, time.Second); !errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("Acquire with a released token: %v; want ErrInvalid", err)
	}
	if h, err := b.Inspect(ctx, "k"); err != nil || h.Held {
		t.Fatalf("Inspect: %+v, %v; want free", h, err)
	}
}

// raftIndex returns the member's Raft index: it counts the Raft writes.
func raftIndex(ctx context.Context, t *testing.T, cli *clientv3.Client) uint64 {
	t.Helper()
	st, err := cli.Status(ctx, cli.Endpoints()[0])
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	return st.RaftIndex
}

// One Raft write per acquisition, one per release, one per contended
// attempt, none per renewal, once the backend has an idle lease.
func TestRaftWrites(t *testing.T) {
	srv := startEtcd(t)
	b, cli := newBackend(t, srv.Addr)
	other, _ := newBackend(t, srv.Addr)
	ctx := ctxFor(t)
	cycle := func(b *etcd.Backend) string {
		tok := newToken()
		if _, err := b.Acquire(ctx, "k", tok, 5*time.Second); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		return tok
	}
	// Warm up: the first acquisitions grant leases, the first release
	// the tombstones' lease.
	for _, x := range []*etcd.Backend{b, other} {
		if err := x.Release(ctx, "k", cycle(x)); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	const n = 20
	before := raftIndex(ctx, t, cli)
	for range n {
		tok := cycle(b)
		if _, err := b.Renew(ctx, "k", tok, 5*time.Second); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if _, err := other.Acquire(ctx, "k", newToken(), 5*time.Second); !errors.Is(err, backend.ErrLocked) {
			t.Fatalf("Acquire of a held key: %v; want ErrLocked", err)
		}
		if err := b.Release(ctx, "k", tok); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	if writes := raftIndex(ctx, t, cli) - before; writes > 3*n {
		t.Errorf("%d Raft writes for %d acquisitions, renewals, contended attempts and releases; want %d (one per acquisition, attempt and release)", writes, n, 3*n)
	} else {
		t.Logf("%d Raft writes for %d cycles", writes, n)
	}
}

// A lease reused late in its idle life still keeps the lock the full TTL
// from the request: the backend refreshes it before the transaction.
func TestReusedLeaseExpiryNotEarly(t *testing.T) {
	srv := startEtcd(t)
	b, cli := newBackend(t, srv.Addr)
	watcher, _ := newBackend(t, srv.Addr)
	ctx := ctxFor(t)
	const ttl = 2 * time.Second
	tok := newToken()
	if _, err := b.Acquire(ctx, "k", tok, ttl); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := b.Release(ctx, "k", tok); err != nil { // the lease goes idle
		t.Fatalf("Release: %v", err)
	}
	idleSince := time.Now()
	// Let the idle lease age close to the end of its TTL, as long as the
	// backend still reuses it (its margin is 200ms for a 2s TTL).
	time.Sleep(ttl - 400*time.Millisecond)
	before := raftIndex(ctx, t, cli)
	sent := time.Now()
	if _, err := b.Acquire(ctx, "k", newToken(), ttl); err != nil {
		t.Fatalf("Acquire on an aged idle lease: %v", err)
	}
	if writes := raftIndex(ctx, t, cli) - before; writes != 1 {
		t.Fatalf("%d Raft writes for the acquisition; want 1 (the idle lease reused): the case tests nothing", writes)
	}
	for {
		_, err := watcher.Acquire(ctx, "k", newToken(), ttl)
		if err == nil {
			break
		}
		if !errors.Is(err, backend.ErrLocked) {
			t.Fatalf("Acquire by another backend: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // poll until the lock expires
	}
	if held := time.Since(sent); held < ttl {
		t.Fatalf("the lock on a lease idle for %v expired %v after the acquire was sent; want at least its TTL %v", sent.Sub(idleSince).Round(time.Millisecond), held.Round(time.Millisecond), ttl)
	}
}

// A lease refreshed less than the unrefreshed window ago carries the next
// lock without a keep-alive: the store must still keep that lock at least
// its TTL from the acquire's send, which only the lease's extra second
// makes true. The lease is reused as late in the window as the test can
// manage, and the store's expiry for it is read back: it must not come
// before the send plus the TTL. Were leases as long as the lock's TTL, it
// would come ~0.4s early, and this test fails.
func TestReusedLeaseWithoutRefreshKeepsTheTTL(t *testing.T) {
	srv := startEtcd(t)
	b, cli := newBackend(t, srv.Addr)
	ctx := ctxFor(t)
	const ttl = 2 * time.Second
	var kas atomic.Int64
	etcd.AfterKeepAliveSent(b, func() { kas.Add(1) })
	idleLeaseLateInWindow(ctx, t, b, ttl)
	kas.Store(0)
	before := raftIndex(ctx, t, cli)
	sent := time.Now()
	tok := newToken()
	g, err := b.Acquire(ctx, "k", tok, ttl)
	if err != nil {
		t.Fatalf("Acquire on the idle lease: %v", err)
	}
	if writes := raftIndex(ctx, t, cli) - before; writes != 1 || kas.Load() != 0 {
		t.Fatalf("%d Raft writes and %d keep-alives for the acquire; want 1 and 0 (the idle lease reused as it is): the case tests nothing", writes, kas.Load())
	}
	if g.TTL < ttl {
		t.Fatalf("granted TTL %v; want at least %v", g.TTL, ttl)
	}
	id := leaseOf(ctx, t, cli, tok)
	if id == clientv3.NoLease {
		t.Fatal("the lock key is not on the store")
	}
	leaseLastsTTL(ctx, t, cli, id, sent, ttl)
}

// idleLeaseLateInWindow leaves b an idle lease of ttl (key "k" acquired
// and released) and returns as late as that lease still carries a lock as
// it is, less a margin.
func idleLeaseLateInWindow(ctx context.Context, t *testing.T, b *etcd.Backend, ttl time.Duration) {
	t.Helper()
	granted := time.Now() // the lease's grant goes after this
	idleLease(ctx, t, b, ttl)
	time.Sleep(time.Until(granted.Add(etcd.UnrefreshedWindow - 80*time.Millisecond)))
}

// leaseOf returns the lease of the key whose value is tok, or NoLease when
// no key has it.
func leaseOf(ctx context.Context, t *testing.T, cli *clientv3.Client, tok string) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	for _, kv := range resp.Kvs {
		if string(kv.Value) == tok {
			return clientv3.LeaseID(kv.Lease)
		}
	}
	return clientv3.NoLease
}

// leaseLastsTTL fails t when the store expires lease id, which carries a
// lock acquired with a request sent at sent, less than ttl after sent. It
// returns when the lease is about to expire.
func leaseLastsTTL(ctx context.Context, t *testing.T, cli *clientv3.Client, id clientv3.LeaseID, sent time.Time, ttl time.Duration) {
	t.Helper()
	// The store reports a lease's remaining TTL in whole seconds, rounded
	// down: the first answer of 0 comes less than a second before the
	// lease expires, so the expiry is before that answer's arrival plus
	// one second.
	for {
		left, err := cli.TimeToLive(ctx, id)
		if err != nil {
			t.Fatalf("TimeToLive: %v", err)
		}
		if left.TTL <= 0 {
			if latest := time.Since(sent) + time.Second; latest < ttl {
				t.Fatalf("the store expires the lock less than %v after the acquire was sent; want at least its TTL %v", latest.Round(time.Millisecond), ttl)
			}
			return
		}
		time.Sleep(10 * time.Millisecond) // poll the store's clock until the lease is about to expire
	}
}

// Fences are revisions: a restart keeps the lock, its fence and the
// revision counter, and the next holder's fence is greater.
func TestFenceAcrossRestart(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	b, _ := newBackend(t, srv.Addr)
	tok := newToken()
	g, err := b.Acquire(ctx, "k", tok, 30*time.Second)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	srv.Restart() // kill -9, same data directory
	b2, _ := newBackend(t, srv.Addr)
	h, err := b2.Inspect(ctx, "k")
	if err != nil || !h.Held || h.Token != tok || h.Fence != g.Fence {
		t.Fatalf("Inspect after a restart: %+v, %v; want held by %s with fence %d", h, err, tok, g.Fence)
	}
	if _, err := b2.Acquire(ctx, "k", newToken(), time.Second); !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("Acquire of the lock held before the restart: %v; want ErrLocked", err)
	}
	if err := b.Release(ctx, "k", tok); err != nil { // the old client reconnects
		t.Fatalf("Release after the restart: %v", err)
	}
	g2, err := b2.Acquire(ctx, "k", newToken(), time.Second)
	if err != nil {
		t.Fatalf("Acquire after the release: %v", err)
	}
	if g2.Fence <= g.Fence {
		t.Fatalf("fence %d after a restart; %d before: want strictly increasing", g2.Fence, g.Fence)
	}
}

// A watch wakes its waiter when the holder's lease expires, not only on a
// release.
func TestWatchWakesOnExpiry(t *testing.T) {
	srv := startEtcd(t)
	b, _ := newBackend(t, srv.Addr)
	ctx := ctxFor(t)
	sent := time.Now()
	if _, err := b.Acquire(ctx, "k", newToken(), time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	w, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Close(false)
	bound := b.Capabilities().LatestExpiry(time.Second)
	select {
	case <-w.C():
	case <-time.After(bound + time.Second):
		t.Fatalf("no wake-up within %v of an acquire with TTL 1s", bound+time.Second)
	}
	if d := time.Since(sent); d < time.Second {
		t.Errorf("woken %v after the acquire, before its TTL", d)
	}
	if _, err := b.Acquire(ctx, "k", newToken(), time.Second); err != nil {
		t.Errorf("Acquire after the wake-up: %v", err)
	}
}

// Setting a watch up on a store that does not answer gives up with the
// caller's context, and leaves nothing running.
func TestWatchStoreHangs(t *testing.T) {
	srv := startEtcd(t)
	b, _ := newBackend(t, srv.Addr)
	ctx := ctxFor(t)
	if _, err := b.Inspect(ctx, "k"); err != nil { // connected
		t.Fatalf("Inspect: %v", err)
	}
	srv.Stop()
	defer srv.Continue()
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := b.Watch(wctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Watch while the store hangs: %v; want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Watch returned after %v; its context ended after 200ms", d)
	}
}

// A backend can renew and release a lock another backend acquired (a tool
// acting for its owner), by its token; the acquiring backend then finds
// it released.
func TestForeignRenewRelease(t *testing.T) {
	srv := startEtcd(t)
	a, _ := newBackend(t, srv.Addr)
	b, _ := newBackend(t, srv.Addr)
	ctx := ctxFor(t)
	tok := newToken()
	g, err := a.Acquire(ctx, "k", tok, 5*time.Second)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if r, err := b.Renew(ctx, "k", tok, 5*time.Second); err != nil || r.Fence != g.Fence {
		t.Fatalf("Renew by another backend: %+v, %v; want fence %d", r, err, g.Fence)
	}
	if _, err := b.Renew(ctx, "k", newToken(), 5*time.Second); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Renew by another backend with another token: %v; want ErrNotHeld", err)
	}
	if err := b.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release by another backend: %v", err)
	}
	if _, err := a.Renew(ctx, "k", tok, 5*time.Second); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Renew by the acquiring backend after the release: %v; want ErrNotHeld", err)
	}
	if err := a.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release by the acquiring backend, sent again: %v; want nil", err)
	}
	if _, err := a.Acquire(ctx, "k", newToken(), 5*time.Second); err != nil {
		t.Fatalf("Acquire after the release: %v", err)
	}
}

// A lease reused as it is, with the acquire's reply held by the network for
// half the TTL after the store acted: the grant arrives late, its deadline
// counts from the send, and the store still keeps the lock that long (the
// lease's extra second covers the time since its latest refresh). Were
// leases as long as the lock's TTL, the store would expire it ~0.4s early,
// and this test fails.
func TestReusedLeaseWithReplyHeld(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	px := faultproxy.Start(t, srv.Addr)
	b, err := etcd.New(newClient(t, px.Addr), etcd.WithElectionTimeout(electionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	outside := newClient(t, srv.Addr)
	var kas atomic.Int64
	etcd.AfterKeepAliveSent(b, func() { kas.Add(1) })
	const ttl = 2 * time.Second
	idleLeaseLateInWindow(ctx, t, b, ttl)
	kas.Store(0)
	px.Hold(faultproxy.ToClient)
	sent := time.Now()
	tok := newToken()
	type result struct {
		g   backend.Grant
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := b.Acquire(ctx, "k", tok, ttl)
		done <- result{g, err}
	}()
	id := clientv3.NoLease
	for id == clientv3.NoLease { // until the store has acted
		time.Sleep(10 * time.Millisecond)
		id = leaseOf(ctx, t, outside, tok)
	}
	// The reply stays held for half the TTL, while the store's expiry
	// for the lease is read from outside, from now on.
	deliver := time.AfterFunc(ttl/2, func() { px.Deliver(faultproxy.ToClient) })
	defer deliver.Stop()
	leaseLastsTTL(ctx, t, outside, id, sent, ttl)
	r := <-done
	if r.err != nil {
		t.Fatalf("Acquire with its reply held: %v", r.err)
	}
	if kas.Load() != 0 || r.g.TTL < ttl {
		t.Fatalf("grant %+v after %d keep-alives; want the TTL %v and none (the lease carries the lock as it is): the case tests nothing", r.g, kas.Load(), ttl)
	}
}
