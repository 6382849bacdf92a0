package lock_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/flashsale"
	"github.com/distlock/lock/memory"
)

const (
	units  = 100
	buyers = 10000
)

// sale runs every buyer at once and returns how many units were sold.
func sale(t *testing.T, purchase func(inv *flashsale.Inventory, sold *atomic.Int64) error) int64 {
	t.Helper()
	inv := flashsale.New(units)
	var sold atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	var failures atomic.Int64
	for i := 0; i < buyers; i++ {
		wg.Go(func() {
			<-start
			if err := purchase(inv, &sold); err != nil && failures.Add(1) == 1 {
				t.Errorf("buyer: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	return sold.Load()
}

func TestFlashSale(t *testing.T) {
	withoutLock := sale(t, func(inv *flashsale.Inventory, sold *atomic.Int64) error {
		inv.Buy(sold)
		return nil
	})
	if withoutLock <= units {
		t.Fatalf("without the lock %d units sold of %d: the test cannot show what the lock prevents", withoutLock, units)
	}
	t.Logf("without a lock: %d sold of %d units, oversold by %d", withoutLock, units, withoutLock-units)

	locks, err := lock.New(memory.New(), lock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	withLock := sale(t, func(inv *flashsale.Inventory, sold *atomic.Int64) error {
		return locks.Do(ctx, "stock:sku-1", func(context.Context, *lock.Lease) error {
			inv.Buy(sold)
			return nil
		})
	})
	if withLock != units {
		t.Fatalf("with the lock %d units sold of %d; want exactly %d, 0 oversold", withLock, units, units)
	}
	t.Logf("with the lock: %d sold, 0 oversold, %d buyers", withLock, buyers)
}
