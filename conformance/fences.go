package conformance

import (
	"sync"
	"testing"

	"github.com/distlock/lock"
)

func (s *suite) fencesSequential(t *testing.T) {
	const n = 1000
	ctx := s.ctx(t)
	key := s.key(t)
	c := s.client(t, lock.WithTTL(s.long))
	var prev uint64
	for i := 0; i < n; i++ {
		l, err := c.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("acquisition %d: %v", i, err)
		}
		f := l.Fence()
		if f == 0 || f <= prev {
			t.Fatalf("acquisition %d: fence %d after %d; want > 0 and strictly increasing", i, f, prev)
		}
		prev = f
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
}

func (s *suite) fencesContended(t *testing.T) {
	const contenders, rounds = 4, 250
	ctx := s.ctx(t)
	key := s.key(t)
	clients := s.clients(t, contenders)
	rec := s.newRecorder()
	var (
		mu     sync.Mutex
		fences []uint64
		wg     sync.WaitGroup
	)
	for i, c := range clients {
		wg.Go(func() {
			for r := 0; r < rounds; r++ {
				l, err := rec.acquire(ctx, i, c, key, true, s.long)
				if err != nil {
					t.Errorf("contender %d, round %d: Acquire: %v", i, r, err)
					return
				}
				mu.Lock()
				fences = append(fences, l.Fence())
				mu.Unlock()
				if err := rec.release(ctx, i, l); err != nil {
					t.Errorf("contender %d: Release: %v", i, err)
				}
			}
		})
	}
	wg.Wait()
	if len(fences) != contenders*rounds {
		t.Errorf("%d acquisitions; want %d", len(fences), contenders*rounds)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] || fences[i-1] == 0 {
			t.Errorf("holder %d got fence %d after holder %d got %d; want > 0 and strictly increasing in holding order", i, fences[i], i-1, fences[i-1])
			break
		}
	}
	s.checkHistory(t, rec)
}

func (s *suite) fenceAfterRestart(t *testing.T) {
	r, ok := s.h.(Restarter)
	if !ok {
		t.Skip("the harness offers no Restarter")
	}
	if !s.caps.DurableFence {
		t.Log("the backend declares its fences not durable across restarts: nothing to check")
		return
	}
	ctx := s.ctx(t)
	key := s.key(t)
	c := s.client(t, lock.WithTTL(s.long))
	var last uint64
	for i := 0; i < 5; i++ {
		l, err := c.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		last = l.Fence()
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	if err := r.Restart(ctx, true); err != nil {
		t.Fatalf("harness Restart: %v", err)
	}
	l, err := s.client(t).Acquire(ctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("Acquire after restart: %v", err)
	}
	if l.Fence() <= last {
		t.Errorf("fence %d after a restart that kept data; %d before: want strictly increasing", l.Fence(), last)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}
