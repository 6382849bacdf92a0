package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/memory"
)

func ExampleClient_TryAcquire() {
	ctx := context.Background()
	store := memory.NewStore()
	replicaA, _ := lock.New(store.NewBackend())
	replicaB, _ := lock.New(store.NewBackend())
	defer replicaA.Close()
	defer replicaB.Close()

	l, err := replicaA.TryAcquire(ctx, "job:nightly-report")
	if err != nil {
		panic(err)
	}
	defer l.Release(ctx)

	_, err = replicaB.TryAcquire(ctx, "job:nightly-report")
	if errors.Is(err, lock.ErrLocked) {
		fmt.Println("replica B: another replica runs the report")
	}
	// Output: replica B: another replica runs the report
}

func ExampleClient_Acquire() {
	ctx := context.Background()
	locks, _ := lock.New(memory.New())
	defer locks.Close()

	first, _ := locks.Acquire(ctx, "invoice:7")
	go func() {
		time.Sleep(10 * time.Millisecond) // some work under the lock
		first.Release(ctx)
	}()

	// Waits (woken by the release, no polling) until the key is free, or
	// until ctx ends.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	second, err := locks.Acquire(wctx, "invoice:7")
	if err != nil {
		panic(err)
	}
	defer second.Release(ctx)
	fmt.Println("fences increase:", second.Fence() > first.Fence())
	// Output: fences increase: true
}

// storage is a resource that checks fencing tokens: it rejects a write whose
// fence is lower than the highest it has accepted.
type storage struct {
	mu        sync.Mutex
	highest   uint64
	lastValue string
}

func (s *storage) write(fence uint64, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fence < s.highest {
		return fmt.Errorf("stale fence %d: %d was already accepted", fence, s.highest)
	}
	s.highest, s.lastValue = fence, value
	return nil
}

func ExampleLease_Fence() {
	ctx := context.Background()
	store := memory.NewStore()
	clientA, _ := lock.New(store.NewBackend(), lock.WithAutoRenew(false))
	clientB, _ := lock.New(store.NewBackend())
	defer clientA.Close()
	defer clientB.Close()
	db := &storage{}

	// A takes the lock, then pauses (a long GC, say) past its TTL.
	a, _ := clientA.TryAcquire(ctx, "file", lock.WithTTL(20*time.Millisecond))
	<-a.Done()

	// B takes over and writes with its newer fence.
	b, _ := clientB.Acquire(ctx, "file")
	defer b.Release(ctx)
	fmt.Println("B writes:", db.write(b.Fence(), "from B"))

	// A wakes up and, unaware, writes: the fence check rejects it.
	err := db.write(a.Fence(), "from A")
	fmt.Println("A rejected:", err != nil)
	fmt.Println("value:", db.lastValue)
	// Output:
	// B writes: <nil>
	// A rejected: true
	// value: from B
}

func ExampleClient_Do() {
	ctx := context.Background()
	locks, _ := lock.New(memory.New())
	defer locks.Close()

	err := locks.Do(ctx, "user:42:charge", func(ctx context.Context, l *lock.Lease) error {
		// ctx is cancelled the moment the lease is lost; pass l.Fence() to
		// the resource.
		fmt.Println("charging once, fence", l.Fence())
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// charging once, fence 1
	// err: <nil>
}

func ExampleOpen() {
	ctx := context.Background()
	// The memory backend registers "mem" when imported; "mem://NAME" names
	// a process-wide store, so both clients contend for the same keys.
	a, err := lock.Open(ctx, "mem://example?ttl=30s")
	if err != nil {
		panic(err)
	}
	defer a.Close()
	b, _ := lock.Open(ctx, "mem://example")
	defer b.Close()

	l, _ := a.TryAcquire(ctx, "k")
	defer l.Release(ctx)
	_, err = b.TryAcquire(ctx, "k")
	fmt.Println(l.TTL(), errors.Is(err, lock.ErrLocked))

	_, err = lock.Open(ctx, "mem://example?tll=30s")
	fmt.Println(err)
	// Output:
	// 30s true
	// lock: Open mem://example?tll=30s: unknown query parameter "tll" for scheme mem; valid: autorenew, drift, maxhold, maxttl, ttl
}

// TryDo runs a section only if the key is free: a job that another worker
// is already running is skipped, not waited for.
func ExampleClient_TryDo() {
	ctx := context.Background()
	locks, err := lock.New(memory.New())
	if err != nil {
		panic(err)
	}
	defer locks.Close()

	run := func(worker string) error {
		return locks.TryDo(ctx, "job:7", func(ctx context.Context, l *lock.Lease) error {
			fmt.Println(worker, "runs job 7 with fence", l.Fence())
			// A second worker tries while the first one runs.
			if worker == "a" {
				err := locks.TryDo(ctx, "job:7", func(context.Context, *lock.Lease) error { return nil })
				fmt.Println("b skipped:", errors.Is(err, lock.ErrLocked))
			}
			return nil
		})
	}
	if err := run("a"); err != nil {
		fmt.Println("error:", err)
	}
	// Output:
	// a runs job 7 with fence 1
	// b skipped: true
}

// WithWait bounds only the wait for the key: the section that follows
// runs under the caller's context, which this bound does not cut short.
func ExampleWithWait() {
	ctx := context.Background()
	locks, err := lock.New(memory.New())
	if err != nil {
		panic(err)
	}
	defer locks.Close()

	held, err := locks.TryAcquire(ctx, "report")
	if err != nil {
		panic(err)
	}
	err = locks.Do(ctx, "report", func(context.Context, *lock.Lease) error { return nil }, lock.WithWait(50*time.Millisecond))
	fmt.Println("gave up waiting:", errors.Is(err, context.DeadlineExceeded), errors.Is(err, lock.ErrLocked))
	held.Release(ctx)

	err = locks.Do(ctx, "report", func(ctx context.Context, l *lock.Lease) error {
		time.Sleep(100 * time.Millisecond) // a section longer than the wait bound
		fmt.Println("section finished:", ctx.Err())
		return nil
	}, lock.WithWait(50*time.Millisecond))
	fmt.Println("err:", err)
	// Output:
	// gave up waiting: true true
	// section finished: <nil>
	// err: <nil>
}

// A deferred Release needs no filter: a lease already lost (its deadline
// passed without a renewal) releases with nil, and Err keeps the loss.
func ExampleLease_Release() {
	ctx := context.Background()
	locks, err := lock.New(memory.New(), lock.WithTTL(50*time.Millisecond), lock.WithAutoRenew(false))
	if err != nil {
		panic(err)
	}
	defer locks.Close()

	l, err := locks.TryAcquire(ctx, "k")
	if err != nil {
		panic(err)
	}
	<-l.Done() // no renewal: lost at its deadline
	fmt.Println("release:", l.Release(ctx))
	fmt.Println("lost:", errors.Is(l.Err(), lock.ErrLost))
	// Output:
	// release: <nil>
	// lost: true
}

// Operators see who holds a lock: the description its holder set
// (WithHolder; host, pid and program name by default), its fence and the
// time the store gives it.
func ExampleClient_Inspect() {
	ctx := context.Background()
	store := memory.NewStore()
	worker, err := lock.New(store.NewBackend(), lock.WithHolder("billing-worker-3 (host b7)"))
	if err != nil {
		panic(err)
	}
	defer worker.Close()
	operator, err := lock.New(store.NewBackend())
	if err != nil {
		panic(err)
	}
	defer operator.Close()

	l, err := worker.TryAcquire(ctx, "invoice:7")
	if err != nil {
		panic(err)
	}
	defer l.Release(ctx)

	h, err := operator.Inspect(ctx, "invoice:7")
	if err != nil {
		panic(err)
	}
	fmt.Printf("held: %v by %q, fence %d, same fence as the lease: %v\n", h.Held, h.Description, h.Fence, h.Fence == l.Fence())

	_, err = worker.TryAcquire(ctx, "invoice:8", lock.WithHolder("two\nlines"))
	fmt.Println(errors.Is(err, lock.ErrInvalidOption))
	// Output:
	// held: true by "billing-worker-3 (host b7)", fence 1, same fence as the lease: true
	// true
}
