package memory_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/clock"
	"github.com/distlock/lock/memory"
)

// Test your own lock-loss handling without sleeping: one fake clock drives
// both the store's expiry and the client's deadline.
func Example_fakeClock() {
	ctx := context.Background()
	fc := clock.NewFake(time.Unix(0, 0))
	store := memory.NewStore(memory.WithStoreClock(fc))
	locks, _ := lock.New(store.NewBackend(), lock.WithClock(fc), lock.WithAutoRenew(false))
	defer locks.Close()

	l, _ := locks.TryAcquire(ctx, "job", lock.WithTTL(time.Second))
	fc.AdvanceWait(2 * time.Second)

	<-l.Done()
	fmt.Println("lost:", errors.Is(l.Err(), lock.ErrLost))
	fmt.Println("locks in the store:", store.Len())
	// Output:
	// lost: true
	// locks in the store: 0
}

// Cut one client off the store, as a network partition would, and watch the
// holder learn that it lost the lock.
func ExampleBackend_Disconnect() {
	ctx := context.Background()
	conn := memory.New()
	locks, _ := lock.New(conn, lock.WithTTL(50*time.Millisecond))
	defer locks.Close()

	l, _ := locks.TryAcquire(ctx, "job")
	conn.Disconnect() // renewals now vanish
	<-l.Done()        // closes at the lease's deadline
	conn.Reconnect()
	fmt.Println(errors.Is(l.Err(), lock.ErrLost))
	// Output: true
}
