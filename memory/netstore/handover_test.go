package netstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
	"github.com/distlock/lock/memory/netstore"
)

// counting counts the transfers package lock asks for, and signals the
// acquires that find the key held.
type counting struct {
	*netstore.Backend
	plain, reserved, refused atomic.Int64
	locked                   chan struct{} // buffered 1
}

func (c *counting) Transfer(ctx context.Context, key, from, to string, ttl time.Duration, opt backend.TransferOptions) (backend.Transferred, error) {
	if opt.Fence == 0 {
		c.plain.Add(1)
	} else {
		c.reserved.Add(1)
	}
	t, err := c.Backend.Transfer(ctx, key, from, to, ttl, opt)
	if errors.Is(err, backend.ErrTransferRefused) {
		c.refused.Add(1)
	}
	return t, err
}

func (c *counting) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := c.Backend.Acquire(ctx, key, token, ttl)
	if errors.Is(err, backend.ErrLocked) {
		select {
		case c.locked <- struct{}{}:
		default:
		}
	}
	return g, err
}

// newCounting returns a lock.Client over a counting Backend of srv.
func newCounting(t *testing.T, srv *netstore.Server) (*lock.Client, *counting) {
	t.Helper()
	b, err := netstore.New(srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cb := &counting{Backend: b, locked: make(chan struct{}, 1)}
	c, err := lock.New(cb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, cb
}

// acquireLater runs c.Acquire on a goroutine of its own; the lease comes on
// the returned channel (nil on error, reported to t).
func acquireLater(ctx context.Context, t *testing.T, c *lock.Client, key string) <-chan *lock.Lease {
	got := make(chan *lock.Lease, 1)
	go func() {
		l, err := c.Acquire(ctx, key)
		if err != nil {
			t.Errorf("Acquire: %v", err)
		}
		got <- l
	}()
	return got
}

// eventually polls cond until it holds, or fails t after 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond) // poll
	}
}

func receive[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// Goroutines of one lock.Client queue for a key in the process and get the
// lock from each other through Transfer; a waiter in another client makes
// the next plain transfer fail, and gets the key.
func TestHandover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := serve(t, memory.NewStore())
	locks, cb := newCounting(t, srv)
	const key = "handover"

	// A holds; B queues in the process; A's release transfers to B and
	// reserves a fence for B's successor.
	a, err := locks.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	gotB := acquireLater(ctx, t, locks, key)
	eventually(t, "B queues", func() bool { return locks.Waiting(key) == 1 })
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b := receive(t, "B's lease", gotB)
	if b == nil {
		t.FailNow()
	}
	if b.Fence() <= a.Fence() {
		t.Errorf("B's fence %d after A's %d", b.Fence(), a.Fence())
	}
	if n := cb.plain.Load(); n != 1 {
		t.Errorf("%d plain transfers after A's release; want 1", n)
	}

	// C queues; D, in another client, finds the key held.
	gotC := acquireLater(ctx, t, locks, key)
	eventually(t, "C queues", func() bool { return locks.Waiting(key) == 1 })
	other, ob := newCounting(t, srv)
	gotD := acquireLater(ctx, t, other, key)
	receive(t, "D finding the key held", ob.locked)

	// B's release hands C the lock with the fence reserved before: D's
	// wait does not stop that, but no fence is reserved for C's successor.
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c := receive(t, "C's lease", gotC)
	if c == nil {
		t.FailNow()
	}
	if c.Fence() <= b.Fence() {
		t.Errorf("C's fence %d after B's %d", c.Fence(), b.Fence())
	}

	// E queues; C's release tries a plain transfer to E, which the store
	// refuses for D's sake: the lock goes back to the store.
	gotE := acquireLater(ctx, t, locks, key)
	eventually(t, "E queues", func() bool { return locks.Waiting(key) == 1 })
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := cb.reserved.Load(); n != 1 {
		t.Errorf("%d transfers with a reserved fence; want 1 (B to C)", n)
	}
	if n, r := cb.plain.Load(), cb.refused.Load(); n != 2 || r != 1 {
		t.Errorf("%d plain transfers, %d refused; want 2 (A to B, C to E), the second refused", n, r)
	}

	// D and E both get the key, in either order, with growing fences.
	last := c.Fence()
	for range 2 {
		var l *lock.Lease
		select {
		case l = <-gotD:
		case l = <-gotE:
		case <-time.After(10 * time.Second):
			t.Fatal("D or E never got the key")
		}
		if l == nil {
			t.FailNow()
		}
		if l.Fence() <= last {
			t.Errorf("fence %d after %d", l.Fence(), last)
		}
		last = l.Fence()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// While the goroutines of one client pass a key among themselves, a waiter
// in another client still gets it, and no two holders overlap.
func TestOutsiderGetsIn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := serve(t, memory.NewStore())
	locks, cb := newCounting(t, srv)
	const key = "busy"
	var (
		inside atomic.Int32
		mu     sync.Mutex
		fences []uint64
		wg     sync.WaitGroup
	)
	section := func(l *lock.Lease) {
		if !inside.CompareAndSwap(0, 1) {
			t.Error("two holders at once")
		}
		mu.Lock()
		fences = append(fences, l.Fence())
		mu.Unlock()
		inside.Store(0)
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release: %v", err)
		}
	}
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := locks.Acquire(ctx, key)
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				section(l)
			}
		})
	}
	eventually(t, "the client's goroutines hand the key over", func() bool { return cb.plain.Load()+cb.reserved.Load() >= 10 })
	other, _ := newCounting(t, srv)
	octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
	l, err := other.Acquire(octx, key)
	ocancel()
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("a waiter in another client did not get the key: %v", err)
	}
	section(l)
	close(stop)
	wg.Wait()
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fence %d after %d in holding order", fences[i], fences[i-1])
		}
	}
	t.Logf("%d sections; transfers: %d plain (%d refused), %d with a reserved fence", len(fences), cb.plain.Load(), cb.refused.Load(), cb.reserved.Load())
}
