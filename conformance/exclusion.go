package conformance

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/distlock/lock"
)

func (s *suite) tryAcquireRace(t *testing.T) {
	const contenders, rounds = 8, 30
	ctx := s.ctx(t)
	clients := s.clients(t, contenders)
	rec := s.newRecorder()
	for r := 0; r < rounds; r++ {
		key := s.key(t)
		start := make(chan struct{})
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []*lock.Lease
			owners  []int
		)
		for i, c := range clients {
			wg.Go(func() {
				<-start
				l, err := rec.acquire(ctx, i, c, key, false, s.long)
				switch {
				case err == nil:
					mu.Lock()
					winners = append(winners, l)
					owners = append(owners, i)
					mu.Unlock()
				case !errors.Is(err, lock.ErrLocked):
					t.Errorf("round %d: TryAcquire: %v; want success or ErrLocked", r, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(winners) != 1 {
			t.Errorf("round %d: %d of %d concurrent TryAcquire calls won; want exactly 1", r, len(winners), contenders)
		}
		for i, l := range winners {
			if err := rec.release(ctx, owners[i], l); err != nil && len(winners) == 1 {
				t.Errorf("round %d: Release: %v", r, err)
			}
		}
	}
	s.checkHistory(t, rec)
}

func (s *suite) mutualExclusion(t *testing.T) {
	const contenders, rounds = 8, 20
	clients := s.clients(t, contenders)
	fences, most := s.contend(t, contenders, rounds, func(i int) *lock.Client { return clients[i] })
	if most != 1 {
		t.Errorf("up to %d holders at once; want at most 1", most)
	}
	if n := len(fences); n != contenders*rounds {
		t.Errorf("%d critical sections completed; want %d (every contender gets the lock every time)", n, contenders*rounds)
	}
}

// sharedClient: goroutines of one client contend for one key, as the
// handlers of one service do; package lock may queue them in the process and
// hand the lock from one to the next.
func (s *suite) sharedClient(t *testing.T) {
	const goroutines, rounds = 8, 25
	c := s.client(t)
	fences, most := s.contend(t, goroutines, rounds, func(int) *lock.Client { return c })
	if most != 1 {
		t.Errorf("up to %d holders at once among goroutines of one client; want at most 1", most)
	}
	if len(fences) != goroutines*rounds {
		t.Errorf("%d acquisitions; want %d", len(fences), goroutines*rounds)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Errorf("fence %d after %d in holding order; want strictly increasing", fences[i], fences[i-1])
			break
		}
	}
}

// contend runs contenders goroutines, each taking one key rounds times
// through clientOf(its index) with Acquire, holding it for a yield, and
// releasing it. It returns the fences in the order the sections ran and the
// most holders seen at once, and checks the recorded history.
func (s *suite) contend(t *testing.T, contenders, rounds int, clientOf func(int) *lock.Client) (fences []uint64, most int32) {
	ctx := s.ctx(t)
	key := s.key(t)
	rec := s.newRecorder()
	var (
		active, maxActive atomic.Int32
		mu                sync.Mutex
		wg                sync.WaitGroup
	)
	for i := 0; i < contenders; i++ {
		c := clientOf(i)
		wg.Go(func() {
			for r := 0; r < rounds; r++ {
				l, err := rec.acquire(ctx, i, c, key, true, s.long)
				if err != nil {
					t.Errorf("contender %d, round %d: Acquire: %v", i, r, err)
					return
				}
				n := active.Add(1)
				for {
					m := maxActive.Load()
					if n <= m || maxActive.CompareAndSwap(m, n) {
						break
					}
				}
				mu.Lock()
				fences = append(fences, l.Fence())
				mu.Unlock()
				runtime.Gosched() // give an overlapping holder the chance to show
				if err := l.Err(); err != nil {
					t.Errorf("contender %d: lease lost inside a short section: %v", i, err)
				}
				active.Add(-1)
				if err := rec.release(ctx, i, l); err != nil {
					t.Errorf("contender %d: Release: %v", i, err)
				}
			}
		})
	}
	wg.Wait()
	s.checkHistory(t, rec)
	return fences, maxActive.Load()
}
