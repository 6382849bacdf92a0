package flashsale

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
)

// The story's numbers: 100 units, 10,000 buyers at once.
const (
	Units  = 100
	Buyers = 10000
)

// Sale runs buyers buyers at once against units of stock, each calling
// purchase, and returns how many units were sold. A purchase error fails t
// (the first one is reported).
func Sale(t testing.TB, units, buyers int, purchase func(inv *Inventory, sold *atomic.Int64) error) int64 {
	t.Helper()
	inv := New(units)
	var sold atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	var failures atomic.Int64
	for range buyers {
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

// CheckURL runs the flash sale with the lock of the backend at url, the
// same application code for every backend, and fails t unless exactly
// Units are sold.
func CheckURL(t testing.TB, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	locks, err := lock.Open(ctx, url, lock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	start := time.Now()
	sold := Sale(t, Units, Buyers, func(inv *Inventory, sold *atomic.Int64) error {
		return locks.Do(ctx, "stock:sku-1", func(context.Context, *lock.Lease) error {
			inv.Buy(sold)
			return nil
		})
	})
	if sold != Units {
		t.Fatalf("%s: with the lock %d units sold of %d; want exactly %d, 0 oversold", url, sold, Units, Units)
	}
	t.Logf("%s: %d sold, 0 oversold, %d buyers, in %v", url, sold, Buyers, time.Since(start).Round(time.Millisecond))
}
