// Package flashsale is the stock of the flash-sale story, shared by the
// lockctl demo and the test that proves the lock prevents overselling: stock
// kept in a store reached by round trips, a read and then a write, which
// concurrent buyers oversell unless something serialises them.
package flashsale

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Inventory is stock in a remote store.
type Inventory struct {
	mu    sync.Mutex
	stock int
}

// New returns an inventory holding units.
func New(units int) *Inventory { return &Inventory{stock: units} }

func (inv *Inventory) get() int {
	runtime.Gosched() // the round trip
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.stock
}

func (inv *Inventory) set(n int) {
	runtime.Gosched()
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.stock = n
}

// Buy is one buyer's read-check-write: if stock is left, it writes stock-1
// and counts the sale.
func (inv *Inventory) Buy(sold *atomic.Int64) {
	if n := inv.get(); n > 0 {
		inv.set(n - 1)
		sold.Add(1)
	}
}
