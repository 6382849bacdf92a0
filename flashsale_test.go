package lock_test

import (
	"sync/atomic"
	"testing"

	"github.com/distlock/lock/internal/flashsale"
	_ "github.com/distlock/lock/memory"
)

func TestFlashSale(t *testing.T) {
	withoutLock := flashsale.Sale(t, flashsale.Units, flashsale.Buyers, func(inv *flashsale.Inventory, sold *atomic.Int64) error {
		inv.Buy(sold)
		return nil
	})
	if withoutLock <= flashsale.Units {
		t.Fatalf("without the lock %d units sold of %d: the test cannot show what the lock prevents", withoutLock, flashsale.Units)
	}
	t.Logf("without a lock: %d sold of %d units, oversold by %d", withoutLock, flashsale.Units, withoutLock-flashsale.Units)
	// The same application code runs on every backend with only the URL
	// changed: see the redis, consul and etcd packages' TestFlashSale.
	flashsale.CheckURL(t, "mem://flash-sale")
}
