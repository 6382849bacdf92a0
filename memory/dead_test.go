package memory

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
)

// deadTokens returns the number of tombstones the store keeps.
func (s *Store) deadTokens() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.dead)
		sh.mu.Unlock()
	}
	return n
}

// With KeepDeadTokens, a released token is dead whatever order requests
// arrive in, for the time given, and its tombstone is swept afterwards.
func TestDeadTokens(t *testing.T) {
	ctx := context.Background()
	fc := clock.NewFake(time.Unix(0, 0))
	s := NewStore(WithStoreClock(fc))
	s.KeepDeadTokens(DeadTokenTTL)
	s.KeepDeadTokens(time.Second) // ignored: d only grows
	c := s.NewBackend()
	const ttl = time.Minute

	// A release sent again answers as the first did; an acquire or a
	// transfer with the released token is refused.
	if _, err := c.Acquire(ctx, "k", "a", ttl); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, "k", "a"); err != nil {
		t.Errorf("release sent again: %v; want nil", err)
	}
	if _, err := c.Acquire(ctx, "k", "a", ttl); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("acquire with a released token: %v; want ErrInvalid", err)
	}

	// A release that overtakes its acquire kills the token: the acquire,
	// arriving late, takes nothing.
	if err := c.Release(ctx, "k", "b"); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("release before the acquire: %v; want ErrNotHeld", err)
	}
	if err := c.Release(ctx, "k", "b"); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("that release sent again: %v; want ErrNotHeld, as the first", err)
	}
	if _, err := c.Acquire(ctx, "k", "b", ttl); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("acquire arriving after its undo: %v; want ErrInvalid", err)
	}
	if h, _ := c.Inspect(ctx, "k"); h.Held {
		t.Fatalf("the key is held after a late acquire: %+v", h)
	}

	// A transfer that arrives after the release of its target is refused.
	if _, err := c.Acquire(ctx, "k", "c", ttl); err != nil {
		t.Fatal(err)
	}
	c.Release(ctx, "k", "d")
	if _, err := c.Transfer(ctx, "k", "c", "d", ttl, backend.TransferOptions{}); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("transfer to a released token: %v; want ErrInvalid", err)
	}
	if h, _ := c.Inspect(ctx, "k"); h.Token != "c" {
		t.Errorf("after a refused transfer: %+v; want still held by c", h)
	}
	c.Release(ctx, "k", "c")

	// Tombstones go once they expire, as releases come.
	for i := range 1000 {
		c.Release(ctx, fmt.Sprintf("k%d", i), "t")
	}
	if n := s.deadTokens(); n < 1000 {
		t.Fatalf("%d tombstones after 1000 releases; want at least 1000", n)
	}
	fc.Advance(DeadTokenTTL)
	for i := range 1000 {
		c.Release(ctx, fmt.Sprintf("k%d", i), "u")
	}
	if n := s.deadTokens(); n != 1000 {
		t.Errorf("%d tombstones %v after 1000 releases, and 1000 more now; want 1000", n, DeadTokenTTL)
	}
	if _, err := c.Acquire(ctx, "k", "a", ttl); err != nil {
		t.Errorf("acquire with a token released %v ago: %v; want its tombstone gone", DeadTokenTTL, err)
	}
}

// Without KeepDeadTokens the store remembers the last release of each key:
// a release sent again succeeds, and keeps no tombstones.
func TestReleasedInProcess(t *testing.T) {
	ctx := context.Background()
	s := NewStore()
	c := s.NewBackend()
	if _, err := c.Acquire(ctx, "k", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, "k", "a"); err != nil {
		t.Errorf("release sent again: %v; want nil", err)
	}
	if err := c.Release(ctx, "k", "b"); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("release by a token that never held the key: %v; want ErrNotHeld", err)
	}
	if n := s.deadTokens(); n != 0 {
		t.Errorf("%d tombstones in a store without KeepDeadTokens; want 0", n)
	}
}
