package lock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/memory"
)

// events records what an observer receives.
type events struct {
	mu   sync.Mutex
	es   []lock.Event
	cond *sync.Cond
}

func newEvents() *events {
	r := &events{}
	r.cond = sync.NewCond(&r.mu)
	return r
}

func (r *events) Observe(_ context.Context, e lock.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.es = append(r.es, e)
	r.cond.Broadcast()
}

// await waits until an event of kind has been received. A lease's end
// reports EventLost after Done closes (outside the lease's mutex), so a
// test waits for it rather than read the events at once.
func (r *events) await(kind lock.EventKind) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for !slices.ContainsFunc(r.es, func(e lock.Event) bool { return e.Kind == kind }) {
		r.cond.Wait()
	}
}

// take returns the events so far and forgets them.
func (r *events) take() []lock.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	es := r.es
	r.es = nil
	return es
}

func kinds(es []lock.Event) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(e.Kind.String())
	}
	return b.String()
}

// The events of an acquire, a contended acquire, a renewal, a renewal that
// fails, a loss and a release, each with its key, outcome and times.
func TestObserverEvents(t *testing.T) {
	rec := newEvents()
	mc := memory.New()
	c := mustClient(t, mc, lock.WithObserver(rec), lock.WithTTL(100*time.Millisecond), lock.WithAutoRenew(false))
	ctx := context.Background()

	l := mustTry(t, c, "k")
	es := rec.take()
	if kinds(es) != "acquire" || es[0].Err != nil || es[0].Key != "k" || es[0].Fence != l.Fence() || es[0].Wait || es[0].Start.IsZero() {
		t.Fatalf("events of a TryAcquire: %s %+v; want acquire with the key, the fence and its start", kinds(es), es)
	}
	if _, err := c.TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
		t.Fatal(err)
	}
	if es := rec.take(); kinds(es) != "acquire" || !errors.Is(es[0].Err, lock.ErrLocked) {
		t.Fatalf("events of a contended TryAcquire: %s %+v; want acquire with ErrLocked", kinds(es), es)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if es := rec.take(); kinds(es) != "renew" || es[0].Err != nil || es[0].Auto {
		t.Fatalf("events of a Renew: %s %+v; want one renew, not automatic", kinds(es), es)
	}
	mc.Disconnect() // the store no longer answers
	rctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	if err := l.Renew(rctx); err == nil {
		t.Fatal("Renew while disconnected: nil")
	}
	cancel()
	if es := rec.take(); kinds(es) != "renew" || es[0].Err == nil {
		t.Fatalf("events of a failed Renew: %s %+v; want renew with its error", kinds(es), es)
	}
	<-l.Done() // waiting out the TTL
	mc.Reconnect()
	rec.await(lock.EventLost)
	es = rec.take()
	if kinds(es) != "lost" || !errors.Is(es[0].Err, lock.ErrLost) || es[0].Held <= 0 {
		t.Fatalf("events of a loss: %s %+v; want lost with ErrLost and how long it was held", kinds(es), es)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if es := rec.take(); kinds(es) != "release" || !errors.Is(es[0].Err, lock.ErrLost) {
		t.Fatalf("events of the release of a lost lease: %s %+v; want release with ErrLost", kinds(es), es)
	}
	l.Release(ctx) // a second release reports nothing
	l2, err := c.Acquire(ctx, "k2")
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	es = rec.take()
	if kinds(es) != "acquire-start acquire release" || !es[0].Wait || es[2].Err != nil || es[2].Held < 0 || es[2].Start.IsZero() {
		t.Fatalf("events of an Acquire and its release: %s %+v", kinds(es), es)
	}
	// Observers are Client options.
	if _, err := c.TryAcquire(ctx, "k3", lock.WithObserver(rec)); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("TryAcquire with WithObserver: %v; want ErrInvalidOption", err)
	}
	if _, err := c.TryAcquire(ctx, "k3", lock.WithLogger(slog.Default())); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("TryAcquire with WithLogger: %v; want ErrInvalidOption", err)
	}
}

// An acquire whose reply is lost is cleaned up in the background, and the
// observer hears of the cleanup.
func TestObserverCleanup(t *testing.T) {
	rec := newEvents()
	mc := memory.New()
	c, err := lock.New(mc, lock.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	mc.HoldReplies()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	_, err = c.TryAcquire(ctx, "k")
	cancel()
	if err == nil {
		t.Fatal("TryAcquire with its reply held past its context: nil")
	}
	mc.DeliverReplies()
	c.Close() // waits for the cleanup
	rec.await(lock.EventCleanup)
	es := rec.take()
	if !strings.Contains(kinds(es), "cleanup") {
		t.Fatalf("events after an acquire of unknown outcome: %s; want a cleanup", kinds(es))
	}
}

// WithLogger logs a loss at Warn with the key and never the token, and
// logs nothing for an ordinary acquire and release.
func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	written := make(chan struct{}, 100)
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu, written: written}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := mustClient(t, memory.New(), lock.WithLogger(logger), lock.WithTTL(50*time.Millisecond), lock.WithAutoRenew(false))
	ctx := context.Background()
	l := mustTry(t, c, "quiet")
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	quiet := buf.String()
	mu.Unlock()
	if quiet != "" {
		t.Fatalf("log of an ordinary acquire and release: %q; want nothing", quiet)
	}
	l = mustTry(t, c, "job:7")
	<-l.Done() // waiting out the TTL
	<-written  // the loss's record
	l.Release(ctx)
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "lease lost") || !strings.Contains(out, "key=job:7") {
		t.Errorf("log of a loss: %q; want a WARN record with the key", out)
	}
	if strings.Contains(out, l.Token()) {
		t.Errorf("log of a loss carries the token: %q", out)
	}
}

// lockedWriter is a buffer for a logger's handler that signals each
// record written.
type lockedWriter struct {
	w       *bytes.Buffer
	mu      *sync.Mutex
	written chan struct{}
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	defer func() { w.written <- struct{}{} }()
	return w.w.Write(p)
}
