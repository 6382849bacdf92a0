// Package queuetest drives places in a key's queue (backend.Queuer) in the
// tests of the backends that queue their waiters in the store.
package queuetest

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// NewToken returns a fresh 128-bit token, as package lock makes them.
func NewToken() string {
	var b [16]byte
	crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Waiter is a place in a key's queue that found the key held.
type Waiter struct {
	Q     backend.Queue
	Token string // of its latest attempt, which queued it
	ttl   time.Duration
	// The place's first attempt began, and its latest ended: its queueing
	// request (the one a handover counts from) was sent in between, as
	// long as the test is shorter than the place's refresh period.
	began, ended time.Time
	// Confirms: the backend confirms each handover with a request of its
	// own (waitq.Place.Confirmed), whose send time the handover counts
	// from: one sent after the waiter's queueing, before Handed returns.
	Confirms bool
}

// Queue makes a waiter of qr for key: an attempt through a new place that
// finds the key held, and so queues. The place closes (without the lock)
// when the test ends, unless it closed before.
func Queue(ctx context.Context, t *testing.T, qr backend.Queuer, key string, ttl time.Duration) *Waiter {
	t.Helper()
	q, err := qr.Queue(key)
	if err != nil {
		t.Fatalf("Queue: %v", err)
	}
	t.Cleanup(func() { q.Close(false) })
	w := &Waiter{Q: q, ttl: ttl}
	w.Try(ctx, t, key)
	return w
}

// Try makes another attempt through the place, which must find the key
// held.
func (w *Waiter) Try(ctx context.Context, t *testing.T, key string) {
	t.Helper()
	tok := NewToken()
	began := time.Now()
	if _, err := w.Q.Acquire(ctx, tok, w.ttl); !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("Acquire of %q through a place, the key held: %v; want ErrLocked", key, err)
	}
	if w.began.IsZero() {
		w.began = began
	}
	w.Token, w.ended = tok, time.Now()
}

// WakeUp waits for w's wake-up.
func (w *Waiter) WakeUp(t *testing.T, who string) {
	t.Helper()
	select {
	case <-w.Q.C():
	case <-time.After(5 * time.Second):
		t.Fatalf("%s was not woken within 5s", who)
	}
}

// NotWoken fails t if w has a wake-up.
func (w *Waiter) NotWoken(t *testing.T, who string) {
	t.Helper()
	select {
	case <-w.Q.C():
		t.Errorf("%s was woken, though not at the head of the queue", who)
	default:
	}
}

// Began is when w's first attempt began: a handover to w counts from a
// request sent after it.
func (w *Waiter) Began() time.Time { return w.began }

// Handed waits for the handover to w, checks it, and closes w's place with
// the lock taken. The handed lock must count from the waiter's own
// queueing request (sent between its first attempt's start and its latest
// attempt's end), never from the handover or from when the waiter learned
// of it; or, when w.Confirms, from the confirmation the backend sent.
func (w *Waiter) Handed(t *testing.T, who string) backend.Handover {
	t.Helper()
	w.WakeUp(t, who)
	h, ok := w.Q.Handed()
	if !ok {
		t.Fatalf("%s was woken, but nothing was handed to it", who)
	}
	if h.Token != w.Token || h.Fence == 0 || h.TTL != w.ttl {
		t.Fatalf("%s was handed %+v; want its token %s, a fence and the TTL %v", who, h, w.Token, w.ttl)
	}
	switch now := time.Now(); {
	case w.Confirms && (h.Since.Before(w.ended) || h.Since.After(now)):
		t.Fatalf("%s's handed lock counts from %v after it began to queue; want the confirmation's send, after its queueing (%v) and before now (%v)",
			who, h.Since.Sub(w.began), w.ended.Sub(w.began), now.Sub(w.began))
	case !w.Confirms && (h.Since.Before(w.began) || h.Since.After(w.ended)):
		t.Fatalf("%s's handed lock counts from %v after it began to queue; want a request of its queueing, between 0 and %v",
			who, h.Since.Sub(w.began), w.ended.Sub(w.began))
	}
	w.Q.Close(true)
	return h
}

// AcquireLater starts c.Acquire(ctx, key) on a goroutine of its own; the
// channel carries the lease it returns (nil after an error, which fails
// t).
func AcquireLater(ctx context.Context, t *testing.T, c *lock.Client, key string) <-chan *lock.Lease {
	got := make(chan *lock.Lease, 1)
	go func() {
		l, err := c.Acquire(ctx, key)
		if err != nil {
			t.Errorf("waiter's Acquire: %v", err)
		}
		got <- l
	}()
	return got
}

// RequeuedAfterVanishing finishes a case where w1's queue record vanished
// while w2 queued behind it, once the holder has released: w2 is handed the
// lock (check, unless nil, looks at the handover), and w1 is not, from the
// record that went; w1's next attempt queues it again, at the back, and
// w2's release (through b2) hands it the lock, which b1 then releases.
func RequeuedAfterVanishing(ctx context.Context, t *testing.T, key string, w1, w2 *Waiter, b1, b2 backend.Backend, check func(backend.Handover)) {
	t.Helper()
	h := w2.Handed(t, "the second waiter")
	if check != nil {
		check(h)
	}
	if _, ok := w1.Q.Handed(); ok {
		t.Fatal("a waiter whose queue record vanished was handed the lock from it")
	}
	w1.Try(ctx, t, key)
	if err := b2.Release(ctx, key, h.Token); err != nil {
		t.Fatal(err)
	}
	h1 := w1.Handed(t, "the waiter that queued again")
	if err := b1.Release(ctx, key, h1.Token); err != nil {
		t.Fatal(err)
	}
}
