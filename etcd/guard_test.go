package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock"
	"github.com/distlock/lock/etcd"
)

// TxnIfHeld writes only while the lease holds its lock in etcd: a holder
// whose lock is gone (deleted from outside, as an expiry during a pause
// would) is refused, before and after a successor took the key, while its
// own client still counts the lease as valid.
func TestTxnIfHeld(t *testing.T) {
	srv := startEtcd(t)
	b, cli := newBackend(t, srv.Addr)
	other, _ := newBackend(t, srv.Addr)
	locks, err := lock.New(b, lock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	others, err := lock.New(other, lock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer others.Close()
	ctx := ctxFor(t)
	value := func() string {
		resp, err := cli.Get(ctx, "data/job")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}

	l, err := locks.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TxnIfHeld(ctx, l, clientv3.OpPut("data/job", "1")); err != nil {
		t.Fatalf("TxnIfHeld while held: %v", err)
	}
	if v := value(); v != "1" {
		t.Fatalf("data holds %q; want 1", v)
	}

	// The lock key vanishes (what an expiry during a long pause does);
	// the client still counts the lease as valid.
	if resp, err := cli.Delete(ctx, etcd.DefaultPrefix+"k/job\xff"); err != nil || resp.Deleted != 1 {
		t.Fatalf("deleting the lock key from outside: %v, %v: the case tests nothing", resp, err)
	}
	if l.Err() != nil {
		t.Fatalf("the lease ended already (%v): the case tests nothing", l.Err())
	}
	if _, err := b.TxnIfHeld(ctx, l, clientv3.OpPut("data/job", "stale-1")); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("TxnIfHeld after the lock vanished: %v; want ErrNotHeld", err)
	}
	succ, err := others.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatalf("the successor's TryAcquire: %v", err)
	}
	if _, err := b.TxnIfHeld(ctx, l, clientv3.OpPut("data/job", "stale-2")); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("TxnIfHeld of the old holder while a successor holds the key: %v; want ErrNotHeld", err)
	}
	if _, err := other.TxnIfHeld(ctx, succ, clientv3.OpPut("data/job", "2")); err != nil {
		t.Fatalf("the successor's TxnIfHeld: %v", err)
	}
	if v := value(); v != "2" {
		t.Fatalf("data holds %q; want 2 (the successor's write only)", v)
	}
	succ.Release(ctx)
	if _, err := other.TxnIfHeld(ctx, succ, clientv3.OpPut("data/job", "3")); !errors.Is(err, lock.ErrReleased) {
		t.Fatalf("TxnIfHeld with a released lease: %v; want ErrReleased", err)
	}

	l.Release(ctx) // lost: its client's turn for the key passes
	l2, err := locks.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(context.Background())
	for name, err := range map[string]error{
		"nil lease":     func() error { _, err := b.TxnIfHeld(ctx, nil, clientv3.OpPut("data/job", "x")); return err }(),
		"no operations": func() error { _, err := b.TxnIfHeld(ctx, l2); return err }(),
		"backend's keys": func() error {
			_, err := b.TxnIfHeld(ctx, l2, clientv3.OpDelete(etcd.DefaultPrefix+"k/job\xff"))
			return err
		}(),
	} {
		if !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", name, err)
		}
	}
	if v := value(); v != "2" {
		t.Fatalf("data holds %q after bad input; want 2", v)
	}
}
