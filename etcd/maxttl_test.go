package etcd_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/etcd"
)

// The backend has a maximum TTL, DefaultMaxTTL unless WithMaxTTL or the
// URL's maxttl says otherwise. Package lock refuses a longer TTL before it
// sends anything; the backend refuses one itself (Acquire, a place's
// Acquire); New refuses a maximum out of range. None of them writes
// anything.
func TestMaxTTL(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	cli := newClient(t, srv.Addr)
	b, err := etcd.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if etcd.DefaultMaxTTL != lock.DefaultMaxTTL {
		t.Fatalf("etcd.DefaultMaxTTL %v; want lock.DefaultMaxTTL, %v", etcd.DefaultMaxTTL, lock.DefaultMaxTTL)
	}
	if got := b.Capabilities().MaxTTL; got != etcd.DefaultMaxTTL {
		t.Fatalf("Capabilities().MaxTTL %v; want the default, %v", got, etcd.DefaultMaxTTL)
	}
	other, err := etcd.New(newClient(t, srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	locks, err := lock.New(other)
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	if _, err := locks.TryAcquire(ctx, "k", lock.WithTTL(time.Hour)); !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") {
		t.Fatalf("TryAcquire with a TTL of 1h: %v; want ErrInvalidTTL naming the maximum 1m0s", err)
	}
	tooLong := etcd.DefaultMaxTTL + time.Second
	if _, err := b.Acquire(ctx, "k", newToken(), tooLong); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") {
		t.Errorf("Acquire with a TTL of %v: %v; want ErrInvalid naming the maximum", tooLong, err)
	}
	q, err := b.Queue("k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Acquire(ctx, newToken(), tooLong); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") {
		t.Errorf("a place's Acquire with a TTL of %v: %v; want ErrInvalid naming the maximum", tooLong, err)
	}
	q.Close(false)
	if resp, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("the store holds %v keys (%v); want none", resp.Count, err)
	}

	raised, err := etcd.New(newClient(t, srv.Addr), etcd.WithMaxTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	rlocks, err := lock.New(raised, lock.WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer rlocks.Close()
	l, err := rlocks.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("TryAcquire with a TTL of 1h under WithMaxTTL(1h): %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	for _, d := range []time.Duration{0, -time.Second, etcd.MinTTL - time.Millisecond, lock.MaxTTL + time.Second} {
		bad, err := etcd.New(cli, etcd.WithMaxTTL(d))
		if err == nil {
			bad.Close()
			t.Errorf("New with WithMaxTTL(%v) succeeded", d)
			continue
		}
		if want := "maximum TTL " + d.String() + " (WithMaxTTL) must be at least 1s and at most 8760h0m0s"; !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("New with WithMaxTTL(%v): %v; want ErrInvalid saying %q", d, err, want)
		}
	}
}

// maxttl in the URL sets the maximum; a TTL from the URL is checked
// against it.
func TestMaxTTLURL(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	u := "etcd://" + srv.Addr + "?maxttl=90s&ttl=90s"
	locks, err := lock.Open(ctx, u)
	if err != nil {
		t.Fatalf("Open(%q): %v", u, err)
	}
	defer locks.Close()
	if got := locks.Capabilities().MaxTTL; got != 90*time.Second {
		t.Errorf("Open(%q): maximum TTL %v; want 90s", u, got)
	}
	l, err := locks.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	l.Release(ctx)
	u = "etcd://" + srv.Addr + "?ttl=90s"
	if c, err := lock.Open(ctx, u); err == nil {
		c.Close()
		t.Errorf("Open(%q) succeeded; want the TTL refused above the default maximum", u)
	} else if !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") {
		t.Errorf("Open(%q): %v; want ErrInvalidTTL naming the maximum", u, err)
	}
}
