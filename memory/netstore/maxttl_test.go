package netstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
	"github.com/distlock/lock/memory/netstore"
)

// A Backend declares the server's maximum TTL (memory.DefaultMaxTTL
// unless WithMaxTTL says otherwise), so that package lock refuses a
// longer TTL before it sends anything; the server's store refuses one
// itself. New refuses a maximum out of range.
func TestMaxTTL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store := memory.NewStore()
	srv := serve(t, store)
	b := newBackend(t, srv.Addr().String())
	if got := b.Capabilities().MaxTTL; got != memory.DefaultMaxTTL {
		t.Fatalf("Capabilities().MaxTTL %v; want memory.DefaultMaxTTL, %v", got, memory.DefaultMaxTTL)
	}
	locks, err := lock.New(newBackend(t, srv.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	if _, err := locks.TryAcquire(ctx, "k", lock.WithTTL(time.Hour)); !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "above this backend's maximum of 1m0s") {
		t.Fatalf("TryAcquire with a TTL of 1h: %v; want ErrInvalidTTL naming the maximum 1m0s", err)
	}
	// A client that declares more than the server's store takes: the
	// server refuses.
	over := newBackend(t, srv.Addr().String(), netstore.WithMaxTTL(time.Hour))
	if got := over.Capabilities().MaxTTL; got != time.Hour {
		t.Fatalf("Capabilities().MaxTTL %v; want the declared 1h", got)
	}
	if _, err := over.Acquire(ctx, "k", token, 2*time.Minute); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "above this client's maximum of 1m0s") {
		t.Errorf("Acquire with a TTL of 2m: %v; want ErrInvalid from the server naming its maximum", err)
	}
	if n := store.Len(); n != 0 {
		t.Errorf("the store holds %d locks; want none", n)
	}
	for _, d := range []time.Duration{0, -time.Second, lock.MaxTTL + time.Second} {
		if b, err := netstore.New(srv.Addr().String(), netstore.WithMaxTTL(d)); err == nil {
			b.Close()
			t.Errorf("New with WithMaxTTL(%v) succeeded", d)
		} else if want := "maximum TTL " + d.String() + " (WithMaxTTL) must be at least 1ms and at most 8760h0m0s"; !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("New with WithMaxTTL(%v): %v; want ErrInvalid saying %q", d, err, want)
		}
	}
}
