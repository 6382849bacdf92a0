package memory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
)

// A store's clients have a maximum TTL, DefaultMaxTTL unless WithMaxTTL
// says otherwise. Package lock refuses a longer TTL before it calls the
// client; the client refuses one itself (Acquire, Renew, Transfer); a
// maximum out of range makes every such call fail, saying why, since
// NewStore cannot. None of them takes a lock.
func TestMaxTTL(t *testing.T) {
	ctx := context.Background()
	if memory.DefaultMaxTTL != lock.DefaultMaxTTL {
		t.Fatalf("memory.DefaultMaxTTL %v; want lock.DefaultMaxTTL, %v", memory.DefaultMaxTTL, lock.DefaultMaxTTL)
	}
	store := memory.NewStore()
	c := store.NewBackend()
	if got := c.Capabilities().MaxTTL; got != memory.DefaultMaxTTL {
		t.Fatalf("Capabilities().MaxTTL %v; want the default, %v", got, memory.DefaultMaxTTL)
	}
	locks, err := lock.New(store.NewBackend())
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	if _, err := locks.TryAcquire(ctx, "k", lock.WithTTL(time.Hour)); !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") {
		t.Fatalf("TryAcquire with a TTL of 1h: %v; want ErrInvalidTTL naming the maximum 1m0s", err)
	}
	tooLong := memory.DefaultMaxTTL + time.Nanosecond
	want := "above this client's maximum of 1m0s"
	if _, err := c.Acquire(ctx, "k", "t1", tooLong); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("Acquire with a TTL of %v: %v; want ErrInvalid saying %q", tooLong, err, want)
	}
	if _, err := c.Acquire(ctx, "k", "t2", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Renew(ctx, "k", "t2", tooLong); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("Renew with a TTL of %v: %v; want ErrInvalid saying %q", tooLong, err, want)
	}
	if _, err := c.Transfer(ctx, "k", "t2", "t3", tooLong, backend.TransferOptions{}); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("Transfer with a TTL of %v: %v; want ErrInvalid saying %q", tooLong, err, want)
	}
	if h, err := c.Inspect(ctx, "k"); err != nil || !h.Held || h.Token != "t2" || h.Remaining > time.Second {
		t.Errorf("after the refused calls: %+v, %v; want t2's lock of 1s, as it was", h, err)
	}
	c.Release(ctx, "k", "t2")

	raised := memory.NewStore(memory.WithMaxTTL(time.Hour))
	rlocks, err := lock.New(raised.NewBackend(), lock.WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer rlocks.Close()
	if l, err := rlocks.TryAcquire(ctx, "k"); err != nil {
		t.Errorf("TryAcquire with a TTL of 1h under WithMaxTTL(1h): %v", err)
	} else {
		l.Release(ctx)
	}

	for _, d := range []time.Duration{0, -time.Second, lock.MaxTTL + time.Second} {
		bad := memory.NewStore(memory.WithMaxTTL(d))
		want := fmt.Sprintf("maximum TTL %v (WithMaxTTL, URL parameter maxttl) must be at least 1ms and at most 8760h0m0s", d)
		if _, err := bad.NewBackend().Acquire(ctx, "k", "t", time.Second); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Acquire on a store with WithMaxTTL(%v): %v; want ErrInvalid saying %q", d, err, want)
		}
		if n := bad.Len(); n != 0 {
			t.Errorf("a store with WithMaxTTL(%v) holds %d locks; want none", d, n)
		}
	}
}

// mem:// takes maxttl, the opened client's maximum; clients of one named
// store may have different ones. A TTL from the URL is checked against it.
func TestMaxTTLURL(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		url  string
		want time.Duration
	}{
		{"mem://", memory.DefaultMaxTTL},
		{"mem://?maxttl=2m&ttl=90s", 2 * time.Minute},
		{"mem://maxttl-url?maxttl=1ms&ttl=1ms&drift=0s", time.Millisecond},
		{"mem://maxttl-url", memory.DefaultMaxTTL},
		{"mem://maxttl-url?maxttl=8760h", lock.MaxTTL},
	} {
		c, err := lock.Open(ctx, tc.url)
		if err != nil {
			t.Errorf("Open(%q): %v", tc.url, err)
			continue
		}
		defer c.Close()
		if got := c.Capabilities().MaxTTL; got != tc.want {
			t.Errorf("Open(%q): maximum TTL %v; want %v", tc.url, got, tc.want)
		}
	}
	for _, tc := range []struct{ url, want string }{
		{"mem://?maxttl=0s", `mem: maxttl="0s": want a Go duration of at least 1ms and at most 8760h0m0s (lock.MaxTTL), such as 1m`},
		{"mem://x?maxttl=8761h", `maxttl="8761h": want a Go duration of at least 1ms`},
		{"mem://?maxttl=never", `maxttl="never"`},
		{"mem://?colour=red", `unknown query parameter "colour" for scheme mem; valid: autorenew, drift, maxhold, maxttl, ttl`},
	} {
		if c, err := lock.Open(ctx, tc.url); err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", tc.url)
		} else if !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want ErrInvalid saying %q", tc.url, err, tc.want)
		}
	}
	if c, err := lock.Open(ctx, "mem://?ttl=90s"); err == nil {
		c.Close()
		t.Errorf("Open with ttl=90s and the default maximum succeeded")
	} else if !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") {
		t.Errorf("Open with ttl=90s: %v; want ErrInvalidTTL naming the maximum", err)
	}
}
