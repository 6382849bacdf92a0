package conformance

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock"
)

func (s *suite) badInput(t *testing.T) {
	ctx := s.ctx(t)
	cb := s.counted(t)
	c := s.clientOver(t, cb)
	key := s.key(t)
	var nilCtx context.Context
	try := func(opts ...lock.Option) func() error {
		return func() error { _, err := c.TryAcquire(ctx, key, opts...); return err }
	}
	tryKey := func(k string) func() error {
		return func() error { _, err := c.Acquire(ctx, k); return err }
	}
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"empty key", tryKey(""), lock.ErrInvalidKey},
		{"key over the limit", tryKey(strings.Repeat("k", lock.MaxKeyLen+1)), lock.ErrInvalidKey},
		{"key not UTF-8", tryKey("bad\xff\xfekey"), lock.ErrInvalidKey},
		{"zero TTL", try(lock.WithTTL(0)), lock.ErrInvalidTTL},
		{"negative TTL", try(lock.WithTTL(-time.Second)), lock.ErrInvalidTTL},
		{"TTL not above the drift", try(lock.WithTTL(s.short), lock.WithDrift(s.short)), lock.ErrInvalidTTL},
		{"negative drift", try(lock.WithDrift(-time.Millisecond)), lock.ErrInvalidOption},
		{"bad backoff", try(lock.WithBackoff(0, time.Second)), lock.ErrInvalidOption},
		{"backoff max below min", try(lock.WithBackoff(time.Second, time.Millisecond)), lock.ErrInvalidOption},
		{"nil clock", try(lock.WithClock(nil)), lock.ErrInvalidOption},
		{"negative max hold", try(lock.WithMaxHold(-time.Second)), lock.ErrInvalidOption},
		{"max hold below the TTL", try(lock.WithTTL(s.short), lock.WithMaxHold(s.short/2)), lock.ErrInvalidOption},
		{"nil context", func() error { _, err := c.TryAcquire(nilCtx, key); return err }, lock.ErrInvalid},
		{"nil context, waiting", func() error { _, err := c.Acquire(nilCtx, key); return err }, lock.ErrInvalid},
		{"nil function", func() error { return c.Do(ctx, key, nil) }, lock.ErrInvalid},
		{"Do with empty key", func() error {
			return c.Do(ctx, "", func(context.Context, *lock.Lease) error { return nil })
		}, lock.ErrInvalidKey},
		{"nil backend", func() error { _, err := lock.New(nil); return err }, lock.ErrInvalid},
		{"New with a bad TTL", func() error { _, err := lock.New(cb, lock.WithTTL(-1)); return err }, lock.ErrInvalidTTL},
	}
	if m := s.caps.MinTTL; m > time.Millisecond {
		cases = append(cases, struct {
			name string
			call func() error
			want error
		}{"TTL below the backend minimum", try(lock.WithTTL(m-time.Millisecond), lock.WithDrift(0)), lock.ErrInvalidTTL})
	}
	for _, tc := range cases {
		err := tc.call()
		switch {
		case err == nil:
			t.Errorf("%s: no error; want %v", tc.name, tc.want)
		case !errors.Is(err, tc.want):
			t.Errorf("%s: error %q does not match %v", tc.name, err, tc.want)
		case !strings.HasPrefix(err.Error(), "lock: "):
			t.Errorf("%s: error %q lacks the lock: prefix", tc.name, err)
		}
	}
	if n := cb.calls.Load(); n != 0 {
		t.Errorf("bad input sent %d requests to the store; want none", n)
	}

	// The key is untouched.
	l, err := c.TryAcquire(ctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("TryAcquire of the key after bad input: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	if err := l.Renew(ctx); !errors.Is(err, lock.ErrReleased) {
		t.Errorf("Renew after Release: %v; want ErrReleased", err)
	}
	if err := l.Release(nilCtx); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("Release(nil context): %v; want ErrInvalid", err)
	}

	// A closed client refuses everything without touching the store.
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	before := cb.calls.Load()
	if _, err := c.TryAcquire(ctx, key); !errors.Is(err, lock.ErrClosed) {
		t.Errorf("TryAcquire on a closed client: %v; want ErrClosed", err)
	}
	if _, err := c.Acquire(ctx, key); !errors.Is(err, lock.ErrClosed) {
		t.Errorf("Acquire on a closed client: %v; want ErrClosed", err)
	}
	if err := c.Do(ctx, key, func(context.Context, *lock.Lease) error { return nil }); !errors.Is(err, lock.ErrClosed) {
		t.Errorf("Do on a closed client: %v; want ErrClosed", err)
	}
	if n := cb.calls.Load() - before; n != 0 {
		t.Errorf("a closed client sent %d requests; want none", n)
	}
	var nilClient *lock.Client
	if _, err := nilClient.TryAcquire(ctx, key); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("TryAcquire on a nil *Client: %v; want ErrInvalid", err)
	}
}
