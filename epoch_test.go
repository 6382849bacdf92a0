package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/fence"
	"github.com/distlock/lock/memory"
)

// offsetFences reports the store's fences raised by add: a store whose
// counters are far ahead of another's.
type offsetFences struct {
	*memory.Backend
	add uint64
}

func (b offsetFences) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := b.Backend.Acquire(ctx, key, token, ttl)
	if err == nil {
		g.Fence += b.add
	}
	return g, err
}

// A fence epoch orders every fence of a later epoch above every fence of an
// earlier one, whatever the stores' own values: a lease of epoch 0 on a
// store whose fences are at 10^15 is refused by a fenced resource once a
// lease of epoch 1 on a store at 1 wrote, and within an epoch the store's
// order holds.
func TestFenceEpochOrdersStores(t *testing.T) {
	ctx := context.Background()
	old, err := lock.New(offsetFences{memory.NewStore().NewBackend(), 1_000_000_000_000_000}, lock.WithFenceEpoch(0))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	next, err := lock.New(memory.NewStore().NewBackend(), lock.WithFenceEpoch(1))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()

	var g fence.Guard
	write := func(c *lock.Client) (*lock.Lease, error) {
		l, err := c.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		return l, g.Do("k", l.Fence(), l.Token(), func() error { return nil })
	}
	a, err := write(old)
	if err != nil || a.Fence() != 1_000_000_000_000_001 {
		t.Fatalf("epoch 0: fence %d, write %v; want the store's fence 10^15+1, accepted", a.Fence(), err)
	}
	b, err := write(next)
	if err != nil || b.Fence() != 1<<lock.FenceEpochShift|1 {
		t.Fatalf("epoch 1: fence %d, write %v; want 1<<56 | 1, accepted above every fence of epoch 0", b.Fence(), err)
	}
	if b.StoreFence() != 1 {
		t.Errorf("StoreFence under epoch 1: %d; want the store's own fence, 1", b.StoreFence())
	}
	if _, err := write(old); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("epoch 0 after epoch 1: write %v; want fence.ErrStale", err)
	}
	if c, err := write(next); err != nil || c.Fence() <= b.Fence() {
		t.Fatalf("epoch 1 again: fence %d after %d, write %v; want a greater fence, accepted", c.Fence(), b.Fence(), err)
	}
}

// A store's fence of 2^56 or more does not fit under an epoch: the grant
// is refused as a broken contract and its lock released; without an epoch
// it is taken as it is.
func TestFenceEpochRefusesHugeFences(t *testing.T) {
	ctx := context.Background()
	store := memory.NewStore()
	c, err := lock.New(offsetFences{store.NewBackend(), 1 << lock.FenceEpochShift}, lock.WithFenceEpoch(0))
	if err != nil {
		t.Fatal(err)
	}
	if l, err := c.TryAcquire(ctx, "k"); l != nil || !errors.Is(err, lock.ErrBackendContract) {
		t.Fatalf("a fence of 2^56+1 under epoch 0: lease %v, %v; want ErrBackendContract", l, err)
	}
	c.Close() // waits for the release of the token
	if n := store.Len(); n != 0 {
		t.Fatalf("%d locks left after a refused grant", n)
	}
	plain, err := lock.New(offsetFences{store.NewBackend(), 1 << lock.FenceEpochShift})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	l, err := plain.TryAcquire(ctx, "k")
	if err != nil || l.Fence() <= 1<<lock.FenceEpochShift {
		t.Fatalf("without an epoch: %v; want the store's fence as it is", err)
	}
	l.Release(ctx)
}

// WithFenceEpoch takes 0 to MaxFenceEpoch, and only as a Client option.
func TestFenceEpochOption(t *testing.T) {
	if _, err := lock.New(memory.NewStore().NewBackend(), lock.WithFenceEpoch(lock.MaxFenceEpoch+1)); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("epoch %d: %v; want ErrInvalidOption", lock.MaxFenceEpoch+1, err)
	}
	if _, err := lock.New(memory.NewStore().NewBackend(), lock.WithFenceEpoch(1), lock.WithFenceEpoch(2)); !errors.Is(err, lock.ErrInvalidOption) || !strings.Contains(err.Error(), "one fence epoch") {
		t.Fatalf("two epochs: %v; want ErrInvalidOption saying a Client has one", err)
	}
	if c, err := lock.New(memory.NewStore().NewBackend(), lock.WithFenceEpoch(2), lock.WithFenceEpoch(2)); err != nil {
		t.Fatalf("one epoch given twice: %v; want it accepted", err)
	} else {
		c.Close()
	}
	c, err := lock.New(memory.NewStore().NewBackend(), lock.WithFenceEpoch(lock.MaxFenceEpoch))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.TryAcquire(ctx, "k", lock.WithFenceEpoch(3)); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("WithFenceEpoch given to TryAcquire: %v; want ErrInvalidOption", err)
	}
	l, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if f := l.Fence(); f>>lock.FenceEpochShift != lock.MaxFenceEpoch || f >= 1<<63 {
		t.Fatalf("fence %d under epoch %d: want the epoch in the top bits, below 2^63", f, lock.MaxFenceEpoch)
	}
}
