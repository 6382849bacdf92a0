package lock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
)

// breaksGrants takes the lock on the store, then reports a grant that its
// contract rules out: a deliberately broken backend.
type breaksGrants struct {
	backend.Backend
	report func(g backend.Grant, ttl time.Duration) backend.Grant
}

func (b breaksGrants) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := b.Backend.Acquire(ctx, key, token, ttl)
	if err != nil {
		return g, err
	}
	return b.report(g, ttl), nil
}

// A grant with fence 0, or with a TTL shorter than asked for, never
// becomes a lease: Acquire and TryAcquire return ErrBackendContract, naming
// the backend and the rule, and the token's lock is released.
func TestBrokenGrantIsNotALease(t *testing.T) {
	cases := []struct {
		name   string
		rule   string
		report func(backend.Grant, time.Duration) backend.Grant
	}{
		{"fence 0", "fence 0", func(backend.Grant, time.Duration) backend.Grant { return backend.Grant{} }},
		{"short TTL", "shorter than", func(g backend.Grant, ttl time.Duration) backend.Grant {
			return backend.Grant{Fence: g.Fence, TTL: ttl / 2}
		}},
	}
	for _, tc := range cases {
		for _, wait := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, wait %v", tc.name, wait), func(t *testing.T) {
				store := memory.NewStore()
				c, err := lock.New(breaksGrants{store.NewBackend(), tc.report})
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				var l *lock.Lease
				if wait {
					l, err = c.Acquire(ctx, "k")
				} else {
					l, err = c.TryAcquire(ctx, "k")
				}
				if l != nil || !errors.Is(err, lock.ErrBackendContract) {
					t.Fatalf("got lease %v, error %v; want no lease and ErrBackendContract", l, err)
				}
				if msg := err.Error(); !strings.Contains(msg, "breaksGrants") || !strings.Contains(msg, tc.rule) {
					t.Errorf("error %q names neither the backend nor the rule (%q)", msg, tc.rule)
				}
				c.Close() // waits for the release of the token
				if n := store.Len(); n != 0 {
					t.Fatalf("%d locks left on the store after a broken grant", n)
				}
			})
		}
	}
}

// A handover with fence 0 is not taken: the waiting Acquire returns
// ErrBackendContract, and the handed token is released.
func TestBrokenHandoverIsNotALease(t *testing.T) {
	c, q := queuingOnHeldKey(t, lock.WithTTL(2*time.Second))
	ctx := context.Background()
	got := make(chan error, 1)
	go func() {
		l, err := c.Acquire(ctx, "k")
		if l != nil {
			l.Release(ctx)
		}
		got <- err
	}()
	p := q.queuedPlace(t)
	tok := p.queued()[0]
	p.hand(tok, 0, time.Now())
	if err := <-got; !errors.Is(err, lock.ErrBackendContract) || !strings.Contains(err.Error(), "handover") {
		t.Fatalf("Acquire after a handover with fence 0: %v; want ErrBackendContract naming the handover", err)
	}
	until(t, "the handed token released", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return slices.Contains(q.released, tok)
	})
}
