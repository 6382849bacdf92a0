package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/etcd"
)

// waiter is a place in a key's queue that found the key held.
type waiter struct {
	b   *etcd.Backend
	q   backend.Queue
	tok string
}

// queueUp makes a waiter of b for key: an acquire through a new place that
// finds the key held, and so queues.
func queueUp(ctx context.Context, t *testing.T, b *etcd.Backend, key string) *waiter {
	t.Helper()
	q, err := b.Queue(key)
	if err != nil {
		t.Fatalf("Queue: %v", err)
	}
	t.Cleanup(func() { q.Close(false) })
	w := &waiter{b: b, q: q}
	w.try(ctx, t, key)
	return w
}

// try acquires through the place, which must find the key held.
func (w *waiter) try(ctx context.Context, t *testing.T, key string) {
	t.Helper()
	tok := newToken()
	if _, err := w.q.Acquire(ctx, tok, 10*time.Second); !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("Acquire of %q through a place, the key held or others queued: %v; want ErrLocked", key, err)
	}
	w.tok = tok
}

// woken waits for w's wake-up.
func (w *waiter) woken(t *testing.T, who string) {
	t.Helper()
	select {
	case <-w.q.C():
	case <-time.After(5 * time.Second):
		t.Fatalf("%s was not woken within 5s", who)
	}
}

// notWoken fails t if w has a wake-up.
func (w *waiter) notWoken(t *testing.T, who string) {
	t.Helper()
	select {
	case <-w.q.C():
		t.Errorf("%s was woken, though not at the head of the queue", who)
	default:
	}
}

// seenQueued waits until b's follower of key sees tok at the head of its
// queue: the watch event of a queue record comes a moment after the write.
func seenQueued(t *testing.T, b *etcd.Backend, key, tok string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for etcd.QueueHeadToken(b, key) != tok {
		if time.Now().After(deadline) {
			t.Fatalf("the holder's watch did not see the waiter %s queued within 5s (head %q)", tok, etcd.QueueHeadToken(b, key))
		}
		time.Sleep(time.Millisecond) // poll the follower's view
	}
}

// handed waits for the handover to w and returns its fence.
func (w *waiter) handed(t *testing.T, who string) uint64 {
	t.Helper()
	w.woken(t, who)
	h, ok := w.q.Handed()
	if !ok {
		t.Fatalf("%s was woken, but nothing was handed to it", who)
	}
	if h.Token != w.tok || h.Fence == 0 || h.Since.IsZero() || h.TTL < 10*time.Second {
		t.Fatalf("%s was handed %+v; want its token %s, a fence, a send time and the 10s TTL", who, h, w.tok)
	}
	w.q.Close(true)
	return h.Fence
}

func holderOf(ctx context.Context, t *testing.T, b *etcd.Backend, key string) backend.Holder {
	t.Helper()
	h, err := b.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return h
}

// follow makes b follow key for a while: a watch of it, closed at once
// (the backend follows the key some seconds longer).
func follow(ctx context.Context, t *testing.T, b *etcd.Backend, key string) {
	t.Helper()
	w, err := b.Watch(ctx, key)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	w.Close(false)
}

// A release by a backend that follows the key hands the lock to the head
// of the queue, in queue order, with fences that grow; a release by one
// that does not deletes the key and wakes the head, whose acquire takes
// it; newcomers never go ahead of the queue.
func TestQueueHandsOverInOrder(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	holder, _ := newBackend(t, srv.Addr)
	newcomer, _ := newBackend(t, srv.Addr)
	tok := newToken()
	g, err := holder.Acquire(ctx, "k", tok, 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	var ws []*waiter
	for range 3 {
		b, _ := newBackend(t, srv.Addr)
		ws = append(ws, queueUp(ctx, t, b, "k"))
	}
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// The holder did not follow the key: the head is woken, and takes it.
	ws[0].woken(t, "the first waiter")
	if _, ok := ws[0].q.Handed(); ok {
		t.Fatal("the first waiter was handed the lock by a release that does not follow the key")
	}
	ws[1].notWoken(t, "the second waiter")
	if _, err := newcomer.Acquire(ctx, "k", newToken(), time.Second); !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("Acquire by a newcomer while 3 wait and the key is free: %v; want ErrLocked", err)
	}
	tok0 := newToken()
	g0, err := ws[0].q.Acquire(ctx, tok0, 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire by the head: %v", err)
	}
	ws[0].q.Close(true)
	last := g0.Fence
	if last <= g.Fence {
		t.Fatalf("fence %d after %d", last, g.Fence)
	}
	// From now on each release comes from a backend that follows the
	// key: it hands the lock over.
	relB, relTok := ws[0].b, tok0
	for i, w := range ws[1:] {
		seenQueued(t, relB, "k", w.tok)
		if err := relB.Release(ctx, "k", relTok); err != nil {
			t.Fatalf("Release by waiter %d: %v", i, err)
		}
		f := w.handed(t, "the next waiter")
		if f <= last {
			t.Fatalf("handed fence %d after %d", f, last)
		}
		if h := holderOf(ctx, t, w.b, "k"); h.Token != w.tok || h.Fence != f {
			t.Fatalf("the store's holder %+v; want token %s with fence %d", h, w.tok, f)
		}
		if _, err := newcomer.Acquire(ctx, "k", newToken(), time.Second); !errors.Is(err, backend.ErrLocked) {
			t.Fatalf("Acquire by a newcomer while the key is handed over: %v; want ErrLocked", err)
		}
		// A renewal works on the handed lock: it is this backend's.
		if _, err := w.b.Renew(ctx, "k", w.tok, 10*time.Second); err != nil {
			t.Fatalf("Renew of the handed lock: %v", err)
		}
		last, relB, relTok = f, w.b, w.tok
	}
	if err := relB.Release(ctx, "k", relTok); err != nil {
		t.Fatalf("Release by the last waiter: %v", err)
	}
	if g, err := newcomer.Acquire(ctx, "k", newToken(), time.Second); err != nil || g.Fence <= last {
		t.Fatalf("Acquire by a newcomer once the queue is empty: %+v, %v; want a grant above fence %d", g, err, last)
	}
}

// A waiter whose queue record vanishes (its lease expired: here, revoked)
// is never handed the lock from it, nor takes it ahead of the others: it
// queues again, at the back (the Jepsen etcd 3.4.3 finding). A waiter that
// leaves passes its turn on.
func TestQueueRecordVanishes(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	holder, cli := newBackend(t, srv.Addr)
	// The holder follows the key, so its release hands over.
	follow(ctx, t, holder, "k")
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
	resp, err := cli.Get(ctx, etcd.DefaultPrefix+"k/k\xffq/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil || len(resp.Kvs) != 3 || string(resp.Kvs[0].Value) != a.tok {
		t.Fatalf("queue %v, %v; want 3 records, a's first", resp, err)
	}
	// a's record vanishes, and the holder releases at once: whether or
	// not the holder's view already lacks the record, a is not handed
	// the lock.
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	a.woken(t, "the waiter whose record vanished")
	if h, ok := a.q.Handed(); ok {
		t.Fatalf("the waiter whose record vanished was handed %+v", h)
	}
	a.try(ctx, t, "k") // it queues again, at the back
	// b, now the head, gets the lock: handed, or woken to take it.
	b.woken(t, "the second waiter, now at the head")
	if _, ok := b.q.Handed(); !ok {
		btok := newToken()
		if _, err := b.q.Acquire(ctx, btok, 10*time.Second); err != nil {
			t.Fatalf("Acquire by the head: %v", err)
		}
		b.tok = btok
	}
	b.q.Close(true)
	// b releases (its backend follows the key): c is handed it.
	if err := bb.Release(ctx, "k", b.tok); err != nil {
		t.Fatalf("Release by b: %v", err)
	}
	c.handed(t, "the third waiter")
	a.notWoken(t, "the waiter queued again, behind c")
	if err := cb.Release(ctx, "k", c.tok); err != nil {
		t.Fatalf("Release by c: %v", err)
	}
	a.handed(t, "the waiter queued again, now at the head")
}

// A waiter that leaves without the key leaves nothing in the store: not
// its record, and not a lock handed to it, before or after it left.
func TestQueueGivingUpLeavesNothing(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	for _, when := range []string{"handed before it left", "released as it leaves"} {
		t.Run(when, func(t *testing.T) {
			key := "k-" + newToken()[:8]
			holder, cli := newBackend(t, srv.Addr)
			follow(ctx, t, holder, key)
			tok := newToken()
			if _, err := holder.Acquire(ctx, key, tok, 10*time.Second); err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			wb, _ := newBackend(t, srv.Addr)
			w := queueUp(ctx, t, wb, key)
			if when == "handed before it left" {
				// The holder hands over only to a waiter its watch
				// has seen; before that its release deletes the key.
				seenQueued(t, holder, key, w.tok)
				if err := holder.Release(ctx, key, tok); err != nil {
					t.Fatalf("Release: %v", err)
				}
				// A wake-up may come before the handover's (a watch
				// event of the queue); the handover follows.
				for {
					w.woken(t, "the waiter")
					if _, ok := w.q.Handed(); ok {
						break
					}
				}
				w.q.Close(false)
			} else {
				w.q.Close(false)
				if err := holder.Release(ctx, key, tok); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}
			// Nothing left once Close and the release returned: a
			// release or an acquire right after finds no trace of the
			// waiter.
			resp, err := cli.Get(ctx, etcd.DefaultPrefix+"k/"+key+"\xff", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatal(err)
			}
			if resp.Count != 0 {
				t.Fatalf("%d keys of the lock or its queue left right after the waiter left", resp.Count)
			}
			if _, err := holder.Acquire(ctx, key, newToken(), time.Second); err != nil {
				t.Fatalf("Acquire after the waiter left: %v", err)
			}
		})
	}
}

// Through package lock: the waiter's lease counts its deadline from its
// own request before the release, not from the handover, and the handed
// lock works as any other (renewed, released, fenced).
func TestHandedLeaseDeadlineFromTheWaitersRequest(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	ab, _ := newBackend(t, srv.Addr)
	bb, _ := newBackend(t, srv.Addr)
	a, err := lock.New(ab, lock.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := lock.New(bb, lock.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// a's backend follows the key, so its release hands over.
	follow(ctx, t, ab, "k")
	first, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l     *lock.Lease
		err   error
		start time.Time
	}
	got := make(chan result, 1)
	go func() {
		start := time.Now()
		l, err := b.Acquire(ctx, "k")
		got <- result{l, err, start}
	}()
	// Until b queued: the store then shows its record.
	cli := newClient(t, srv.Addr)
	for {
		resp, err := cli.Get(ctx, etcd.DefaultPrefix+"k/k\xffq/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond) // poll the store
	}
	fa := first.Fence()
	time.Sleep(500 * time.Millisecond) // a's critical section
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	r := <-got
	if r.err != nil {
		t.Fatalf("b's Acquire: %v", r.err)
	}
	l := r.l
	// Counted from b's first attempt, 500ms before the release, not from
	// the handover: at most the TTL less those 500ms after the release.
	if left := l.Deadline().Sub(released); left > 2500*time.Millisecond {
		t.Errorf("b's deadline is %v after a's release; want at most 2.5s: it counts from b's own request, sent 500ms before", left)
	}
	if !l.Deadline().After(r.start) {
		t.Errorf("b's deadline %v is before its Acquire began", l.Deadline())
	}
	if l.Fence() <= fa {
		t.Errorf("b's fence %d after a's %d", l.Fence(), fa)
	}
	if err := l.Renew(ctx); err != nil {
		t.Errorf("Renew of the handed lease: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release of the handed lease: %v", err)
	}
	if l2, err := a.TryAcquire(ctx, "k"); err != nil {
		t.Errorf("TryAcquire after b released: %v", err)
	} else {
		l2.Release(ctx)
	}
	b.Close()
	a.Close()
}

// An attempt that expects to queue does not refresh a lease refreshed
// lately; when it takes the key after all, the lease is refreshed before
// the grant is reported, so that the store keeps the lock at least the TTL
// from the attempt; and when that lease turned out to be gone, the attempt
// goes on with a new one.
func TestUnexpectedGrantRefreshesTheLease(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	for _, gone := range []bool{false, true} {
		name := map[bool]string{false: "lease alive", true: "lease gone"}[gone]
		t.Run(name, func(t *testing.T) {
			b, cli := newBackend(t, srv.Addr)
			etcd.PredictRefusal(b, true)
			key := "k-" + newToken()[:8]
			// An idle lease in the pool, refreshed now.
			tok := newToken()
			if _, err := b.Acquire(ctx, key, tok, 6*time.Second); err != nil {
				t.Fatal(err)
			}
			h, err := b.Inspect(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := cli.Get(ctx, etcd.DefaultPrefix+"k/"+key+"\xff")
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("Get of the lock key: %v, %v", resp, err)
			}
			idle := clientv3.LeaseID(resp.Kvs[0].Lease)
			if err := b.Release(ctx, key, tok); err != nil {
				t.Fatal(err)
			}
			if gone {
				if _, err := cli.Revoke(ctx, idle); err != nil {
					t.Fatal(err)
				}
			} else {
				time.Sleep(1800 * time.Millisecond) // the idle lease ages (less than a third of its 6s TTL)
			}
			q, err := b.Queue(key)
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close(true)
			start := time.Now()
			g, err := q.Acquire(ctx, newToken(), 6*time.Second)
			if err != nil {
				t.Fatalf("Acquire of a free key through a place: %v", err)
			}
			if g.Fence <= h.Fence || g.TTL < 6*time.Second {
				t.Fatalf("grant %+v after fence %d; want a higher fence and the 6s TTL", g, h.Fence)
			}
			resp, err = cli.Get(ctx, etcd.DefaultPrefix+"k/"+key+"\xff")
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("Get of the lock key: %v, %v", resp, err)
			}
			if l := clientv3.LeaseID(resp.Kvs[0].Lease); gone == (l == idle) {
				t.Fatalf("lock on lease %x, the idle one %x; want the idle one unless it was gone", l, idle)
			}
			ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
			if err != nil {
				t.Fatal(err)
			}
			// Refreshed after the attempt began: its whole TTL is
			// left, less the time since (TimeToLive rounds down).
			if left := time.Duration(ttl.TTL) * time.Second; left < 6*time.Second-time.Since(start)-time.Second {
				t.Fatalf("the lock's lease has %v left %v after the attempt began; want the 6s TTL from the attempt", left, time.Since(start))
			}
		})
	}
}

// An attempt that expects to queue, on a lease refreshed less than the
// unrefreshed window ago, takes the key after all: the lease carries the
// lock as it is, with no keep-alive, and the store still keeps the lock at
// least the TTL from the attempt (the lease's extra second). Were leases as
// long as the lock's TTL, it would expire ~0.4s early, and this test fails.
func TestUnexpectedGrantOnALeaseRefreshedLately(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	b, cli := newBackend(t, srv.Addr)
	etcd.PredictRefusal(b, true)
	var kas atomic.Int64
	etcd.AfterKeepAliveSent(b, func() { kas.Add(1) })
	const ttl = 2 * time.Second
	idleLeaseLateInWindow(ctx, t, b, ttl)
	q, err := b.Queue("k")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close(true)
	kas.Store(0)
	sent := time.Now()
	tok := newToken()
	g, err := q.Acquire(ctx, tok, ttl)
	if err != nil {
		t.Fatalf("Acquire of a free key through a place: %v", err)
	}
	if kas.Load() != 0 || g.TTL < ttl {
		t.Fatalf("grant %+v after %d keep-alives; want the TTL %v and none (the lease carries the lock as it is): the case tests nothing", g, kas.Load(), ttl)
	}
	resp, err := cli.Get(ctx, etcd.DefaultPrefix+"k/k\xff")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != tok {
		t.Fatalf("Get of the lock key: %v, %v", resp, err)
	}
	leaseLastsTTL(ctx, t, cli, clientv3.LeaseID(resp.Kvs[0].Lease), sent, ttl)
}

// A waiter whose replies (and watch events) are held while the lock is
// handed to it learns of it late, and counts its deadline from a request
// the store confirmed: no one else takes the key before that deadline,
// and the store still holds it for the waiter then.
func TestHandoverWithRepliesHeld(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	for round := range 3 {
		key := fmt.Sprintf("k%d", round)
		hb, _ := newBackend(t, srv.Addr)
		follow(ctx, t, hb, key)
		holder, err := lock.New(hb, lock.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		px := faultproxy.Start(t, srv.Addr)
		wb, err := etcd.New(newClient(t, px.Addr), etcd.WithElectionTimeout(electionTimeout))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { wb.Close() })
		waiter, err := lock.New(wb, lock.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		other, _ := newBackend(t, srv.Addr)
		h, err := holder.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *lock.Lease, 1)
		go func() {
			l, err := waiter.Acquire(ctx, key)
			if err != nil {
				t.Errorf("waiter's Acquire: %v", err)
			}
			got <- l
		}()
		time.Sleep(300 * time.Millisecond) // the waiter queues
		px.Hold(faultproxy.ToClient)
		time.Sleep(time.Duration(200+round*400) * time.Millisecond)
		if err := h.Release(ctx); err != nil { // hands the lock to the waiter
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond) // longer than the TTL
		px.Deliver(faultproxy.ToClient)
		l := <-got
		if l == nil {
			return
		}
		dl := l.Deadline() // as the waiter got it (renewals move it on)
		for time.Now().Before(dl) {
			if g, err := other.Acquire(ctx, key, newToken(), time.Second); err == nil {
				t.Fatalf("round %d: another client took the key (fence %d) %v before the waiter's deadline (its fence %d)", round, g.Fence, time.Until(dl), l.Fence())
			}
			time.Sleep(5 * time.Millisecond) // poll the store
		}
		l.Release(ctx)
		holder.Close()
		waiter.Close()
	}
}

// One rule for every queue (package waitq): an attempt that finds the
// place's carrier gone changed nothing, and the one retry uses a new
// carrier, never a kept one. Here the waiter's lease and the backend's idle
// lease are both revoked from outside: the retry grants a new lease and
// queues the waiter again. (etcd's place used to retry on a lease from the
// pool, gone as well, and failed; on that code this test fails.)
func TestQueueRetriesOnANewLease(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	holder, cli := newBackend(t, srv.Addr)
	tok := newToken()
	if _, err := holder.Acquire(ctx, "k", tok, 10*time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	ab, _ := newBackend(t, srv.Addr)
	a := queueUp(ctx, t, ab, "k")
	// An idle lease for ab's pool: a lock of the same TTL, released.
	other := newToken()
	if _, err := ab.Acquire(ctx, "other", other, 10*time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	all, err := cli.Get(ctx, etcd.DefaultPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var leases []clientv3.LeaseID
	for _, kv := range all.Kvs {
		if v := string(kv.Value); v == other || v == a.tok {
			leases = append(leases, clientv3.LeaseID(kv.Lease))
		}
	}
	if len(leases) != 2 {
		t.Fatalf("found %d of the two leases (the waiter's record's, the idle one's)", len(leases))
	}
	if err := ab.Release(ctx, "other", other); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for _, id := range leases {
		if _, err := cli.Revoke(ctx, id); err != nil {
			t.Fatalf("Revoke: %v", err)
		}
	}
	a.woken(t, "the waiter whose lease was revoked")
	a.try(ctx, t, "k") // queued again, on a new lease
	rec, err := cli.Get(ctx, etcd.DefaultPrefix+"k/k\xffq/", clientv3.WithPrefix())
	if err != nil || len(rec.Kvs) != 1 || string(rec.Kvs[0].Value) != a.tok {
		t.Fatalf("queue %v, %v; want the waiter's new record", rec, err)
	}
	if id := clientv3.LeaseID(rec.Kvs[0].Lease); id == leases[0] || id == leases[1] {
		t.Fatalf("the waiter queued again on a revoked lease %x", id)
	}
}
