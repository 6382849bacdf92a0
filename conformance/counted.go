package conformance

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
)

// counted counts the calls that reach the store.
type counted struct {
	backend.Backend
	caps  backend.Capabilities
	calls atomic.Int64
}

func (c *counted) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	c.calls.Add(1)
	return c.Backend.Acquire(ctx, key, token, ttl)
}

func (c *counted) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	c.calls.Add(1)
	return c.Backend.Renew(ctx, key, token, ttl)
}

func (c *counted) Release(ctx context.Context, key, token string) error {
	c.calls.Add(1)
	return c.Backend.Release(ctx, key, token)
}

func (c *counted) Capabilities() backend.Capabilities { return c.caps }

func (s *suite) counted(t *testing.T) *counted {
	return &counted{Backend: s.backend(t), caps: s.caps}
}
