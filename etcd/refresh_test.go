package etcd_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/etcd"
)

// Keep-alives from many goroutines share one stream, and each gets the
// answer for its own lease: leases of different TTLs tell the answers apart.
func TestKeepAlivesShareOneStream(t *testing.T) {
	srv := startEtcd(t)
	b, cli := newBackend(t, srv.Addr)
	ctx := ctxFor(t)
	const leases = 24
	ids := make([]clientv3.LeaseID, leases)
	for i := range ids {
		resp, err := cli.Grant(ctx, int64(5+i))
		if err != nil {
			t.Fatalf("Grant: %v", err)
		}
		ids[i] = resp.ID
	}
	revoked, err := cli.Grant(ctx, 5)
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	if _, err := cli.Revoke(ctx, revoked.ID); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for r := range 20 {
				i := (g*7 + r) % leases
				ttl, err := etcd.KeepAlive(ctx, b, ids[i])
				if err != nil {
					t.Errorf("keep-alive of lease %d: %v", i, err)
					return
				}
				if ttl != int64(5+i) {
					t.Errorf("keep-alive of the %ds lease answered %ds: answers matched to the wrong requests", 5+i, ttl)
					return
				}
				if r%5 == 0 {
					if _, err := etcd.KeepAlive(ctx, b, revoked.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
						t.Errorf("keep-alive of a revoked lease: %v; want ErrLeaseNotFound", err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	// A broken stream fails what waits on it, and the next keep-alive
	// opens a new one.
	etcd.BreakKeepAliveStream(b)
	if ttl, err := etcd.KeepAlive(ctx, b, ids[0]); err != nil || ttl != 5 {
		t.Fatalf("keep-alive after the stream broke: %d, %v; want 5, nil", ttl, err)
	}
}

// The keep-alive that refreshes an idle lease goes beside the acquire's
// transaction. When its outcome is unknown (the stream broke after it went
// out) while the transaction took the key, the lock may sit on a lease that
// expires before the TTL: no grant is reported, and the lease is not
// reused. Were the grant reported regardless, this test fails.
func TestAcquireWithAKeepAliveOfUnknownOutcome(t *testing.T) {
	srv := startEtcd(t)
	b, cli := newBackend(t, srv.Addr)
	ctx := ctxFor(t)
	const ttl = 5 * time.Second
	idleLease(ctx, t, b, ttl)
	// Old enough to need a refresh before it carries a lock.
	etcd.AgeIdleLeases(b, etcd.UnrefreshedWindow)
	var once sync.Once
	etcd.AfterKeepAliveSent(b, func() { once.Do(func() { etcd.BreakKeepAliveStream(b) }) })
	tok := newToken()
	_, err := b.Acquire(ctx, "k", tok, ttl)
	if err == nil {
		t.Fatal("Acquire reported a grant although the refresh of its lease has an unknown outcome")
	}
	if errors.Is(err, backend.ErrLocked) || errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("Acquire: %v; want an error of unknown outcome", err)
	}
	idle := leaseOf(ctx, t, cli, tok)
	if idle == clientv3.NoLease {
		t.Fatal("the transaction did not take the key: the case tests nothing")
	}
	// The undo, as package lock sends it, frees the key and revokes the
	// lease rather than reuse it.
	if err := b.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if ttl, err := cli.TimeToLive(ctx, idle); err != nil || ttl.TTL > 0 {
		t.Fatalf("the lease of unknown expiry after the undo: TTL %v, %v; want revoked", ttl, err)
	}
	tok = newToken()
	if _, err := b.Acquire(ctx, "k", tok, ttl); err != nil {
		t.Fatalf("Acquire after the undo: %v", err)
	}
	if resp, err := cli.Get(ctx, "", clientv3.WithPrefix()); err == nil {
		for _, kv := range resp.Kvs {
			if string(kv.Value) == tok && clientv3.LeaseID(kv.Lease) == idle {
				t.Fatal("the lease of unknown expiry was reused")
			}
		}
	}
}

// An idle lease revoked from outside: the transaction (and the refresh,
// when the lease is old enough to need one) finds it gone, does nothing,
// and the acquire goes on with a new lease.
func TestAcquireWhenTheIdleLeaseIsGone(t *testing.T) {
	for _, c := range []struct {
		name string
		age  time.Duration
	}{{"refreshed recently", 0}, {"refreshed with the acquire", etcd.UnrefreshedWindow}} {
		t.Run(c.name, func(t *testing.T) { acquireWhenTheIdleLeaseIsGone(t, c.age) })
	}
}

func acquireWhenTheIdleLeaseIsGone(t *testing.T, age time.Duration) {
	srv := startEtcd(t)
	b, cli := newBackend(t, srv.Addr)
	ctx := ctxFor(t)
	const ttl = 5 * time.Second
	idleLease(ctx, t, b, ttl)
	etcd.AgeIdleLeases(b, age)
	var kas atomic.Int64
	etcd.AfterKeepAliveSent(b, func() { kas.Add(1) })
	ls, err := cli.Leases(ctx)
	if err != nil {
		t.Fatalf("Leases: %v", err)
	}
	for _, l := range ls.Leases {
		if _, err := cli.Revoke(ctx, l.ID); err != nil {
			t.Fatalf("Revoke: %v", err)
		}
	}
	sent := time.Now()
	tok := newToken()
	g, err := b.Acquire(ctx, "k", tok, ttl)
	if err != nil {
		t.Fatalf("Acquire with the idle lease gone: %v", err)
	}
	if g.TTL < ttl {
		t.Fatalf("granted TTL %v; want at least %v", g.TTL, ttl)
	}
	if want := int64(min(1, age/etcd.UnrefreshedWindow)); kas.Load() != want {
		t.Fatalf("%d keep-alives for the acquire; want %d: the case tests another path", kas.Load(), want)
	}
	id := leaseOf(ctx, t, cli, tok)
	if id == clientv3.NoLease {
		t.Fatal("the lock key is not on the store")
	}
	left, err := cli.TimeToLive(ctx, id)
	if err != nil {
		t.Fatalf("TimeToLive: %v", err)
	}
	// The store counts whole seconds, rounding down: the lease lives at
	// least TTL from the send, so at least TTL-1s minus the time since is
	// left.
	if min := ttl - time.Second - time.Since(sent); time.Duration(left.TTL)*time.Second < min {
		t.Fatalf("the new lease has %ds left; want at least %v", left.TTL, min)
	}
}

// idleLease acquires and releases key "k" on b, which leaves b an idle
// lease of ttl to reuse.
func idleLease(ctx context.Context, t *testing.T, b *etcd.Backend, ttl time.Duration) {
	t.Helper()
	tok := newToken()
	if _, err := b.Acquire(ctx, "k", tok, ttl); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := b.Release(ctx, "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
