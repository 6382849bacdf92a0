package memory

import (
	"context"
	"errors"
	"testing"

	"github.com/distlock/lock"
)

// namedAlive reports whether the store of mem://name is alive.
func namedAlive(name string) bool {
	namedMu.Lock()
	defer namedMu.Unlock()
	_, ok := named[name]
	return ok
}

// TestNamedStoreFreedWithItsLastClient: mem://NAME is one store for every
// client opened from it while any is open; a client closed twice counts
// once; once the last is closed the store is freed, and the next Open
// starts a fresh one.
func TestNamedStoreFreedWithItsLastClient(t *testing.T) {
	ctx := context.Background()
	const url = "mem://named-store-freed"
	open := func() *lock.Client {
		c, err := lock.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := open(), open()
	l, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("a second client of %s: %v; want ErrLocked (one store)", url, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := l.Fence()
	a.Close()
	a.Close()
	if !namedAlive("named-store-freed") {
		t.Fatalf("the store was freed while a client of it is open (a Close counted twice?)")
	}
	l, err = b.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence() <= first {
		t.Fatalf("fence %d after %d on the same store", l.Fence(), first)
	}
	l.Release(ctx)
	b.Close()
	if namedAlive("named-store-freed") {
		t.Fatalf("the store outlived its last client")
	}
	c := open()
	defer c.Close()
	l, err = c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if l.Fence() != 1 {
		t.Fatalf("fence %d on a reopened name; want 1, a fresh store", l.Fence())
	}
}
