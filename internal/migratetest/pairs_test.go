package migratetest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	_ "github.com/distlock/lock/consul"
	"github.com/distlock/lock/internal/consultest"
	"github.com/distlock/lock/internal/etcdtest"
	"github.com/distlock/lock/internal/flashsale"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/migrate"
)

// pairURL is the migrate URL of phase between two store URLs.
func pairURL(from, to string, phase migrate.Phase) string {
	return "migrate://?" + url.Values{"from": {from}, "to": {to}, "phase": {fmt.Sprint(int(phase))}}.Encode()
}

// TestOtherPairs runs the moves from Redis to Consul and from Consul to
// etcd on real servers: instances of any two phases that share a store
// exclude each other and phases 1 and 4 do not (the negative control);
// fences grow through the four phases though the from store's fences run
// far ahead; and a flash sale between instances of each two adjacent
// phases sells exactly its units.
func TestOtherPairs(t *testing.T) {
	rs, agent, es := redistest.Start(t, redistest.AOFEverySecond), consultest.Start(t), etcdtest.Start(t)
	redisURL := "redis://" + rs.Addr
	consulURL := fmt.Sprintf("consul://%s?minttl=%v", agent.Addr, consultest.MinTTL)
	etcdURL := fmt.Sprintf("etcd://%s?electiontimeout=%v", es.Addr, etcdtest.ElectionTimeout)
	for _, pair := range []struct{ name, from, to string }{
		{"redis to consul", redisURL, consulURL},
		{"consul to etcd", consulURL, etcdURL},
	} {
		t.Run(pair.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			open := func(p migrate.Phase) *lock.Client {
				c, err := lock.Open(ctx, pairURL(pair.from, pair.to, p), lock.WithTTL(10*time.Second))
				if err != nil {
					t.Fatalf("phase %d: %v", p, err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			var clients [5]*lock.Client
			for p := migrate.FromOnly; p <= migrate.ToOnly; p++ {
				clients[p] = open(p)
			}
			for p := migrate.FromOnly; p <= migrate.ToOnly; p++ {
				for q := p + 1; q <= migrate.ToOnly; q++ {
					key := fmt.Sprintf("%s/pair-%d-%d", pair.name, p, q)
					l, err := clients[p].TryAcquire(ctx, key)
					if err != nil {
						t.Fatalf("phase %d: %v", p, err)
					}
					l2, err := clients[q].TryAcquire(ctx, key)
					apart := p == migrate.FromOnly && q == migrate.ToOnly
					// A phase 1 lock is on From only: phases 2 and 3
					// answer ErrContended (migrate's both.halfDone).
					fromOnly := p == migrate.FromOnly && !apart
					switch {
					case fromOnly && !errors.Is(err, lock.ErrContended):
						t.Errorf("phase %d beside a phase 1 holder: %v; want ErrContended", q, err)
					case !apart && !fromOnly && !errors.Is(err, lock.ErrLocked):
						t.Errorf("phase %d beside phase %d: %v; want ErrLocked", p, q, err)
					case apart && err != nil:
						t.Errorf("negative control, phase 1 beside phase 4: %v; want both held (no shared store)", err)
					}
					if l2 != nil {
						l2.Release(ctx)
					}
					if err := l.Release(ctx); err != nil {
						t.Errorf("release: %v", err)
					}
				}
			}
			var last uint64
			for p := migrate.FromOnly; p <= migrate.ToOnly; p++ {
				for range 3 { // each store's fences move on
					l, err := clients[p].TryAcquire(ctx, pair.name+"/pair-fences")
					if err != nil {
						t.Fatalf("phase %d: %v", p, err)
					}
					if l.Fence() <= last {
						t.Fatalf("phase %d: fence %#x after %#x; want growing", p, l.Fence(), last)
					}
					last = l.Fence()
					l.Release(ctx)
				}
			}
			for p := migrate.FromOnly; p < migrate.ToOnly; p++ {
				a, b := clients[p], clients[p+1]
				var n atomic.Int64
				sold := flashsale.Sale(t, 50, 300, func(inv *flashsale.Inventory, sold *atomic.Int64) error {
					c := a
					if n.Add(1)%2 == 0 {
						c = b
					}
					return c.Do(ctx, fmt.Sprintf("%s/pair-sale-%d", pair.name, p), func(context.Context, *lock.Lease) error {
						inv.Buy(sold)
						return nil
					})
				})
				if sold != 50 {
					t.Errorf("phases %d and %d: %d of 50 units sold; want exactly 50", p, p+1, sold)
				}
			}
		})
	}
}
