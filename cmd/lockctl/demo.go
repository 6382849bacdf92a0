package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/flashsale"
)

// fencedFile keeps the highest fence it accepted and rejects lower ones.
type fencedFile struct {
	mu      sync.Mutex
	highest uint64
	content string
}

func (f *fencedFile) write(fence uint64, content string, checkFence bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if checkFence && fence < f.highest {
		return fmt.Errorf("stale fence %d (already saw %d)", fence, f.highest)
	}
	f.highest = max(f.highest, fence)
	f.content = content
	return nil
}

// maxBuyers bounds --buyers: each buyer is a goroutine.
const maxBuyers = 1000000

// demo: lockctl demo [--backend URL] [--buyers N] [--units N]
func (e *environment) demo(ctx context.Context, args []string) int {
	fs := newFlags("demo", "[--backend URL | --backend-file PATH] [--buyers N] [--units N]")
	bf := addBackendFlags(fs, "mem://lockctl-demo", "")
	buyers := fs.Int("buyers", 10000, "`N` buyers at once, at most 1000000")
	units := fs.Int("units", 100, "`N` units in stock")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if code, ok := e.noArgs(fs); !ok {
		return code
	}
	if *buyers < 1 || *units < 1 || *units > *buyers || *buyers > maxBuyers {
		return e.usageError("demo", "need 1 <= --units <= --buyers <= %d", maxBuyers)
	}
	url, code, ok := e.backend(bf)
	if !ok {
		return code
	}
	locks, code := e.open(ctx, "demo", url, lock.WithTTL(10*time.Second))
	if locks == nil {
		return code
	}
	defer locks.Close()
	var run [4]byte
	crand.Read(run[:])
	prefix := "lockctl-demo/" + hex.EncodeToString(run[:]) + "/"
	out := e.stdout
	if err := probe(ctx, locks, prefix+"probe"); err != nil {
		e.printf(e.stderr, "lockctl demo: backend %s: %v\n", lock.RedactURL(url), err)
		return exitBackend
	}

	e.printf(out, "Backend: %s\n\n", lock.RedactURL(url))
	fmt.Fprintf(out, "1. Flash sale: %d units, %d buyers at once. Each buyer reads the stock, and if\n   some is left, writes stock-1: two round trips to the store.\n", *units, *buyers)

	free := e.sale(*buyers, *units, func(inv *flashsale.Inventory, sold *atomic.Int64) error {
		inv.Buy(sold)
		return nil
	}, nil, nil)
	fmt.Fprintf(out, "   Without a lock: %d sold, oversold by %d.\n", free.sold, free.sold-int64(*units))

	start := time.Now()
	var served atomic.Int64
	progress := func() {
		fmt.Fprintf(out, "   with the lock: %d of %d buyers served (%v)\n", served.Load(), *buyers, time.Since(start).Round(time.Millisecond))
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	locked := e.sale(*buyers, *units, func(inv *flashsale.Inventory, sold *atomic.Int64) error {
		defer served.Add(1)
		return locks.Do(sctx, prefix+"stock", func(context.Context, *lock.Lease) error {
			inv.Buy(sold)
			return nil
		})
	}, progress, stop)
	if locked.err != nil {
		e.printf(e.stderr, "lockctl demo: %v\n", locked.err)
		return exitBackend
	}
	fmt.Fprintf(out, "   With the lock: %d sold, %d oversold, in %v.\n\n", locked.sold, locked.sold-int64(*units), locked.took.Round(time.Millisecond))

	fmt.Fprintf(out, "2. GC pause: A holds the lock and stalls (a long GC) past its TTL; B takes\n   over and writes; A wakes up, unaware, and writes too.\n")
	story, err := e.gcPause(ctx, locks, prefix+"file")
	if err != nil {
		e.printf(e.stderr, "lockctl demo: %v\n", err)
		return exitBackend
	}
	fmt.Fprint(out, story.narrative)

	fmt.Fprintf(out, "\nSummary\n")
	fmt.Fprintf(out, "  %-34s %s\n", "flash sale, no lock", fmt.Sprintf("%d sold of %d, oversold by %d", free.sold, *units, free.sold-int64(*units)))
	fmt.Fprintf(out, "  %-34s %s\n", "flash sale, with the lock", fmt.Sprintf("%d sold of %d, oversold by %d", locked.sold, *units, locked.sold-int64(*units)))
	fmt.Fprintf(out, "  %-34s %s\n", "GC pause, lock without fencing", story.unfenced)
	fmt.Fprintf(out, "  %-34s %s\n", "GC pause, lock with fencing", story.fenced)
	if locked.sold != int64(*units) || !story.ok {
		fmt.Fprintf(e.stderr, "lockctl demo: the lock did not protect the resource: this is a bug\n")
		return exitBackend
	}
	return exitOK
}

type saleResult struct {
	sold int64
	took time.Duration
	err  error
}

// probe takes and releases key once, within a few seconds: a backend that
// cannot be reached fails the demo at once instead of every buyer slowly.
func probe(ctx context.Context, locks *lock.Client, key string) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := locks.TryAcquire(pctx, key)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("did not answer within 5s: %w", err)
		}
		return err
	}
	return l.Release(pctx)
}

// sale runs every buyer at once; progress, if set, is called every second;
// failed, if set, is called at the first error (to stop the other buyers).
func (e *environment) sale(buyers, units int, buy func(*flashsale.Inventory, *atomic.Int64) error, progress, failed func()) saleResult {
	inv := flashsale.New(units)
	var sold atomic.Int64
	var firstErr error
	var errOnce sync.Once
	start := time.Now()
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < buyers; i++ {
		wg.Go(func() {
			<-gate
			if err := buy(inv, &sold); err != nil {
				errOnce.Do(func() {
					firstErr = err
					if failed != nil {
						failed()
					}
				})
			}
		})
	}
	done := make(chan struct{})
	if progress != nil {
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					progress()
				case <-done:
					return
				}
			}
		}()
	}
	close(gate)
	wg.Wait()
	close(done)
	return saleResult{sold: sold.Load(), took: time.Since(start), err: firstErr}
}

type gcStory struct {
	narrative, unfenced, fenced string
	ok                          bool
}

// gcPause plays the story twice on the same lock: once with a resource that
// ignores fences, once with one that checks them.
func (e *environment) gcPause(ctx context.Context, locks *lock.Client, key string) (gcStory, error) {
	// Short, so that the story takes a moment, but no shorter than the
	// backend accepts (etcd's and Consul's minimums are longer).
	ttl := max(300*time.Millisecond, locks.Capabilities().MinTTL)
	var s gcStory
	play := func(checkFence bool) (*fencedFile, uint64, uint64, error, error) {
		f := &fencedFile{}
		a, err := locks.TryAcquire(ctx, key, lock.WithTTL(ttl), lock.WithAutoRenew(false))
		if err != nil {
			return nil, 0, 0, nil, err
		}
		<-a.Done() // A stalls past its lease (no renewal while paused)
		// The store may keep A's lock past its TTL (Consul up to twice,
		// then its lock-delay): B waits for it.
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second+4*ttl)
		defer cancel()
		b, err := locks.Acquire(bctx, key)
		if err != nil {
			return nil, 0, 0, nil, err
		}
		defer b.Release(ctx)
		bErr := f.write(b.Fence(), "written by B", checkFence)
		if bErr != nil {
			return nil, 0, 0, nil, bErr
		}
		aErr := f.write(a.Fence(), "written by A after its pause", checkFence)
		return f, a.Fence(), b.Fence(), aErr, nil
	}
	f1, fa, fb, aErr, err := play(false)
	if err != nil {
		return s, err
	}
	s.narrative += fmt.Sprintf("   A got fence %d, paused; B got fence %d after A's TTL and wrote.\n", fa, fb)
	s.narrative += fmt.Sprintf("   Without fencing the file now says %q: A's stale write won.\n", f1.content)
	s.unfenced = fmt.Sprintf("stale write by A accepted: file says %q", f1.content)
	f2, fa, fb, aErr, err := play(true)
	if err != nil {
		return s, err
	}
	if aErr == nil {
		s.fenced = "stale write by A accepted (bug)"
		return s, errors.New("the fenced resource accepted a stale write")
	}
	s.narrative += fmt.Sprintf("   With fencing the file rejects A (%v) and keeps %q.\n", aErr, f2.content)
	s.fenced = fmt.Sprintf("stale write by A (fence %d) rejected; B's (fence %d) kept", fa, fb)
	s.ok = f2.content == "written by B"
	return s, nil
}
