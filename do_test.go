package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
)

// TryDo runs fn when the key is free and releases it after; when the key
// is held it returns ErrLocked at once without running fn; a nil function
// or a bad option is refused before anything is sent.
func TestTryDo(t *testing.T) {
	store := memory.NewStore()
	c := mustClient(t, store.NewBackend())
	ctx := context.Background()
	ran := false
	if err := c.TryDo(ctx, "job", func(ctx context.Context, l *lock.Lease) error {
		ran = l.Fence() != 0 && ctx.Err() == nil
		return nil
	}); err != nil || !ran {
		t.Fatalf("TryDo on a free key: %v, ran %v; want nil and fn run with a fence", err, ran)
	}
	if n := store.Len(); n != 0 {
		t.Fatalf("%d locks held after TryDo; want 0", n)
	}
	other := mustClient(t, store.NewBackend())
	held := mustTry(t, other, "job")
	defer held.Release(ctx)
	ran = false
	err := c.TryDo(ctx, "job", func(context.Context, *lock.Lease) error { ran = true; return nil })
	if !errors.Is(err, lock.ErrLocked) || ran {
		t.Errorf("TryDo on a held key: %v, ran %v; want ErrLocked and fn not run", err, ran)
	}
	if err := c.TryDo(ctx, "job2", nil); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("TryDo with a nil function: %v; want ErrInvalid", err)
	}
	if err := c.TryDo(ctx, "job2", func(context.Context, *lock.Lease) error { return nil }, lock.WithWait(-time.Second)); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("TryDo with WithWait(-1s): %v; want ErrInvalidOption", err)
	}
	if n := store.Len(); n != 1 {
		t.Errorf("%d locks held after the refused calls; want 1 (the other client's)", n)
	}
}

// TryDo, like Do, cancels the section's context at the loss of the lease
// and joins the loss to fn's error.
func TestTryDoCancelsOnLossAndReportsIt(t *testing.T) {
	mc := memory.New()
	c := mustClient(t, mc, lock.WithTTL(100*time.Millisecond))
	err := c.TryDo(context.Background(), "job", func(ctx context.Context, l *lock.Lease) error {
		mc.Disconnect() // renewals now vanish
		defer mc.Reconnect()
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), lock.ErrLost) {
			t.Errorf("context cause: %v; want ErrLost", context.Cause(ctx))
		}
		return ctx.Err()
	})
	if !errors.Is(err, lock.ErrLost) || !errors.Is(err, context.Canceled) {
		t.Errorf("TryDo: %v; want fn's error joined with ErrLost", err)
	}
}

// WithWait ends the wait for a held key, with ErrLocked and the deadline,
// and leaves the section that follows an acquire alone.
func TestWithWaitBoundsOnlyTheWait(t *testing.T) {
	store := memory.NewStore()
	c := mustClient(t, store.NewBackend())
	other := mustClient(t, store.NewBackend())
	ctx := context.Background()
	const wait = 20 * time.Millisecond
	held := mustTry(t, other, "k")
	if _, err := c.Acquire(ctx, "k", lock.WithWait(wait)); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("Acquire of a held key with WithWait: %v; want DeadlineExceeded and ErrLocked", err)
	}
	held.Release(ctx)
	err := c.Do(ctx, "k", func(ctx context.Context, l *lock.Lease) error {
		<-time.After(3 * wait) // waiting out the wait bound
		return ctx.Err()
	}, lock.WithWait(wait))
	if err != nil {
		t.Fatalf("Do whose section outlasts the wait bound: %v; want nil (the bound ends only the wait)", err)
	}
	if n := store.Len(); n != 0 {
		t.Errorf("%d locks held after Do; want 0", n)
	}
}

// Release of a lease already lost returns nil, and Err keeps the loss; a
// release that itself finds the lock gone returns ErrLost.
func TestReleaseAfterLoss(t *testing.T) {
	mc := memory.New()
	c := mustClient(t, mc, lock.WithTTL(50*time.Millisecond), lock.WithAutoRenew(false))
	ctx := context.Background()
	l := mustTry(t, c, "lost")
	<-l.Done() // waiting out the TTL
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release of a lease lost at its deadline: %v; want nil", err)
	}
	if !errors.Is(l.Err(), lock.ErrLost) {
		t.Errorf("Err after the release: %v; want ErrLost", l.Err())
	}

	store := memory.NewStore()
	c2 := mustClient(t, store.NewBackend(), lock.WithTTL(10*time.Second))
	l2 := mustTry(t, c2, "gone")
	// The store loses its locks (a restart without persistence) behind
	// the lease's back: nothing reported it.
	store.Restart(memory.LoseData)
	if err := l2.Release(ctx); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Release that finds the lock gone: %v; want ErrLost", err)
	}
}

// mustClient returns lock.New(b, opts...), closed when the test ends.
func mustClient(t *testing.T, b backend.Backend, opts ...lock.Option) *lock.Client {
	t.Helper()
	c, err := lock.New(b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// mustTry returns c's lease of key, taken with TryAcquire.
func mustTry(t *testing.T, c *lock.Client, key string) *lock.Lease {
	t.Helper()
	l, err := c.TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
