package conformance

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

func (s *suite) manyKeys(t *testing.T) {
	const n, workers = 10000, 8
	// 30,000 requests, 20,000 of them writes that a Raft store fsyncs: on
	// a slow disk shared with other test packages that outlasts the
	// other cases' bound. The case is about leftovers, not speed.
	ctx, cancel := context.WithTimeout(context.Background(), manyKeysTimeout)
	defer cancel()
	before := goroutines()
	// A TTL no acquisition phase outlasts: this case is about leftovers,
	// not about renewing 10,000 leases at once.
	c := s.client(t, lock.WithTTL(max(s.long, 2*time.Minute)))
	prefix := s.key(t)
	leases := make([]*lock.Lease, n)
	parallel := func(f func(i int) error) {
		var wg sync.WaitGroup
		var failures atomic.Int64
		for w := 0; w < workers; w++ {
			wg.Go(func() {
				for i := w; i < n; i += workers {
					if err := f(i); err != nil && failures.Add(1) <= 5 {
						t.Errorf("key %d: %v", i, err)
					}
				}
			})
		}
		wg.Wait()
		if f := failures.Load(); f > 0 {
			t.Fatalf("%d of %d keys failed", f, n)
		}
	}
	parallel(func(i int) (err error) {
		leases[i], err = c.TryAcquire(ctx, fmt.Sprintf("%s/%d", prefix, i))
		return err
	})
	parallel(func(i int) error { return leases[i].Release(ctx) })

	in, inspect := c.Backend().(backend.Inspector)
	parallel(func(i int) error {
		key := fmt.Sprintf("%s/%d", prefix, i)
		if inspect {
			h, err := in.Inspect(ctx, key)
			if err == nil && h.Held {
				err = fmt.Errorf("still held after release: %+v", h)
			}
			return err
		}
		l, err := c.TryAcquire(ctx, key)
		if err != nil {
			return fmt.Errorf("not free after release: %w", err)
		}
		return l.Release(ctx)
	})

	// Released leases and a closed client leave no goroutines of this
	// module behind (a connection pool may keep some while the client is
	// open). Poll: goroutines of finished work exit asynchronously.
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		leaked := newGoroutines(before)
		if len(leaked) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d goroutines of the lock or its backend left after acquiring and releasing %d keys and closing the client:\n%s", len(leaked), n, strings.Join(leaked, "\n\n"))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}
