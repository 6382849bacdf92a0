package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// transferSpy counts the transfers package lock asks for, and can make the
// ones with a reserved fence (handovers ahead of the store) fail.
type transferSpy struct {
	*redis.Backend
	plain, reserved atomic.Int64
	failReserved    atomic.Value // error
	holdReserved    atomic.Value // chan struct{}: a handover waits for it to close
}

func (s *transferSpy) Transfer(ctx context.Context, key, from, to string, ttl time.Duration, opt backend.TransferOptions) (backend.Transferred, error) {
	if opt.Fence == 0 {
		s.plain.Add(1)
	} else {
		s.reserved.Add(1)
		if err, _ := s.failReserved.Load().(error); err != nil {
			return backend.Transferred{}, err
		}
		if hold, _ := s.holdReserved.Load().(chan struct{}); hold != nil {
			<-hold
		}
	}
	return s.Backend.Transfer(ctx, key, from, to, ttl, opt)
}

// hammer runs goroutines of locks on key for rounds each, checking that no
// two sections overlap and that fences grow in the order sections run.
func hammer(t *testing.T, locks *lock.Client, key string, goroutines, rounds int) {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var inside bool
	var last uint64
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Go(func() {
			for r := 0; r < rounds; r++ {
				l, err := locks.Acquire(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if inside {
					t.Error("two sections overlap")
				}
				if l.Fence() <= last {
					t.Errorf("fence %d after %d", l.Fence(), last)
				}
				inside, last = true, l.Fence()
				mu.Unlock()
				time.Sleep(50 * time.Microsecond) // the section: lets the others queue
				mu.Lock()
				inside = false
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					t.Errorf("release: %v", err)
				}
			}
		})
	}
	wg.Wait()
}

// Goroutines of one client queued for a key get it from each other ahead of
// the store, with fences reserved by the transfer before: after the first
// handoff of a run, the store sees one transfer per section and no
// acquire, and fences still grow.
func TestHandoverAheadOfTheStore(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	spy := &transferSpy{Backend: redis.New(newGoRedis(t, srv.Addr))}
	locks := newLocks(t, spy)
	const goroutines, rounds = 4, 100
	hammer(t, locks, "handover", goroutines, rounds)
	plain, reserved := spy.plain.Load(), spy.reserved.Load()
	t.Logf("%d sections: %d plain transfers, %d handovers with a reserved fence", goroutines*rounds, plain, reserved)
	if reserved < goroutines*rounds/2 {
		t.Fatalf("%d handovers with a reserved fence in %d sections; want most sections handed over ahead of the store", reserved, goroutines*rounds)
	}
	h, err := spy.Inspect(context.Background(), "handover")
	if err != nil || h.Held {
		t.Fatalf("after the last release: %+v, %v; want the key free", h, err)
	}
}

// When the handover's transfer fails, the goroutine that started under it
// is told it lost the lock, and the key is freed: when the store had lost
// the lock, and when the transfer's outcome is unknown.
func TestFailedHandoverLosesTheLease(t *testing.T) {
	for _, name := range []string{"deleted", "unknown"} {
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.NoPersistence)
			spy := &transferSpy{Backend: redis.New(newGoRedis(t, srv.Addr))}
			locks := newLocks(t, spy)
			ctx := context.Background()

			// A holds; B and C queue. A's release transfers to B with
			// a fence reserved for B's successor; B's release then
			// hands C the lock ahead of the store, and that fails.
			b, got := firstHandoff(t, locks, "k")
			if name == "deleted" {
				// The store lost B's lock: the handover finds it
				// gone.
				if err := newGoRedis(t, srv.Addr).Del(ctx, "lock:{k}").Err(); err != nil {
					t.Fatal(err)
				}
			} else {
				spy.failReserved.Store(errors.New("connection reset"))
			}
			if err := b.Release(ctx); err != nil {
				t.Fatal(err)
			}
			c := <-got
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the lease started under a failed handover was not lost")
			}
			if !errors.Is(c.Err(), lock.ErrLost) {
				t.Fatalf("Err after a failed handover: %v; want ErrLost", c.Err())
			}
			// The key is freed: another client takes it.
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			l, err := newLocks(t, redis.New(newGoRedis(t, srv.Addr))).Acquire(wctx, "k")
			if err != nil {
				t.Fatalf("another client after the failed handover: %v", err)
			}
			if l.Fence() <= b.Fence() {
				t.Errorf("fence %d after %d", l.Fence(), b.Fence())
			}
			l.Release(ctx)
			if n := spy.reserved.Load(); n != 1 {
				t.Errorf("%d handovers with a reserved fence; want 1", n)
			}
		})
	}
}

// firstHandoff takes key on locks (holder A) and queues two more goroutines
// of locks for it (B and C); A's release transfers the lock to B, with a
// fence reserved for C. It returns B's lease, and the channel C's lease will
// come on.
func firstHandoff(t *testing.T, locks *lock.Client, key string) (*lock.Lease, <-chan *lock.Lease) {
	t.Helper()
	ctx := context.Background()
	a, err := locks.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lock.Lease, 2)
	for range 2 {
		go func() {
			l, err := locks.Acquire(ctx, key)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
	}
	waitQueued(t, locks, key, 2)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return <-got, got
}

// heldBackHandover sets up a lease handed over ahead of the store whose
// transfer is held back: A holds key "k" and B and C queue (TTL a minute);
// A's release transfers to B and reserves C's fence; B's release hands C
// the lock ahead of the store, and the transfer waits until hold is closed.
// It returns B's (released) and C's leases.
func heldBackHandover(t *testing.T) (srv *redistest.Server, spy *transferSpy, b, c *lock.Lease, hold chan struct{}) {
	t.Helper()
	srv = redistest.Start(t, redistest.NoPersistence)
	spy = &transferSpy{Backend: redis.New(newGoRedis(t, srv.Addr))}
	locks := newLocks(t, spy, lock.WithTTL(time.Minute))
	b, got := firstHandoff(t, locks, "k")
	hold = make(chan struct{})
	spy.holdReserved.Store(hold)
	if err := b.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	return srv, spy, b, <-got, hold
}

// waitQueued waits until n goroutines of locks wait for key.
func waitQueued(t *testing.T, locks *lock.Client, key string, n int) {
	t.Helper()
	for locks.Waiting(key) < n {
		time.Sleep(time.Millisecond) // poll the queue
	}
}

// Goroutines of one client handing a key among themselves ahead of the store
// do not keep a waiter in another process out.
func TestHandoverLetsOtherProcessesIn(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	locks := newLocks(t, redis.New(newGoRedis(t, srv.Addr)))
	other := newLocks(t, redis.New(newGoRedis(t, srv.Addr)))
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for g := 0; g < 4; g++ {
		wg.Go(func() {
			for ctx.Err() == nil {
				l, err := locks.Acquire(ctx, "busy")
				if err != nil {
					return
				}
				time.Sleep(100 * time.Microsecond)
				l.Release(context.Background())
			}
		})
	}
	for i := 0; i < 5; i++ {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := other.Acquire(wctx, "busy")
		cancel()
		if err != nil {
			t.Fatal(fmt.Errorf("acquire %d by another client while 4 goroutines of one client churn: %w", i, err))
		}
		l.Release(ctx)
	}
}

// A lease handed over ahead of the store is valid until the previous
// holder's deadline while the transfer is out; its renew and release wait
// for the transfer, or for their context; once the transfer lands, the
// deadline moves on.
func TestLeaseWhileItsHandoverIsOut(t *testing.T) {
	_, spy, b, c, hold := heldBackHandover(t)
	ctx := context.Background()
	bDeadline := b.Deadline()
	if c.Fence() <= b.Fence() {
		t.Fatalf("fence %d after %d", c.Fence(), b.Fence())
	}
	if !c.Deadline().Equal(bDeadline) {
		t.Fatalf("deadline while the handover is out: %v; want the previous holder's, %v", c.Deadline(), bDeadline)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("Err while the handover is out: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := c.Renew(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Renew while the handover is out, until its context ends: %v; want DeadlineExceeded", err)
	}

	close(hold) // the transfer reaches the store
	if err := c.Renew(ctx); err != nil {
		t.Fatalf("Renew after the handover landed: %v", err)
	}
	if !c.Deadline().After(bDeadline) {
		t.Fatalf("deadline after the handover and a renewal: %v; want after %v", c.Deadline(), bDeadline)
	}
	h, err := spy.Inspect(ctx, "k")
	if err != nil || !h.Held || h.Token != c.Token() || h.Fence != c.Fence() {
		t.Fatalf("the store after the handover: %+v, %v; want token %s, fence %d", h, err, c.Token(), c.Fence())
	}
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A release whose context ends while the lease's handover is out returns
// the context's error, and the lock is released once the handover lands.
func TestReleaseWhileTheHandoverIsOut(t *testing.T) {
	srv, _, _, c, hold := heldBackHandover(t)
	ctx := context.Background()

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := c.Release(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release while the handover is out, until its context ends: %v; want DeadlineExceeded", err)
	}
	close(hold)
	// The release goes on in the background: another client gets the key
	// at once, well before the minute-long TTL.
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	l, err := newLocks(t, redis.New(newGoRedis(t, srv.Addr))).Acquire(wctx, "k")
	if err != nil {
		t.Fatalf("another client after the background release: %v", err)
	}
	if l.Fence() <= c.Fence() {
		t.Errorf("fence %d after %d", l.Fence(), c.Fence())
	}
	l.Release(ctx)
}
