package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/etcd"
)

// keysOf returns what the store keeps for key: every key under its lock
// key, by what follows the lock key ("" for the lock key itself, "h/TOKEN"
// for a holder label, "q/ID" for a queue record), with its value.
func keysOf(ctx context.Context, t *testing.T, cli *clientv3.Client, b *etcd.Backend, key string) map[string]string {
	t.Helper()
	lk := etcd.LockKey(b, key)
	resp, err := cli.Get(ctx, lk, clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), lk)] = string(kv.Value)
	}
	return out
}

// attachedTo returns the keys attached to lease id, sorted.
func attachedTo(ctx context.Context, t *testing.T, cli *clientv3.Client, id clientv3.LeaseID) []string {
	t.Helper()
	resp, err := cli.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatalf("TimeToLive: %v", err)
	}
	var out []string
	for _, k := range resp.Keys {
		out = append(out, string(k))
	}
	slices.Sort(out)
	return out
}

// A labelled acquire stores the label beside the lock, on its lease, in
// the acquire's one transaction; Inspect reports it; the release leaves
// nothing under the key, and nothing on the lease, which the next lock of
// the backend reuses.
func TestLabelStoredAndReleased(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	b, cli := newBackend(t, srv.Addr)
	if !b.Capabilities().Labels {
		t.Fatal("Capabilities().Labels is false")
	}
	const label = "host 42 prog"
	lctx := backend.WithLabel(ctx, label)
	tok := newToken()
	g, err := b.Acquire(lctx, "k", tok, 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if h := holderOf(ctx, t, b, "k"); !h.Held || h.Token != tok || h.Fence != g.Fence || h.Label != label {
		t.Fatalf("Inspect: %+v; want token %s, fence %d and label %q", h, tok, g.Fence, label)
	}
	id := leaseOf(ctx, t, cli, tok)
	lk := etcd.LockKey(b, "k")
	if got, want := attachedTo(ctx, t, cli, id), []string{lk, lk + "h/" + tok}; !slices.Equal(got, want) {
		t.Fatalf("the lock's lease carries %q; want the lock key and the label key %q", got, want)
	}
	if got := keysOf(ctx, t, cli, b, "k"); got["h/"+tok] != label || len(got) != 2 {
		t.Fatalf("the store keeps %q under the lock key; want the token and its label", got)
	}

	if err := b.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if h := holderOf(ctx, t, b, "k"); h != (backend.Holder{}) {
		t.Fatalf("Inspect after the release: %+v; want the zero Holder", h)
	}
	if got := keysOf(ctx, t, cli, b, "k"); len(got) != 0 {
		t.Fatalf("the store keeps %q under the released lock's key; want nothing", got)
	}
	// The lease went back to the pool: the next lock is on it, without
	// the label of the one before.
	next := newToken()
	if _, err := b.Acquire(ctx, "other", next, 10*time.Second); err != nil {
		t.Fatalf("Acquire of another key: %v", err)
	}
	if got := leaseOf(ctx, t, cli, next); got != id {
		t.Fatalf("the next lock is on lease %x, not on the released lock's %x: the test needs it reused", got, id)
	}
	if got, want := attachedTo(ctx, t, cli, id), []string{etcd.LockKey(b, "other")}; !slices.Equal(got, want) {
		t.Fatalf("the reused lease carries %q; want only the next lock's key %q", got, want)
	}
	if h := holderOf(ctx, t, b, "other"); h.Label != "" {
		t.Fatalf("Inspect of the next lock, taken without a label: label %q; want none", h.Label)
	}
}

// A label costs no request: a labelled acquire sends what an unlabelled
// one sends; and a lock taken without one has no label key.
func TestLabelCostsNoRequest(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	sent := func(label string) int64 {
		var n atomic.Int64
		b, err := etcd.New(countingClient(t, &n, srv.Addr), etcd.WithElectionTimeout(electionTimeout))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		key, tok := "k-"+newToken()[:8], newToken()
		before := n.Load()
		if _, err := b.Acquire(backend.WithLabel(ctx, label), key, tok, 10*time.Second); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		return n.Load() - before
	}
	if plain, labelled := sent(""), sent("a label"); labelled != plain {
		t.Errorf("a labelled acquire sent %d requests; an unlabelled one %d", labelled, plain)
	}

	b, cli := newBackend(t, srv.Addr)
	tok := newToken()
	if _, err := b.Acquire(ctx, "plain", tok, 10*time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if got := keysOf(ctx, t, cli, b, "plain"); len(got) != 1 || got[""] != tok {
		t.Fatalf("the store keeps %q for a lock taken without a label; want the lock key alone", got)
	}
	if h := holderOf(ctx, t, b, "plain"); !h.Held || h.Label != "" {
		t.Fatalf("Inspect: %+v; want held without a label", h)
	}
	// A label too long for package lock is refused by the backend too.
	long := backend.WithLabel(ctx, strings.Repeat("x", backend.MaxLabel+1))
	if _, err := b.Acquire(long, "long", newToken(), 10*time.Second); !errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("Acquire with a label of %d bytes: %v; want ErrInvalid", backend.MaxLabel+1, err)
	}
	q, err := b.Queue("long")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close(false)
	if _, err := q.Acquire(long, newToken(), 10*time.Second); !errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("a waiter's Acquire with a label of %d bytes: %v; want ErrInvalid", backend.MaxLabel+1, err)
	}
}

// A release from another backend (lockctl break, say), which did not
// acquire the lock, deletes the label too.
func TestLabelForeignRelease(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	b, cli := newBackend(t, srv.Addr)
	other, _ := newBackend(t, srv.Addr)
	tok := newToken()
	if _, err := b.Acquire(backend.WithLabel(ctx, "held"), "k", tok, 10*time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := other.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release by another backend: %v", err)
	}
	if got := keysOf(ctx, t, cli, b, "k"); len(got) != 0 {
		t.Fatalf("the store keeps %q under the key after another backend's release; want nothing", got)
	}
}

// With sessions, many locks share a lease: a released lock's label must
// not stay on it, nor the label of a lock deleted from outside, whether a
// renewal or the release finds it gone.
func TestLabelSessions(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	b, cli := newBackend(t, srv.Addr, etcd.WithSessions(true))
	ttl := 10 * time.Second
	toks := sessionTokens(t, b, ttl, 4)
	for i, tok := range toks {
		if _, err := b.Acquire(backend.WithLabel(ctx, fmt.Sprint("holder ", i)), fmt.Sprint("k", i), tok, ttl); err != nil {
			t.Fatalf("Acquire k%d: %v", i, err)
		}
	}
	id := leaseOf(ctx, t, cli, toks[0])
	for i, tok := range toks {
		if got := leaseOf(ctx, t, cli, tok); got != id {
			t.Fatalf("k%d is on lease %x; want the session's %x", i, got, id)
		}
		if h := holderOf(ctx, t, b, fmt.Sprint("k", i)); h.Token != tok || h.Label != fmt.Sprint("holder ", i) {
			t.Fatalf("Inspect k%d: %+v; want token %s and label %q", i, h, tok, fmt.Sprint("holder ", i))
		}
	}
	lk := func(i int) string { return etcd.LockKey(b, fmt.Sprint("k", i)) }
	carries := func(want ...string) {
		t.Helper()
		slices.Sort(want)
		if got := attachedTo(ctx, t, cli, id); !slices.Equal(got, want) {
			t.Fatalf("the session's lease carries %q; want %q", got, want)
		}
	}

	// A release.
	if err := b.Release(ctx, "k0", toks[0]); err != nil {
		t.Fatalf("Release k0: %v", err)
	}
	if got := keysOf(ctx, t, cli, b, "k0"); len(got) != 0 {
		t.Fatalf("the store keeps %q under k0 after its release; want nothing", got)
	}
	carries(lk(1), lk(1)+"h/"+toks[1], lk(2), lk(2)+"h/"+toks[2], lk(3), lk(3)+"h/"+toks[3])

	// k1 deleted from outside: the renewal finds it lost.
	if _, err := cli.Delete(ctx, lk(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Renew(ctx, "k1", toks[1], ttl); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Renew of k1, deleted from outside: %v; want ErrNotHeld", err)
	}
	carries(lk(2), lk(2)+"h/"+toks[2], lk(3), lk(3)+"h/"+toks[3])

	// k2 deleted from outside: the release finds it not held.
	if _, err := cli.Delete(ctx, lk(2)); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "k2", toks[2]); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release of k2, deleted from outside: %v; want ErrNotHeld", err)
	}
	carries(lk(3), lk(3)+"h/"+toks[3])
	if h := holderOf(ctx, t, b, "k3"); h.Label != "holder 3" {
		t.Fatalf("Inspect k3: %+v; want label %q", h, "holder 3")
	}
}

// A waiter's label goes with its record, so that the lock the release
// hands it shows it; the releasing holder's label goes. The holder's
// Inspect never shows a waiter's label.
func TestLabelHandover(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	holder, cli := newBackend(t, srv.Addr)
	follow(ctx, t, holder, "k") // so that its release hands over
	tok := newToken()
	if _, err := holder.Acquire(backend.WithLabel(ctx, "the holder"), "k", tok, 10*time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	wb, _ := newBackend(t, srv.Addr)
	w := queueUp(backend.WithLabel(ctx, "the waiter"), t, wb, "k")
	if h := holderOf(ctx, t, holder, "k"); h.Token != tok || h.Label != "the holder" {
		t.Fatalf("Inspect with a waiter queued: %+v; want the holder's token and label", h)
	}
	seenQueued(t, holder, "k", w.tok)
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	f := w.handed(t, "the waiter")
	if h := holderOf(ctx, t, holder, "k"); h.Token != w.tok || h.Fence != f || h.Label != "the waiter" {
		t.Fatalf("Inspect after the handover: %+v; want the waiter's token %s, fence %d and label %q", h, w.tok, f, "the waiter")
	}
	id := leaseOf(ctx, t, cli, w.tok)
	if got := keysOf(ctx, t, cli, holder, "k"); len(got) != 2 || got["h/"+w.tok] != "the waiter" {
		t.Fatalf("the store keeps %q under the key after the handover; want the waiter's token and label", got)
	}
	if err := wb.Release(ctx, "k", w.tok); err != nil {
		t.Fatalf("Release by the waiter: %v", err)
	}
	if got := keysOf(ctx, t, cli, holder, "k"); len(got) != 0 {
		t.Fatalf("the store keeps %q under the key after the last release; want nothing", got)
	}
	if got := attachedTo(ctx, t, cli, id); len(got) != 0 {
		t.Fatalf("the waiter's lease, back in its backend's pool, carries %q; want nothing", got)
	}
}

// A waiter that takes the key itself, with a new token, shows the label
// of that attempt; the label it queued with is gone, so that its lease,
// back in the pool after the release, carries nothing.
func TestLabelWaiterTakesTheKey(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	holder, cli := newBackend(t, srv.Addr) // does not follow the key: its release wakes the waiter
	tok := newToken()
	if _, err := holder.Acquire(ctx, "k", tok, 10*time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	wb, _ := newBackend(t, srv.Addr)
	w := queueUp(backend.WithLabel(ctx, "queued"), t, wb, "k")
	if got := keysOf(ctx, t, cli, holder, "k"); got["h/"+w.tok] != "queued" {
		t.Fatalf("the store keeps %q under the key; want the waiter's label beside its record", got)
	}
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	w.woken(t, "the waiter")
	wtok := newToken()
	if _, err := w.q.Acquire(backend.WithLabel(ctx, "taken"), wtok, 10*time.Second); err != nil {
		t.Fatalf("Acquire by the woken waiter: %v", err)
	}
	w.q.Close(true)
	if h := holderOf(ctx, t, holder, "k"); h.Token != wtok || h.Label != "taken" {
		t.Fatalf("Inspect: %+v; want token %s and label %q", h, wtok, "taken")
	}
	if got := keysOf(ctx, t, cli, holder, "k"); len(got) != 2 || got["h/"+wtok] != "taken" {
		t.Fatalf("the store keeps %q under the key; want the lock key and its holder's label only", got)
	}
	id := leaseOf(ctx, t, cli, wtok)
	if err := wb.Release(ctx, "k", wtok); err != nil {
		t.Fatalf("Release by the waiter: %v", err)
	}
	if got := attachedTo(ctx, t, cli, id); len(got) != 0 {
		t.Fatalf("the waiter's lease, back in its backend's pool, carries %q; want nothing", got)
	}
}

// With more labelled waiters than Inspect's first read takes, Inspect
// still finds the holder's label, and only the holder's.
func TestLabelInspectWithManyWaiters(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	holder, _ := newBackend(t, srv.Addr)
	tok := strings.Repeat("f", 32) // sorts after every waiter's label
	if _, err := holder.Acquire(backend.WithLabel(ctx, "the holder"), "k", tok, 10*time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	wb, _ := newBackend(t, srv.Addr)
	for i := range 20 {
		queueUp(backend.WithLabel(ctx, fmt.Sprint("waiter ", i)), t, wb, "k")
	}
	if h := holderOf(ctx, t, holder, "k"); h.Token != tok || h.Label != "the holder" {
		t.Fatalf("Inspect with 20 labelled waiters: %+v; want the holder's token and label", h)
	}
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
