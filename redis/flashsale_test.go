package redis_test

import (
	"strings"
	"testing"

	"github.com/distlock/lock/internal/flashsale"
	"github.com/distlock/lock/internal/redistest"
)

// The flash sale, the same code as on every backend, with only the URL
// changed: a single node with durable fences, and Redlock over three.
func TestFlashSale(t *testing.T) {
	one := redistest.Start(t, redistest.AOFAlways)
	t.Run("redis", func(t *testing.T) { flashsale.CheckURL(t, "redis://"+one.Addr) })
	srvs := startN(t, 3, redistest.NoPersistence)
	addrs := make([]string, len(srvs))
	for i, s := range srvs {
		addrs[i] = s.Addr
	}
	t.Run("redlock", func(t *testing.T) { flashsale.CheckURL(t, "redlock://"+strings.Join(addrs, ",")) })
}
