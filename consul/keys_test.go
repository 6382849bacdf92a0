package consul_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock"
	"github.com/distlock/lock/consul"
	"github.com/distlock/lock/internal/consultest"
)

// The keys "." and "..", which Consul's HTTP router would resolve away in
// a URL path, are locks like any other in every call: a second client is
// refused, Inspect (lockctl status) from a third says who holds it, the
// holder renews and writes under the lock (TxnIfHeld), a waiter queues
// behind it and is handed the lock by its release, the new holder's watch
// sees its entry deleted from outside, and the key with the name "." is
// written as, "%2E", is another lock. Before the escape, Inspect said "."
// was free while it was held, and failed on ".." with a 400.
func TestDotKeys(t *testing.T) {
	agent := consultest.Start(t)
	outside, otr := client(t, agent.Addr)
	t.Cleanup(otr.CloseIdleConnections)
	for _, tc := range []struct{ name, key, twin string }{
		{"dot", ".", "%2E"},
		{"dotdot", "..", "%2E%2E"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ab, _ := newBackend(t, agent.Addr)
			a, err := lock.New(ab, lock.WithTTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { a.Close() })
			b := newClient(t, agent.Addr, nil, lock.WithTTL(10*time.Second))
			in, _ := newBackend(t, agent.Addr)
			t.Cleanup(func() { in.Close() })
			key, name := tc.key, ab.Entry(tc.key)

			l, err := a.TryAcquire(ctx, key)
			if err != nil {
				t.Fatalf("TryAcquire(%q): %v", key, err)
			}
			if h, err := in.Inspect(ctx, key); err != nil || !h.Held || h.Token != l.Token() || h.Fence != l.Fence() {
				t.Errorf("Inspect(%q) while held: %+v, %v; want held by %s at fence %d", key, h, err, l.Token(), l.Fence())
			}
			if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lock.ErrLocked) {
				t.Errorf("TryAcquire(%q) by a second client: %v; want ErrLocked", key, err)
			}
			if o, err := b.TryAcquire(ctx, tc.twin); err != nil {
				t.Errorf("TryAcquire(%q) while %q is held: %v; want a lock of its own", tc.twin, key, err)
			} else {
				o.Release(ctx)
			}
			if err := l.Renew(ctx); err != nil {
				t.Errorf("Renew(%q): %v", key, err)
			}
			guarded := "guarded/" + tc.name
			if _, err := ab.TxnIfHeld(ctx, l, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: guarded, Value: []byte(l.Token())}}}); err != nil {
				t.Errorf("TxnIfHeld under %q: %v", key, err)
			} else if kv, _, err := outside.KV().Get(guarded, nil); err != nil || kv == nil || string(kv.Value) != l.Token() {
				t.Errorf("the guarded write under %q: %+v, %v; want %s", key, kv, err, l.Token())
			}

			// A waiter queues; the release hands it the lock.
			waited := make(chan *lock.Lease, 1)
			go func() {
				w, err := b.Acquire(ctx, key)
				if err != nil {
					t.Errorf("Acquire(%q) behind the holder: %v", key, err)
				}
				waited <- w
			}()
			waitForRecord(ctx, t, outside, name+"/q/")
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release(%q): %v", key, err)
			}
			w := <-waited
			if w == nil {
				return
			}
			if w.Fence() <= l.Fence() {
				t.Errorf("the waiter's fence %d; want more than the holder's %d", w.Fence(), l.Fence())
			}
			if h, err := in.Inspect(ctx, key); err != nil || !h.Held || h.Token != w.Token() {
				t.Errorf("Inspect(%q) after the handover: %+v, %v; want held by the waiter's %s", key, h, err, w.Token())
			}

			// The new holder's watch sees its entry deleted from outside.
			ok, resp, _, err := outside.Txn().Txn(api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: name}}}, nil)
			if err != nil || !ok {
				t.Fatalf("delete %q from outside: %v, %+v", name, err, resp)
			}
			select {
			case <-w.Done():
				if !errors.Is(w.Err(), lock.ErrLost) {
					t.Errorf("the lease of %q after its entry was deleted: %v; want ErrLost", key, w.Err())
				}
			case <-time.After(5 * time.Second): // the TTL is 10s: only the watch can end it this early
				t.Errorf("the lease of %q is not lost 5s after its entry was deleted", key)
			}
			if h, err := in.Inspect(ctx, key); err != nil || h.Held {
				t.Errorf("Inspect(%q) after the delete: %+v, %v; want free", key, h, err)
			}
		})
	}
}

// waitForRecord returns when a key under prefix exists, following the
// prefix with blocking queries.
func waitForRecord(ctx context.Context, t *testing.T, cli *api.Client, prefix string) {
	t.Helper()
	var index uint64
	for {
		keys, meta, err := cli.KV().Keys(prefix, "", (&api.QueryOptions{WaitIndex: index, WaitTime: time.Second}).WithContext(ctx))
		switch {
		case ctx.Err() != nil:
			t.Fatalf("no queue record under %q: %v", prefix, ctx.Err())
		case err != nil:
			t.Fatalf("keys under %q: %v", prefix, err)
		case len(keys) > 0:
			return
		}
		index = meta.LastIndex
	}
}

// A prefix that Consul's HTTP API would not reach as it is, is refused:
// with it, Inspect said a held key was free (checked on the agent with
// "/lock/", "a//b/", "a/./b/", "a/../b/" and "x\x01/").
func TestPrefixesTheAPIWouldRewrite(t *testing.T) {
	cli, err := api.NewClient(api.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/lock/", "/", "a//b/", "a/./b/", "a/../b/", "./", "../x", "x\x01/", "x\xff/"} {
		if _, err := consul.New(cli, consul.WithPrefix(p)); !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), "prefix") {
			t.Errorf("New with the prefix %q: %v; want ErrInvalid naming the prefix", p, err)
		}
	}
	for _, p := range []string{"", "lock/", "lock", "app/locks/", "a.b/c..d/", ".x/", "ключ/", "a b/", "x/."} {
		b, err := consul.New(cli, consul.WithPrefix(p))
		if err != nil {
			t.Errorf("New with the prefix %q: %v", p, err)
			continue
		}
		b.Close()
	}
	if _, err := lock.Open(context.Background(), "consul://127.0.0.1:8500?prefix=%2Flock%2F"); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("Open with prefix=/lock/: %v; want ErrInvalid", err)
	}
}
