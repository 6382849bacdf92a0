package consul_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/consul"
	"github.com/distlock/lock/internal/consultest"
	"github.com/distlock/lock/internal/queuetest"
)

const queueTTL = 10 * time.Second

// queueUp makes a waiter of b for key (see queuetest.Queue).
func queueUp(ctx context.Context, t *testing.T, b backend.Queuer, key string) *queuetest.Waiter {
	t.Helper()
	return queuetest.Queue(ctx, t, b, key, queueTTL)
}

var newToken = queuetest.NewToken

// entries lists the entries under the default prefix, from outside.
func entries(t *testing.T, cli *api.Client) api.KVPairs {
	t.Helper()
	kvs, _, err := cli.KV().List(consul.DefaultPrefix, nil)
	if err != nil {
		t.Fatal(err)
	}
	return kvs
}

// holderIs checks that the entry of key is locked with token, at fence.
func holderIs(ctx context.Context, t *testing.T, b *owns, key, token string, fence uint64) {
	t.Helper()
	h, err := b.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Held || h.Token != token || h.Fence != fence {
		t.Fatalf("holder of %q: %+v; want %s at fence %d", key, h, token, fence)
	}
}

// A release hands the lock to the head of the queue, in queue order, and
// wakes only the head; fences grow. The first release (the holder knows of
// no waiter) deletes the entry, reads the queue and hands over in a second
// transaction; the next ones hand over in the release's own transaction,
// from the waiters the handover told the new holder of.
func TestQueueHandsOverInOrder(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	holder, _ := newBackend(t, agent.Addr)
	tok := newToken()
	g, err := holder.Acquire(ctx, "k", tok, queueTTL)
	if err != nil {
		t.Fatal(err)
	}
	var bs []*owns
	var ws []*queuetest.Waiter
	for range 3 {
		b, _ := newBackend(t, agent.Addr)
		bs = append(bs, b)
		ws = append(ws, queueUp(ctx, t, b, "k"))
	}
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	prev := g.Fence
	for i, w := range ws {
		who := []string{"the first waiter", "the second waiter", "the third waiter"}[i]
		h := w.Handed(t, who)
		for _, later := range ws[i+1:] {
			later.NotWoken(t, "a later waiter")
		}
		if h.Fence <= prev {
			t.Fatalf("%s was handed fence %d after %d; want it greater", who, h.Fence, prev)
		}
		prev = h.Fence
		holderIs(ctx, t, bs[i], "k", h.Token, h.Fence)
		if h.Since.After(time.Now()) {
			t.Fatalf("%s's handover counts from %v, in the future", who, h.Since)
		}
		if err := bs[i].Release(ctx, "k", h.Token); err != nil {
			t.Fatalf("release by %s: %v", who, err)
		}
	}
	// Nothing is left: no lock, no record.
	_, cli := newBackend(t, agent.Addr)
	if kvs := entries(t, cli); len(kvs) != 0 {
		t.Fatalf("left behind: %d entries, the first %s", len(kvs), kvs[0].Key)
	}
}

// A waiter whose session went while it waited (expired, or destroyed from
// outside) is never handed the lock from its record: the release skips it
// for the next waiter; the waiter is woken, and its next attempt queues
// again, at the back.
func TestQueueRecordVanishes(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	holder, cli := newBackend(t, agent.Addr)
	tok := newToken()
	if _, err := holder.Acquire(ctx, "k", tok, queueTTL); err != nil {
		t.Fatal(err)
	}
	b1, _ := newBackend(t, agent.Addr)
	b2, _ := newBackend(t, agent.Addr)
	w1 := queueUp(ctx, t, b1, "k")
	w2 := queueUp(ctx, t, b2, "k")
	// Destroy the first waiter's session from outside.
	var sess string
	for _, kv := range entries(t, cli) {
		if strings.Contains(kv.Key, "/q/") && strings.HasSuffix(string(kv.Value), w1.Token) {
			sess = kv.Session
		}
	}
	if sess == "" {
		t.Fatal("the first waiter's record is not in the store")
	}
	if _, err := cli.Session().Destroy(sess, nil); err != nil {
		t.Fatal(err)
	}
	w1.WakeUp(t, "the waiter whose session went")
	if _, ok := w1.Q.Handed(); ok {
		t.Fatal("a waiter whose session went was handed the lock")
	}
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	// Its next attempt queues it again, with a new session.
	queuetest.RequeuedAfterVanishing(ctx, t, "k", w1, w2, b1, b2, func(h backend.Handover) {
		holderIs(ctx, t, b2, "k", h.Token, h.Fence)
	})
}

// A waiter that gives up leaves nothing behind: its record goes, and a
// lock handed to it (even one it never learned of) is freed.
func TestQueueGivingUpLeavesNothing(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	holder, cli := newBackend(t, agent.Addr, consul.WithLockDelay(0))
	b1, _ := newBackend(t, agent.Addr, consul.WithLockDelay(0))
	tok := newToken()
	if _, err := holder.Acquire(ctx, "k", tok, queueTTL); err != nil {
		t.Fatal(err)
	}
	w := queueUp(ctx, t, b1, "k")
	var sess string
	for _, kv := range entries(t, cli) {
		if strings.Contains(kv.Key, "/q/") {
			sess = kv.Session
		}
	}
	if sess == "" {
		t.Fatalf("no record of the queued waiter: %v", entries(t, cli))
	}
	w.Q.Close(false)
	// Gone when Close returns: a release right after must not find it.
	if kvs := entries(t, cli); len(kvs) != 1 {
		t.Fatalf("entries right after the waiter gave up: %d; want the lock entry alone", len(kvs))
	}
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the key to be free", func() bool { return len(entries(t, cli)) == 0 })
	// The record was deleted unchanged, so nothing was handed to the
	// session: it is kept for reuse, not destroyed (which would put a
	// lock-delay on the record's name).
	if info, _, err := cli.Session().Info(sess, nil); err != nil || info == nil {
		t.Errorf("the session of a waiter that left while queued: %v, %v; want it kept", info, err)
	}

	// Handed, then gives up without taking it.
	tok = newToken()
	if _, err := holder.Acquire(ctx, "k", tok, queueTTL); err != nil {
		t.Fatal(err)
	}
	w = queueUp(ctx, t, b1, "k")
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	w.WakeUp(t, "the waiter")
	if _, ok := w.Q.Handed(); !ok {
		t.Fatal("nothing handed to the waiter")
	}
	w.Q.Close(false)
	if kvs := entries(t, cli); len(kvs) != 0 {
		t.Fatalf("entries right after a waiter handed the lock gave up: %d; want none", len(kvs))
	}
	if _, err := holder.Acquire(ctx, "k", newToken(), queueTTL); err != nil {
		t.Fatalf("Acquire after the waiter gave up: %v", err)
	}
}

// waitFor polls cond (a store read) until it holds, for at most 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling the store
	}
}

// A waiter cut off from the agent just before the release hands it the
// lock, for longer than its session can live (Consul expires a session up
// to twice its TTL after its last renewal): whichever way it gets the lock
// once the connection heals (the handover, counted from its last renewal,
// or its own next attempt, counted from that attempt's send), no other
// client can take the key before the deadline of the lease it got.
// (TestQueueHandsOverInOrder checks that a handover counts from the
// waiter's own request.)
func TestCutOffWaiterGetsNoStaleHandover(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	const ttl = time.Second
	hb, _ := newBackend(t, agent.Addr, consul.WithLockDelay(0))
	holder, err := lock.New(hb, lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	px := faultproxy.Start(t, agent.Addr)
	wb, _ := newBackend(t, px.Addr, consul.WithLockDelay(0))
	waiter, err := lock.New(wb, lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	other, cli := newBackend(t, agent.Addr, consul.WithLockDelay(0))
	l, err := holder.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := queuetest.AcquireLater(ctx, t, waiter, "k")
	waitFor(t, "the waiter to queue", func() bool {
		kvs, _, _ := cli.KV().List(consul.DefaultPrefix+"k/q/", nil)
		return len(kvs) == 1
	})
	px.Cut()
	if err := l.Release(ctx); err != nil { // hands the lock to the waiter
		t.Fatal(err)
	}
	time.Sleep(2*ttl + 1500*time.Millisecond) // past the session's latest expiry
	px.Heal()
	wl := <-got
	if wl == nil {
		return
	}
	defer wl.Release(ctx)
	dl := wl.Deadline() // as the waiter got it (renewals move it on)
	for time.Now().Before(dl) {
		if g, err := other.Acquire(ctx, "k", newToken(), ttl); err == nil {
			t.Fatalf("another client took the key (fence %d) %v before the waiter's deadline (its fence %d)", g.Fence, time.Until(dl), wl.Fence())
		}
		time.Sleep(5 * time.Millisecond) // poll the store
	}
}

// A lock handed to a place whose caller never takes it (a goroutine that
// stalls before it looks) is not kept alive by the place: the queue stops
// refreshing a record once it is handed over (package waitq), so the
// session expires and another client gets the key. (Consul's place used
// to renew its session until it closed, which kept such a lock as long as
// the waiter's process lived; etcd's and Redis's stopped at the handover.
// On that code this test fails.)
func TestHandedLockNotTakenExpires(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	const ttl = 2 * consultest.MinTTL
	holder, _ := newBackend(t, agent.Addr)
	other, _ := newBackend(t, agent.Addr)
	b, _ := newBackend(t, agent.Addr)
	tok := newToken()
	if _, err := holder.Acquire(ctx, "k", tok, ttl); err != nil {
		t.Fatal(err)
	}
	w := queuetest.Queue(ctx, t, b, "k", ttl)
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	w.WakeUp(t, "the waiter")
	h, ok := w.Q.Handed()
	if !ok {
		t.Fatal("nothing handed to the waiter")
	}
	// Neither taken nor closed: the session must expire by its latest
	// expiry, and the lock with it, after the lock-delay.
	latest := h.Since.Add(other.Capabilities().LatestExpiry(ttl) + consul.DefaultLockDelay + 5*time.Second)
	for {
		_, err := other.Acquire(ctx, "k", newToken(), ttl)
		if err == nil {
			break
		}
		if time.Now().After(latest) {
			t.Fatalf("the lock handed to a waiter that never took it is still held %v after its latest expiry: %v", time.Since(h.Since), err)
		}
		time.Sleep(200 * time.Millisecond) // poll the store
	}
}
