package conformance

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// watchBeforeRelease: the holder releases at the moment a waiter starts
// to wait: just before the waiter's Watch is sent (a Notifier, which
// reports only what happens after Watch returns), or just after the store
// queued it (a Queuer). The waiter must take the key within the slack,
// not once the holder's TTL would have run out: package lock tries again
// after a watch begins, and a Queuer hands over or wakes a waiter it has
// just queued.
func (s *suite) watchBeforeRelease(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	wb := s.backend(t)
	if _, ok := wb.(backend.Notifier); !ok {
		wb.Close()
		t.Skip("the backend is no backend.Notifier: waiters poll")
	}
	w := s.clientOver(t, wb, lock.WithTTL(s.long))
	h, err := s.client(t, lock.WithTTL(s.long)).TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	releasedAt := make(chan time.Time, 1)
	var once sync.Once
	intercept(t, wb, interceptors{waiting: func(context.Context) {
		once.Do(func() {
			if err := h.Release(ctx); err != nil {
				t.Errorf("Release as the waiter starts to wait: %v", err)
			}
			releasedAt <- time.Now()
		})
	}})
	wctx, cancel := context.WithTimeout(ctx, s.long/2)
	defer cancel()
	l, err := w.Acquire(wctx, key)
	if err != nil {
		t.Fatalf("Acquire of the waiter: %v", err)
	}
	var released time.Time
	select {
	case released = <-releasedAt:
	default:
		t.Fatal("the waiter took the key without waiting: the holder still held it")
	}
	if d := time.Since(released); d > s.slack {
		t.Errorf("the waiter took the key %v after the holder released it as the waiter began to wait; want within %v: a release just before the watch began was missed", d.Round(time.Millisecond), s.slack)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}
