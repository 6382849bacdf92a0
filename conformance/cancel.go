package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
)

func (s *suite) cancelWhileWaiting(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	holder := s.client(t)
	l, err := holder.TryAcquire(ctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	waiter := s.client(t)
	const after = 100 * time.Millisecond
	prompt := after + time.Second

	cctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(after, cancel)
	defer timer.Stop()
	start := time.Now()
	_, err = waiter.Acquire(cctx, key)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire cancelled while waiting: %v; want an error wrapping context.Canceled", err)
	}
	if d := time.Since(start); d > prompt {
		t.Errorf("Acquire returned %v after its context was cancelled; want within %v", d-after, prompt-after)
	}

	dctx, dcancel := context.WithTimeout(ctx, after)
	defer dcancel()
	start = time.Now()
	_, err = waiter.Acquire(dctx, key)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire past its deadline: %v; want an error wrapping context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > prompt {
		t.Errorf("Acquire returned %v after its deadline; want within %v", d-after, prompt-after)
	}

	// The holder is untouched, and once it releases, the key is free at
	// once: the cancelled waiters left nothing behind.
	if err := l.Renew(ctx); err != nil {
		t.Errorf("holder Renew after the waiters gave up: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("holder Release: %v", err)
	}
	s.keyIsFree(ctx, t, key, "after the release", "nothing left behind by cancelled waiters")
}

// cancelWhileStoreHangs: the context ends while the acquire request is
// unanswered; Acquire returns the context's error promptly, and once the
// client is closed the key is free: an acquisition that did reach the store
// was undone.
func (s *suite) cancelWhileStoreHangs(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	bb := s.backend(t)
	b := s.clientOver(t, bb, lock.WithTTL(s.short))
	undo, _, ok := s.cutOff(t, bb)
	if !ok {
		t.Skip("the harness offers neither Disconnecter nor Pauser: the store cannot be made to hang")
	}
	const after = 200 * time.Millisecond
	dctx, cancel := context.WithTimeout(ctx, after)
	defer cancel()
	start := time.Now()
	_, err := b.Acquire(dctx, key)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire while the store hangs: %v; want an error wrapping context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > after+time.Second {
		t.Errorf("Acquire returned %v after its deadline; want within 1s", d-after)
	}
	undo()
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	s.keyIsFree(ctx, t, key, "after the abandoned Acquire", "nothing left behind")
}
