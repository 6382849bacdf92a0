package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/etcd"
)

// records returns the values and leases of key k's queue records, in queue
// order.
func records(ctx context.Context, t *testing.T, cli *clientv3.Client, k string) (values []string, leases []clientv3.LeaseID) {
	t.Helper()
	resp, err := cli.Get(ctx, etcd.DefaultPrefix+"q/1/"+k+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByValue, clientv3.SortAscend))
	if err != nil {
		t.Fatalf("Get of the queue: %v", err)
	}
	for _, kv := range resp.Kvs {
		values = append(values, string(kv.Value))
		leases = append(leases, clientv3.LeaseID(kv.Lease))
	}
	return values, leases
}

// waiter is a backend that found the key held and waits for it.
type waiter struct {
	b *etcd.Backend
	w backend.Watch
}

// queueUp makes a waiter of b for key: an acquire that finds the key held,
// then a watch.
func queueUp(ctx context.Context, t *testing.T, b *etcd.Backend, key string) waiter {
	t.Helper()
	if _, err := b.Acquire(ctx, key, newToken(), 10*time.Second); !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("Acquire of a held key: %v; want ErrLocked", err)
	}
	w, err := b.Watch(ctx, key)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	t.Cleanup(func() { w.Close(false) })
	return waiter{b, w}
}

// woken waits for w's wake-up.
func (w waiter) woken(t *testing.T, who string) {
	t.Helper()
	select {
	case <-w.w.C():
	case <-time.After(5 * time.Second):
		t.Fatalf("%s was not woken within 5s", who)
	}
}

// notWoken fails t if w has a wake-up.
func (w waiter) notWoken(t *testing.T, who string) {
	t.Helper()
	select {
	case <-w.w.C():
		t.Errorf("%s was woken, though not at the head of the queue", who)
	default:
	}
}

// take acquires key for w, which must succeed, and releases it.
func (w waiter) take(ctx context.Context, t *testing.T, key, who string) {
	t.Helper()
	tok := newToken()
	if _, err := w.b.Acquire(ctx, key, tok, 10*time.Second); err != nil {
		t.Fatalf("Acquire by %s at the head of the queue: %v", who, err)
	}
	w.w.Close(true)
	if err := w.b.Release(ctx, key, tok); err != nil {
		t.Fatalf("Release by %s: %v", who, err)
	}
}

// Each release wakes one waiter, the longest waiting, and a newcomer does
// not go ahead of the queue.
func TestQueueWakesOne(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	holder, _ := newBackend(t, srv.Addr)
	newcomer, _ := newBackend(t, srv.Addr)
	tok := newToken()
	if _, err := holder.Acquire(ctx, "k", tok, 10*time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	var ws []waiter
	for range 3 {
		b, _ := newBackend(t, srv.Addr)
		ws = append(ws, queueUp(ctx, t, b, "k"))
	}
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	names := []string{"the first waiter", "the second waiter", "the third waiter"}
	for i, w := range ws {
		w.woken(t, names[i])
		for j := i + 1; j < len(ws); j++ {
			ws[j].notWoken(t, names[j])
		}
		if _, err := newcomer.Acquire(ctx, "k", newToken(), time.Second); !errors.Is(err, backend.ErrLocked) {
			t.Fatalf("Acquire by a newcomer while %d wait: %v; want ErrLocked", len(ws)-i, err)
		}
		w.take(ctx, t, "k", names[i])
	}
	if _, err := newcomer.Acquire(ctx, "k", newToken(), time.Second); err != nil {
		t.Fatalf("Acquire by a newcomer once the queue is empty: %v", err)
	}
}

// A waiter whose queue record vanishes (its lease expired: here, revoked)
// is never granted the lock from it: the waiter behind it takes the key
// first, and the waiter queues again, at the back (the Jepsen etcd 3.4.3
// finding). A waiter that leaves passes its wake-up on.
func TestQueueRecordVanishes(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	holder, cli := newBackend(t, srv.Addr)
	tok := newToken()
	if _, err := holder.Acquire(ctx, "k", tok, 10*time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	ab, _ := newBackend(t, srv.Addr)
	bb, _ := newBackend(t, srv.Addr)
	cb, _ := newBackend(t, srv.Addr)
	a := queueUp(ctx, t, ab, "k")
	b := queueUp(ctx, t, bb, "k")
	c := queueUp(ctx, t, cb, "k")
	values, leases := records(ctx, t, cli, "k")
	if len(values) != 3 {
		t.Fatalf("queue %v; want 3 records", values)
	}
	if _, err := cli.Revoke(ctx, leases[0]); err != nil { // a's record vanishes
		t.Fatalf("Revoke: %v", err)
	}
	for { // until a queued again
		now, _ := records(ctx, t, cli, "k")
		if len(now) == 3 {
			if now[2] <= values[2] {
				t.Fatalf("queue %v after the first record vanished from %v: want the waiter again at the back", now, values)
			}
			break
		}
		time.Sleep(5 * time.Millisecond) // poll the store
	}
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := ab.Acquire(ctx, "k", newToken(), time.Second); !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("Acquire by the waiter whose record vanished, the key free: %v; want ErrLocked", err)
	}
	b.woken(t, "the second waiter, now at the head")
	// b leaves without the key: c, next, is woken.
	b.w.Close(false)
	c.woken(t, "the third waiter, after the head left")
	a.notWoken(t, "the waiter queued again")
	c.take(ctx, t, "k", "the third waiter")
	a.woken(t, "the waiter queued again, now at the head")
	a.take(ctx, t, "k", "the waiter queued again")
}
