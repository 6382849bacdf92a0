package etcd_test

import (
	"testing"

	"github.com/distlock/lock/internal/flashsale"
)

// The flash sale, the same code as on every backend, with only the URL
// changed.
func TestFlashSale(t *testing.T) {
	srv := startEtcd(t)
	flashsale.CheckURL(t, "etcd://"+srv.Addr)
}
