package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/lock"
)

// bench: lockctl bench [--backend URL] [--duration D]
func (e *environment) bench(ctx context.Context, args []string) int {
	fs := newFlags("bench", "[--backend URL | --backend-file PATH] [--duration D]")
	bf := addBackendFlags(fs, "mem://", "")
	duration := fs.Duration("duration", 2*time.Second, "length of each scenario, at most a year")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if code, ok := e.noArgs(fs); !ok {
		return code
	}
	if *duration == 0 {
		return e.usageError("bench", "--duration must be more than 0, such as 2s")
	}
	url, code, ok := e.backend(bf)
	if !ok {
		return code
	}
	locks, code := e.open(ctx, "bench", url, lock.WithTTL(10*time.Second))
	if locks == nil {
		return code
	}
	defer locks.Close()
	prefix := fmt.Sprintf("lockctl-bench/%d/", time.Now().UnixNano())
	// A backend that cannot be reached fails here, in one line, not as
	// scenarios of zero cycles.
	if err := probe(ctx, locks, prefix+"probe"); err != nil {
		e.printf(e.stderr, "lockctl bench: backend %s: %v\n", lock.RedactURL(url), err)
		return exitBackend
	}

	e.printf(e.stdout, "Backend: %s, %v per scenario, GOMAXPROCS %d\n\n", lock.RedactURL(url), *duration, runtime.GOMAXPROCS(0))
	fmt.Fprintf(e.stdout, "%-40s %12s %10s %10s %10s\n", "scenario", "cycles/s", "p50", "p90", "p99")
	scenarios := []struct {
		name    string
		workers int
		hot     bool
	}{
		{"one goroutine, acquire+release", 1, false},
		{"32 goroutines, own keys", 32, false},
		{"16 goroutines, one key, 1ms hold", 16, true},
	}
	for _, sc := range scenarios {
		r, err := measure(ctx, locks, prefix+sc.name, sc.workers, sc.hot, *duration)
		if err != nil {
			e.printf(e.stderr, "lockctl bench: %v\n", err)
			return exitBackend
		}
		line := fmt.Sprintf("%-40s %12.0f %10v %10v %10v", sc.name, r.rate, r.p50, r.p90, r.p99)
		if sc.hot {
			line += fmt.Sprintf("   utilisation %.1f%%", r.utilisation)
		}
		fmt.Fprintln(e.stdout, line)
	}
	fmt.Fprintf(e.stdout, "\nLatency is per acquire+release cycle (for the hot key: from asking for the lock to holding it).\n")
	return exitOK
}

type measurement struct {
	rate, utilisation float64
	p50, p90, p99     time.Duration
}

func measure(ctx context.Context, locks *lock.Client, key string, workers int, hot bool, d time.Duration) (measurement, error) {
	var (
		mu        sync.Mutex
		latencies []time.Duration
		firstErr  error
		cycles    atomic.Int64
		wg        sync.WaitGroup
	)
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	for w := 0; w < workers; w++ {
		k := key
		if !hot {
			k = fmt.Sprintf("%s/%d", key, w)
		}
		wg.Go(func() {
			var mine []time.Duration
			defer func() {
				mu.Lock()
				latencies = append(latencies, mine...)
				mu.Unlock()
			}()
			for rctx.Err() == nil {
				t0 := time.Now()
				var l *lock.Lease
				var err error
				if hot {
					l, err = locks.Acquire(rctx, k)
				} else {
					l, err = locks.TryAcquire(ctx, k)
				}
				if err != nil {
					if rctx.Err() == nil {
						mu.Lock()
						firstErr = err
						mu.Unlock()
					}
					return
				}
				if hot {
					mine = append(mine, time.Since(t0))
					t1 := time.Now()
					for time.Since(t1) < time.Millisecond {
						runtime.Gosched()
					}
				}
				if err := l.Release(ctx); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				if !hot {
					mine = append(mine, time.Since(t0))
				}
				cycles.Add(1)
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	if firstErr != nil {
		return measurement{}, firstErr
	}
	slices.Sort(latencies)
	pct := func(p float64) time.Duration {
		if len(latencies) == 0 {
			return 0
		}
		return latencies[int(p*float64(len(latencies)-1))].Round(time.Microsecond)
	}
	n := cycles.Load()
	return measurement{
		rate:        float64(n) / wall.Seconds(),
		utilisation: 100 * float64(n) * float64(time.Millisecond) / float64(wall),
		p50:         pct(0.50),
		p90:         pct(0.90),
		p99:         pct(0.99),
	}, nil
}
