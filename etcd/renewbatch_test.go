package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/etcd"
)

var _ backend.BatchRenewer = (*etcd.Backend)(nil)

// A batch gives each lock its own answer: the locks still held are renewed
// with their fences, a lock deleted from outside, one whose lease was
// revoked, a token that never held its key and a TTL longer than the
// lease carries are each refused as Renew refuses them, and none of them
// changes another's answer.
func TestRenewBatch(t *testing.T) {
	srv := startEtcd(t)
	b, cli := newBackend(t, srv.Addr)
	ctx := ctxFor(t)
	const ttl = 3 * time.Second
	keys := []string{"a", "b", "c", "deleted", "revoked", "long"}
	toks := map[string]string{}
	fences := map[string]uint64{}
	for _, k := range keys {
		toks[k] = newToken()
		g, err := b.Acquire(ctx, k, toks[k], ttl)
		if err != nil {
			t.Fatalf("Acquire %q: %v", k, err)
		}
		fences[k] = g.Fence
	}
	if _, err := cli.Delete(ctx, etcd.LockKey(b, "deleted")); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := cli.Revoke(ctx, leaseOf(ctx, t, cli, toks["revoked"])); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	var rs []backend.Renewal
	for _, k := range keys {
		d := ttl
		if k == "long" {
			d = 3 * ttl
		}
		rs = append(rs, backend.Renewal{Key: k, Token: toks[k], TTL: d})
	}
	rs = append(rs, backend.Renewal{Key: "b", Token: newToken(), TTL: ttl}) // never held b
	res := b.RenewBatch(ctx, rs)
	if len(res) != len(rs) {
		t.Fatalf("RenewBatch of %d renewals answered %d", len(rs), len(res))
	}
	for i, r := range res {
		what := fmt.Sprintf("renewal %d (%q)", i, rs[i].Key)
		switch {
		case i < 3:
			if r.Err != nil || r.Grant.Fence != fences[rs[i].Key] || r.Grant.TTL < ttl {
				t.Errorf("%s: %+v, %v; want renewed with fence %d and at least %v", what, r.Grant, r.Err, fences[rs[i].Key], ttl)
			}
		case rs[i].Key == "long":
			if !errors.Is(r.Err, backend.ErrInvalid) {
				t.Errorf("%s, for a TTL longer than the lease carries: %v; want ErrInvalid", what, r.Err)
			}
		default:
			if !errors.Is(r.Err, backend.ErrNotHeld) || r.Grant != (backend.Grant{}) {
				t.Errorf("%s: %+v, %v; want ErrNotHeld", what, r.Grant, r.Err)
			}
		}
	}
	for _, k := range keys[:3] {
		h, err := b.Inspect(ctx, k)
		if err != nil || h.Token != toks[k] {
			t.Errorf("Inspect %q after the batch: %+v, %v; want held by its token", k, h, err)
		}
	}
	b.Close()
	for _, r := range b.RenewBatch(ctx, rs[:2]) {
		if !errors.Is(r.Err, backend.ErrClosed) {
			t.Errorf("RenewBatch after Close: %v; want ErrClosed", r.Err)
		}
	}
}

// A batch reads its keys in transactions of at most 128 reads, not a Range
// each: 300 renewals are 300 keep-alives on the one stream and three
// read-only transactions.
func TestRenewBatchSharesReads(t *testing.T) {
	srv := startEtcd(t)
	var mu sync.Mutex
	calls := map[string]int{}
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		mu.Lock()
		calls[method]++
		mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	b, err := etcd.New(cli, etcd.WithElectionTimeout(electionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := ctxFor(t)
	const n, ttl = 300, 5 * time.Second
	rs := make([]backend.Renewal, n)
	for i := range rs {
		rs[i] = backend.Renewal{Key: fmt.Sprintf("k%d", i), Token: newToken(), TTL: ttl}
		if _, err := b.Acquire(ctx, rs[i].Key, rs[i].Token, ttl); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
	}
	mu.Lock()
	clear(calls)
	mu.Unlock()
	for i, r := range b.RenewBatch(ctx, rs) {
		if r.Err != nil {
			t.Fatalf("renewal %d: %v", i, r.Err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	txns, ranges := calls["/etcdserverpb.KV/Txn"], calls["/etcdserverpb.KV/Range"]
	if txns != 3 || ranges != 0 {
		t.Errorf("a batch of %d renewals sent %d transactions and %d Ranges (all calls: %v); want 3 and none", n, txns, ranges, calls)
	}
}

// A batch whose answers are lost gives every renewal an unknown outcome:
// neither a grant nor ErrNotHeld, whose lease is then not reused (its
// keep-alive may still arrive), and the locks are still held.
func TestRenewBatchLostAnswers(t *testing.T) {
	srv := startEtcd(t)
	px := faultproxy.Start(t, srv.Addr)
	b, err := etcd.New(newClient(t, px.Addr), etcd.WithElectionTimeout(electionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := ctxFor(t)
	const ttl = 3 * time.Second
	rs := make([]backend.Renewal, 5)
	for i := range rs {
		rs[i] = backend.Renewal{Key: fmt.Sprintf("k%d", i), Token: newToken(), TTL: ttl}
		if _, err := b.Acquire(ctx, rs[i].Key, rs[i].Token, ttl); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
	}
	px.Hold(faultproxy.ToClient)
	bctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	res := b.RenewBatch(bctx, rs)
	cancel()
	px.Deliver(faultproxy.ToClient)
	for i, r := range res {
		if r.Err == nil || errors.Is(r.Err, backend.ErrNotHeld) || r.Grant != (backend.Grant{}) {
			t.Errorf("renewal %d with its answer lost: %+v, %v; want an error of unknown outcome", i, r.Grant, r.Err)
		}
	}
	outside := newClient(t, srv.Addr)
	for _, r := range rs {
		if leaseOf(ctx, t, outside, r.Token) == clientv3.NoLease {
			t.Errorf("%q: the lock is gone after renewals of unknown outcome", r.Key)
		}
	}
}
