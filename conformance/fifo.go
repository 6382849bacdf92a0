package conformance

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
)

// fifoOrder: a store that declares FIFO serves waiters of different clients
// in the order it first saw them wait (an acquire of theirs found the key
// held), and a newcomer that keeps trying meanwhile never goes ahead of
// them. Stores that do not declare FIFO skip the check: nothing is promised.
func (s *suite) fifoOrder(t *testing.T) {
	if !s.caps.FIFO {
		t.Log("the store does not declare FIFO")
		return
	}
	ctx := s.ctx(t)
	key := s.key(t)
	holder, err := s.client(t).TryAcquire(ctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	const waiters = 5
	order := make(chan int, waiters+1)
	var served atomic.Int32
	// A newcomer tries the key right after every release that leaves
	// waiters behind, and all along besides; it must get the key only
	// after every waiter that came before it. Trying right after a
	// release, from the goroutine that released, gives a store that only
	// wakes its waiters in order (and lets anyone take the free key) no
	// chance to hide behind a waiter that wakes faster than the newcomer
	// polls.
	late := s.client(t, lock.WithTTL(s.long))
	var (
		lateMu sync.Mutex   // the newcomer tries once at a time
		barged atomic.Int32 // its attempts that went ahead of a waiter
	)
	newcomer := func() {
		lateMu.Lock()
		defer lateMu.Unlock()
		if l, err := late.TryAcquire(ctx, key); err == nil {
			if served.Load() < waiters {
				barged.Add(1)
			}
			l.Release(ctx)
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range waiters {
		b := s.backend(t)
		c := s.clientOver(t, b, lock.WithTTL(s.long))
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Acquire(ctx, key)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("waiter %d: Acquire: %v", i, err)
				}
				order <- -1
				return
			}
			served.Add(1)
			order <- i
			if err := l.Release(ctx); err != nil {
				t.Errorf("waiter %d: Release: %v", i, err)
			}
			if served.Load() < waiters {
				newcomer()
			}
		}()
		// The next waiter starts once the store has seen this one wait.
		select {
		case <-lockedReplies(b):
		case <-ctx.Done():
			t.Fatalf("waiter %d never reached the store", i)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	newcomer()
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			newcomer()
			time.Sleep(time.Millisecond) // a newcomer polling the key
		}
	}()
	var got []int
	for range waiters {
		got = append(got, <-order)
	}
	close(stop)
	<-polled
	wg.Wait()
	if n := barged.Load(); n > 0 {
		t.Errorf("a newcomer took the key %d times while waiters that came before it still waited", n)
	}
	for i, w := range got {
		if w != i {
			t.Fatalf("waiters served in the order %v; want 0..%d, the order the store saw them wait", got, waiters-1)
		}
	}
}

// RequestCounter is an optional Harness hook: the requests that every
// backend the harness returned has sent to the store so far (client
// requests: a script or a transaction counts once). The HotKeyRequests case
// uses it.
type RequestCounter interface {
	Requests() int64
}

// hotKeyClients and hotKeyHold shape HotKeyRequests: separate clients on
// one key, each holding it this long per section.
const (
	hotKeyClients = 8
	hotKeyHold    = time.Millisecond
	hotKeyRun     = 2 * time.Second
	// hotKeyMaxRequests bounds the requests per section of a store that
	// queues its waiters: a release that wakes one waiter costs a few
	// requests (the release, the waiter's queueing, its wake-up); one
	// that wakes all of them costs about one per waiter.
	hotKeyMaxRequests = 4
)

// hotKeyRequests: for a store that declares FIFO (its waiters queue, so a
// release wakes one), separate clients contending for one key, each
// holding it 1ms per section, cost at most hotKeyMaxRequests requests per
// section, counted by the harness (RequestCounter); sections never
// overlap.
func (s *suite) hotKeyRequests(t *testing.T) {
	rc, ok := s.h.(RequestCounter)
	if !s.caps.FIFO || !ok {
		t.Log("the store does not declare FIFO, or the harness counts no requests (RequestCounter)")
		return
	}
	ctx := s.ctx(t)
	key := s.key(t)
	var clients []*lock.Client
	for range hotKeyClients {
		clients = append(clients, s.clientOver(t, s.backend(t), lock.WithTTL(s.long)))
	}
	// Warm up: every client reaches the store once.
	for _, c := range clients {
		l, err := c.Acquire(ctx, key)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		l.Release(ctx)
	}
	before := rc.Requests()
	rctx, cancel := context.WithTimeout(ctx, hotKeyRun)
	defer cancel()
	var sections, inside atomic.Int64
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			for rctx.Err() == nil {
				l, err := c.Acquire(rctx, key)
				if err != nil {
					// The run's deadline may be reported by the
					// client's socket deadline a moment before the
					// context says it passed.
					if end, _ := rctx.Deadline(); time.Now().Before(end) {
						t.Errorf("Acquire: %v", err)
					}
					return
				}
				if inside.Add(1) != 1 {
					t.Error("two sections of one key overlap")
				}
				time.Sleep(hotKeyHold) // the section's work
				inside.Add(-1)
				sections.Add(1)
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	n := sections.Load()
	if n < 10 {
		t.Fatalf("%d sections in %v; want at least 10", n, hotKeyRun)
	}
	per := float64(rc.Requests()-before) / float64(n)
	t.Logf("%d separate clients on one key: %d sections in %v, %.1f requests per section", hotKeyClients, n, hotKeyRun, per)
	if per > hotKeyMaxRequests {
		t.Errorf("%.1f requests per section with %d separate clients on one key; a store that queues its waiters should need at most %d", per, hotKeyClients, hotKeyMaxRequests)
	}
}
