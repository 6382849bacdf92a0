package memory_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/distlock/lock"
	"github.com/distlock/lock/memory"
)

func newBenchClient(b *testing.B) *lock.Client {
	b.Helper()
	c, err := lock.New(memory.New())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// cycle takes key (waiting for it when wait is set) and releases it.
func cycle(ctx context.Context, c *lock.Client, key string, wait bool) error {
	var l *lock.Lease
	var err error
	if wait {
		l, err = c.Acquire(ctx, key)
	} else {
		l, err = c.TryAcquire(ctx, key)
	}
	if err != nil {
		return err
	}
	return l.Release(ctx)
}

func reportCycles(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

// One goroutine: TryAcquire then Release of one key, auto-renew on (the
// default).
func BenchmarkAcquireRelease(b *testing.B) {
	c := newBenchClient(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := cycle(ctx, c, "bench", false); err != nil {
			b.Fatal(err)
		}
	}
	reportCycles(b)
}

// BenchmarkObserverCost runs BenchmarkAcquireRelease's cycle on a
// client without an observer ("plain") and on one with an observer that
// does nothing ("observed", lock.WithObserver), in alternating rounds of
// one process, so that the machine's drift falls on both alike: the cost
// of the events themselves is the ratio of the two.
func BenchmarkObserverCost(b *testing.B) {
	plain := newBenchClient(b)
	observed, err := lock.New(memory.New(), lock.WithObserver(lock.ObserverFunc(func(context.Context, lock.Event) {})))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { observed.Close() })
	ctx := context.Background()
	for round := range 8 {
		for _, r := range []struct {
			name string
			c    *lock.Client
		}{{"plain", plain}, {"observed", observed}} {
			b.Run(fmt.Sprintf("%s/%d", r.name, round), func(b *testing.B) {
				for b.Loop() {
					if err := cycle(ctx, r.c, "bench", false); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// 32 goroutines, each on its own key.
func BenchmarkAcquireReleaseParallel32OwnKeys(b *testing.B) {
	c := newBenchClient(b)
	ctx := context.Background()
	var id atomic.Int64
	b.SetParallelism(max(1, 32/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprintf("bench/%d", id.Add(1))
		for pb.Next() {
			if err := cycle(ctx, c, key, false); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportCycles(b)
}

// 16 goroutines on one key, each waiting for it with Acquire.
func BenchmarkAcquireReleaseHotKey16(b *testing.B) {
	c := newBenchClient(b)
	ctx := context.Background()
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := cycle(ctx, c, "hot", true); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportCycles(b)
}
