package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
	"github.com/distlock/lock/memory"
)

// slowContended answers every Acquire with ErrContended after moving the
// fake clock on by latency: a multi-node store whose every attempt is slow
// and gets no lock while nobody holds the key (a quorum later than the
// TTL, say).
type slowContended struct {
	backend.Backend
	clock    *clock.Fake
	latency  time.Duration
	attempts atomic.Int64
}

func (s *slowContended) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	s.attempts.Add(1)
	s.clock.Advance(s.latency)
	return backend.Grant{}, fmt.Errorf("slow quorum (simulated): %w", backend.ErrContended)
}

// TryAcquire spends about a TTL on attempts that meet ErrContended, not 64
// attempts whatever each takes: with attempts of 300ms and a TTL of 1s it
// gives up after the fourth, the first to end more than a TTL after the
// first was sent, with ErrContended. (It made 64, for 19s.)
func TestTryAcquireGivesUpOnContentionAfterATTL(t *testing.T) {
	const ttl, latency = time.Second, 300 * time.Millisecond
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	b := &slowContended{Backend: memory.New(memory.WithStoreClock(fc)), clock: fc, latency: latency}
	c, err := lock.New(b, lock.WithClock(fc), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(context.Background(), "k")
		done <- err
	}()
	// Between attempts TryAcquire waits a random delay of at most 8ms on
	// the fake clock: move the clock on whenever it waits.
	deadline := time.Now().Add(10 * time.Second)
wait:
	for {
		select {
		case err = <-done:
			break wait
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("TryAcquire did not return after %d attempts", b.attempts.Load())
		}
		if fc.Pending() > 0 {
			fc.Advance(8 * time.Millisecond)
		} else {
			time.Sleep(100 * time.Microsecond) // poll for the next wait, as until does
		}
	}
	if !errors.Is(err, lock.ErrContended) {
		t.Fatalf("TryAcquire: %v; want ErrContended", err)
	}
	if n := b.attempts.Load(); n < 4 || n > 5 {
		t.Errorf("TryAcquire made %d attempts of %v each; want 4 or 5: about a TTL (%v) of them", n, latency, ttl)
	}
	if !strings.Contains(err.Error(), "longer than the 1s TTL") {
		t.Errorf("TryAcquire's error %q does not say that it gave up after a TTL", err)
	}
}
