package migratetest

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/etcdtest"
	"github.com/distlock/lock/internal/flashsale"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/migrate"
)

// rollURL is the migrate URL of phase over a redis-server and an etcd
// member: the one configuration a deployment changes by its phase.
func rollURL(redisAddr, etcdAddr string, phase migrate.Phase) string {
	q := url.Values{}
	q.Set("from", "redis://"+redisAddr)
	q.Set("to", fmt.Sprintf("etcd://%s?electiontimeout=%v", etcdAddr, etcdtest.ElectionTimeout))
	q.Set("phase", fmt.Sprint(int(phase)))
	return "migrate://?" + q.Encode()
}

// rollInstance is one instance of a deployment that a rolling cutover
// moves through the phases: its buyers use the Client of its phase, and a
// move waits for the purchases in flight (the instance restarts with its
// new configuration).
type rollInstance struct {
	mu      sync.RWMutex // held for reading by a purchase, for writing by a move
	phase   migrate.Phase
	clients [5]*lock.Client // by phase
}

// TestRollingFlashSale: the flash sale's 100 units, bought by 2,000
// buyers spread over 8 instances that a rolling cutover moves from Redis
// to etcd one by one through phases 1 to 4 while the sale runs (24 moves,
// at most two adjacent phases at any time), sell exactly the 100 units.
// (The story's 10,000 buyers take three minutes under the race detector:
// a buyer in phases 2 and 3 takes the lock on both stores.)
func TestRollingFlashSale(t *testing.T) {
	rs, es := redistest.Start(t, redistest.AOFEverySecond), etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const instances = 8
	const moves = 3 * instances
	const buyers = 2000
	insts := make([]*rollInstance, instances)
	for i := range insts {
		in := &rollInstance{phase: migrate.FromOnly}
		for p := migrate.FromOnly; p <= migrate.ToOnly; p++ {
			c, err := lock.Open(ctx, rollURL(rs.Addr, es.Addr, p), lock.WithTTL(30*time.Second))
			if err != nil {
				t.Fatalf("phase %d: %v", p, err)
			}
			defer c.Close()
			in.clients[p] = c
		}
		insts[i] = in
	}
	// Buyers arrive as a stream, at most inFlight purchases at once (all
	// at once would all run on the phase of the first moment),
	// and a move waits for the purchases it drains.
	const inFlight = 100
	var (
		mu      sync.Mutex
		cond    = sync.NewCond(&mu)
		done    int // purchases that ended
		arrived int
		byPhase [5]atomic.Int64
	)
	waitFor := func(n int) {
		mu.Lock()
		defer mu.Unlock()
		for done < n && ctx.Err() == nil {
			cond.Wait()
		}
	}
	stopWaits := context.AfterFunc(ctx, func() { mu.Lock(); cond.Broadcast(); mu.Unlock() })
	defer stopWaits()
	// The cutover: every buyers/(moves+1) purchases, the next instance
	// moves to the next phase; each phase is everywhere before the next
	// one starts.
	rolled := make(chan struct{})
	go func() {
		defer close(rolled)
		for m := range moves {
			waitFor((m + 1) * buyers / (moves + 1))
			in := insts[m%instances]
			in.mu.Lock()
			in.phase++
			in.mu.Unlock()
		}
	}()
	sold := flashsale.Sale(t, flashsale.Units, buyers, func(inv *flashsale.Inventory, sold *atomic.Int64) error {
		mu.Lock()
		k := arrived
		arrived++
		mu.Unlock()
		waitFor(k - inFlight)
		in := insts[k%instances]
		in.mu.RLock()
		p := in.phase
		err := in.clients[p].Do(ctx, "stock:sku-1", func(context.Context, *lock.Lease) error {
			inv.Buy(sold)
			return nil
		})
		in.mu.RUnlock()
		byPhase[p].Add(1)
		mu.Lock()
		done++
		cond.Broadcast()
		mu.Unlock()
		return err
	})
	<-rolled
	if sold != flashsale.Units {
		t.Fatalf("rolling cutover: %d units sold of %d; want exactly %d, 0 oversold", sold, flashsale.Units, flashsale.Units)
	}
	for p := migrate.FromOnly; p <= migrate.ToOnly; p++ {
		if byPhase[p].Load() == 0 {
			t.Errorf("no purchase ran in phase %d: the sale did not span the cutover", p)
		}
	}
	for _, in := range insts {
		if in.phase != migrate.ToOnly {
			t.Errorf("an instance ended in phase %d; want every instance moved to 4", in.phase)
		}
	}
	t.Logf("sold %d of %d to %d buyers; purchases by phase 1-4: %d %d %d %d", sold, flashsale.Units, buyers, byPhase[1].Load(), byPhase[2].Load(), byPhase[3].Load(), byPhase[4].Load())
}
