package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/etcd"
)

// A waiter's attempt takes the key, but its reply is lost; the caller
// undoes it with a release, which finds the key held and deletes it, and
// leaves the queue, which revokes the place's lease. The revoke may reach
// the store after the release and after the backend's next acquire: that
// acquire must not be on the revoked lease, or the revoke deletes its
// lock while its holder's deadline is seconds away (two holders).
func TestUnknownAttemptsLeaseIsNotReused(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	key, next := "k-"+newToken()[:8], "n-"+newToken()[:8]
	holder, cli := newBackend(t, srv.Addr)
	ht := newToken()
	if _, err := holder.Acquire(ctx, key, ht, 10*time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	px := faultproxy.Start(t, srv.Addr)
	wb, err := etcd.New(newClient(t, px.Addr), etcd.WithElectionTimeout(electionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wb.Close() })
	w := queueUp(ctx, t, wb, key)

	// The holder does not follow the key: its release deletes it, and the
	// waiter's watch wakes it.
	if err := holder.Release(ctx, key, ht); err != nil {
		t.Fatalf("Release: %v", err)
	}
	w.woken(t, "the waiter")

	// The waiter's attempt is applied; its reply is held until the
	// attempt's context has ended: its outcome is unknown to the caller.
	px.Hold(faultproxy.ToClient)
	tok := newToken()
	actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = w.q.Acquire(actx, tok, 10*time.Second)
	cancel()
	if err == nil || errors.Is(err, backend.ErrLocked) {
		px.Deliver(faultproxy.ToClient)
		t.Fatalf("the waiter's attempt with its reply held: %v; want an error of unknown outcome", err)
	}
	var lease int64
	for deadline := time.Now().Add(5 * time.Second); ; {
		resp, err := cli.Get(ctx, etcd.DefaultPrefix+"k/"+key+"\xff")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == tok {
			lease = resp.Kvs[0].Lease
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter's attempt was not applied within 5s of its send (key: %v)", resp.Kvs)
		}
		time.Sleep(10 * time.Millisecond) // poll the store
	}
	px.Deliver(faultproxy.ToClient)

	// The undo: package lock's release of the attempt's token, which finds
	// the key held by it.
	if err := wb.Release(ctx, key, tok); err != nil {
		t.Fatalf("the release that undoes the attempt: %v", err)
	}
	// The backend's next acquire, with the same TTL.
	nt := newToken()
	if _, err := wb.Acquire(ctx, next, nt, 10*time.Second); err != nil {
		t.Fatalf("Acquire of another key: %v", err)
	}
	resp, err := cli.Get(ctx, etcd.DefaultPrefix+"k/"+next+"\xff")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("reading the next lock: %v %v", resp, err)
	}
	if got := resp.Kvs[0].Lease; got == lease {
		t.Errorf("the next lock is on lease %x, which the attempt of unknown outcome used and the waiter's leave revokes", got)
	}
	// The place's leave: its revoke lands only now.
	w.q.Close(false)
	h, err := holder.Inspect(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Held || h.Token != nt {
		t.Fatalf("the next lock is gone right after the waiter's leave (holder %+v), though its holder's deadline is about 10s away", h)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(lease)); err == nil {
		// Revoked again by hand: it must still hold nothing of the next lock.
		if h, err := holder.Inspect(ctx, next); err != nil || !h.Held {
			t.Fatalf("a revoke of the attempt's lease freed the next lock (holder %+v, %v)", h, err)
		}
	}
}
