package consul_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/consultest"
)

// One client fills its session pool with a burst on 16 keys, stands idle
// until the store has expired every pooled session, then acquires again,
// waiting (through a place in the queue), on fresh keys and on the same
// ones: every grant must be real (a fence, the entry locked: another
// client's TryAcquire is refused). Before the fix, an acquire whose two
// tries both met an expired session returned a zero grant with no error:
// a lease with fence 0 on a key nobody held.
func TestPooledSessionsExpiredWhileIdle(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	const ttl = consultest.MinTTL
	c := newClient(t, agent.Addr, nil, lock.WithTTL(ttl))
	other := newClient(t, agent.Addr, nil, lock.WithTTL(ttl))
	outside, _ := client(t, agent.Addr)

	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			l, err := c.Acquire(ctx, fmt.Sprintf("burst-%d", i))
			if err != nil {
				t.Errorf("burst acquire: %v", err)
				return
			}
			if err := l.Release(ctx); err != nil {
				t.Errorf("burst release: %v", err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	sessions, _, err := outside.Session().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(sessions) == 0 {
		t.Fatal("no session is left after the burst: the pool keeps none, and the test checks nothing")
	}
	t.Logf("%d idle sessions after the burst", len(sessions))
	// Consul expires a session between its TTL and twice that after its
	// last renewal: wait until it has expired them all.
	expired := func() {
		for deadline := time.Now().Add(30 * time.Second); ; {
			sessions, _, err := outside.Session().List(nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(sessions) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d sessions still there 30s after the burst", len(sessions))
			}
			time.Sleep(200 * time.Millisecond) // wait out the sessions' TTLs
		}
	}
	for round, prefix := range []string{"fresh", "burst"} {
		expired()
		// Every lock held at once, taken one after the other: each
		// acquire meets the expired sessions left in the pool.
		leases := make([]*lock.Lease, 0, n)
		for i := range n {
			key := fmt.Sprintf("%s-%d", prefix, i)
			l, err := c.Acquire(ctx, key)
			if err != nil {
				t.Errorf("round %d: Acquire(%q) after the pooled sessions expired: %v", round, key, err)
				continue
			}
			leases = append(leases, l)
			if l.Fence() == 0 {
				t.Errorf("round %d: Acquire(%q) granted fence 0", round, key)
			}
			if ol, err := other.TryAcquire(ctx, key); !errors.Is(err, lock.ErrLocked) {
				if ol != nil {
					ol.Release(ctx)
				}
				t.Errorf("round %d: another client's TryAcquire(%q) while it is held: %v; want ErrLocked (two holders)", round, key, err)
			}
		}
		for _, l := range leases {
			if err := l.Release(ctx); err != nil {
				t.Errorf("round %d: Release(%q): %v", round, l.Key(), err)
			}
		}
		if t.Failed() {
			return
		}
	}
}
