package consul_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/consul"
	"github.com/distlock/lock/internal/consultest"
)

// The backend has a maximum TTL, DefaultMaxTTL unless WithMaxTTL or the
// URL's maxttl says otherwise, from the minimum TTL to Consul's longest
// session TTL (New and Open refuse others). Nothing here reaches an agent.
func TestMaxTTLOptions(t *testing.T) {
	if consul.DefaultMaxTTL != lock.DefaultMaxTTL {
		t.Fatalf("consul.DefaultMaxTTL %v; want lock.DefaultMaxTTL, %v", consul.DefaultMaxTTL, lock.DefaultMaxTTL)
	}
	cli, _ := client(t, "127.0.0.1:1")
	for _, tc := range []struct {
		opts []consul.Option
		want time.Duration
	}{
		{nil, consul.DefaultMaxTTL},
		{[]consul.Option{consul.WithMaxTTL(time.Hour)}, time.Hour},
		{[]consul.Option{consul.WithMaxTTL(consul.MaxTTL)}, consul.MaxTTL},
		{[]consul.Option{consul.WithMinTTL(time.Second), consul.WithMaxTTL(time.Second)}, time.Second},
		{[]consul.Option{consul.WithMinTTL(2 * time.Minute), consul.WithMaxTTL(2 * time.Minute)}, 2 * time.Minute},
	} {
		b, err := consul.New(cli, tc.opts...)
		if err != nil {
			t.Errorf("New (maximum %v): %v", tc.want, err)
			continue
		}
		if got := b.Capabilities().MaxTTL; got != tc.want {
			t.Errorf("Capabilities().MaxTTL %v; want %v", got, tc.want)
		}
		b.Close()
	}
	for _, tc := range []struct {
		opts []consul.Option
		want string
	}{
		{[]consul.Option{consul.WithMaxTTL(5 * time.Second)}, "maximum TTL 5s (WithMaxTTL); want from the minimum TTL 10s (WithMinTTL, the servers' session_ttl_min) to 24h0m0s"},
		{[]consul.Option{consul.WithMaxTTL(0)}, "maximum TTL 0s (WithMaxTTL)"},
		{[]consul.Option{consul.WithMaxTTL(25 * time.Hour)}, "maximum TTL 25h0m0s (WithMaxTTL); want from the minimum TTL 10s"},
		// A minimum above the default maximum needs the maximum raised.
		{[]consul.Option{consul.WithMinTTL(2 * time.Minute)}, "maximum TTL 1m0s (WithMaxTTL); want from the minimum TTL 2m0s"},
	} {
		if b, err := consul.New(cli, tc.opts...); err == nil {
			b.Close()
			t.Errorf("New succeeded; want %q", tc.want)
		} else if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New: %v; want ErrInvalid saying %q", err, tc.want)
		}
	}

	ctx := context.Background()
	for _, tc := range []struct {
		url  string
		want time.Duration
	}{
		{"consul://127.0.0.1:8500", consul.DefaultMaxTTL},
		{"consul://127.0.0.1:8500?maxttl=2m&ttl=90s", 2 * time.Minute},
		{"consul://127.0.0.1:8500?minttl=1s&maxttl=1s&ttl=1s", time.Second},
		{"consul://127.0.0.1:8500?maxttl=24h", consul.MaxTTL},
	} {
		c, err := lock.Open(ctx, tc.url)
		if err != nil {
			t.Errorf("Open(%q): %v", tc.url, err)
			continue
		}
		if got := c.Capabilities().MaxTTL; got != tc.want {
			t.Errorf("Open(%q): maximum TTL %v; want %v", tc.url, got, tc.want)
		}
		c.Close()
	}
	for _, tc := range []struct{ url, want string }{
		{"consul://127.0.0.1:8500?maxttl=5s", `maxttl="5s": want a Go duration of at least 10s (minttl) and at most 24h0m0s (Consul's longest session TTL), such as 1m`},
		{"consul://127.0.0.1:8500?minttl=1s&maxttl=500ms", `maxttl="500ms": want a Go duration of at least 1s (minttl)`},
		{"consul://127.0.0.1:8500?maxttl=25h", `maxttl="25h": want a Go duration of at least 10s (minttl) and at most 24h0m0s`},
		{"consul://127.0.0.1:8500?maxttl=later", `maxttl="later"`},
		{"consul://127.0.0.1:8500?minttl=2m", "maximum TTL 1m0s (WithMaxTTL); want from the minimum TTL 2m0s"},
	} {
		if c, err := lock.Open(ctx, tc.url); err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", tc.url)
		} else if !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want ErrInvalid saying %q", tc.url, err, tc.want)
		}
	}
	if c, err := lock.Open(ctx, "consul://127.0.0.1:8500?ttl=2m"); err == nil {
		c.Close()
		t.Errorf("Open with ttl=2m and the default maximum succeeded")
	} else if !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") {
		t.Errorf("Open with ttl=2m: %v; want ErrInvalidTTL naming the maximum", err)
	}
}

// Package lock refuses a TTL above the maximum before it sends anything;
// the backend refuses one itself (Acquire, Renew, a place's Acquire),
// writing nothing; a raised maximum lets it through.
func TestMaxTTL(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	b, cli := newBackend(t, agent.Addr)
	locks, err := lock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	if _, err := locks.TryAcquire(ctx, "k", lock.WithTTL(time.Hour)); !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") {
		t.Fatalf("TryAcquire with a TTL of 1h: %v; want ErrInvalidTTL naming the maximum 1m0s", err)
	}
	tooLong := consul.DefaultMaxTTL + time.Second
	want := "this backend takes 1s (the servers' session_ttl_min; see WithMinTTL) to 1m0s (its maximum: WithMaxTTL, URL parameter maxttl)"
	if _, err := b.Acquire(ctx, "k", strings.Repeat("a", 32), tooLong); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("Acquire with a TTL of %v: %v; want ErrInvalid saying %q", tooLong, err, want)
	}
	if _, err := b.Renew(ctx, "k", strings.Repeat("a", 32), tooLong); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("Renew with a TTL of %v: %v; want ErrInvalid saying %q", tooLong, err, want)
	}
	q, err := b.Queue("k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Acquire(ctx, strings.Repeat("b", 32), tooLong); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("a place's Acquire with a TTL of %v: %v; want ErrInvalid saying %q", tooLong, err, want)
	}
	q.Close(false)
	if kvs, _, err := cli.KV().List("", nil); err != nil || len(kvs) != 0 {
		t.Fatalf("the store holds %d entries (%v); want none", len(kvs), err)
	}
	if ss, _, err := cli.Session().List(nil); err != nil || len(ss) != 0 {
		t.Fatalf("the store holds %d sessions (%v); want none", len(ss), err)
	}

	raised, _ := newBackend(t, agent.Addr, consul.WithMaxTTL(2*time.Minute))
	rlocks, err := lock.New(raised, lock.WithTTL(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer rlocks.Close()
	l, err := rlocks.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("TryAcquire with a TTL of 2m under WithMaxTTL(2m): %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
