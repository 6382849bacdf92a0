package lock

import (
	"container/heap"
	"sync"
	"time"

	"github.com/distlock/lock/clock"
)

// scheduler runs the timers of many leases on one clock timer: a min-heap of
// leases by the time they next need attention (a renewal or the deadline).
// Scheduling a lease costs a heap insertion and no clock read in the common
// case, where the timer is already set to fire no later than the new lease
// is due; a lease released before it is due just leaves the heap. When the
// timer fires, every due lease runs its tick in its own goroutine, and the
// timer is set again for the earliest lease left. No goroutine lives between
// firings.
type scheduler struct {
	clock clock.Clock

	mu      sync.Mutex
	leases  leaseHeap
	timer   clock.Timer
	armedAt time.Time // when the timer fires; zero when it is not set
}

func newScheduler(c clock.Clock) *scheduler { return &scheduler{clock: c} }

// schedule makes the scheduler call l.tick at due (or soon after).
func (s *scheduler) schedule(l *Lease, due time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l.due = due
	if l.index >= 0 {
		heap.Fix(&s.leases, int(l.index))
	} else {
		heap.Push(&s.leases, l)
	}
	if s.armedAt.IsZero() || due.Before(s.armedAt) {
		s.armLocked(due)
	}
}

// cancel removes l from the scheduler.
func (s *scheduler) cancel(l *Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.index >= 0 {
		heap.Remove(&s.leases, int(l.index))
	}
}

func (s *scheduler) armLocked(at time.Time) {
	s.armedAt = at
	d := s.clock.Until(at)
	if s.timer == nil {
		s.timer = s.clock.AfterFunc(d, s.fire)
	} else {
		s.timer.Reset(d)
	}
}

func (s *scheduler) fire() {
	s.mu.Lock()
	s.armedAt = time.Time{}
	var due []*Lease
	for len(s.leases) > 0 && s.clock.Until(s.leases[0].due) <= 0 {
		due = append(due, heap.Pop(&s.leases).(*Lease))
	}
	if len(s.leases) > 0 {
		s.armLocked(s.leases[0].due)
	}
	s.mu.Unlock()

	// Deadlines first, here, for every due lease: a tick never waits for
	// the network, so a lost signal is never delayed behind renewals.
	var renew []*Lease
	for _, l := range due {
		if l.tick() {
			renew = append(renew, l)
		}
	}
	// Then the renewals, concurrently (a renewal is a network call), at
	// most maxConcurrentTicks requests at once per Client, so that
	// thousands of leases falling due together do not flood the store
	// (renewbatch.go). The leases are already scheduled again for their
	// deadlines, which later firings check while renewals hang.
	renewDue(renew)
}

// maxConcurrentTicks bounds the automatic renewal requests a Client runs at once
// (Client.renewSlots). The bound is per Client, not per process: it spares
// the Client's store a flood, and one Client whose store hangs, holding all
// of its slots, never delays the renewals of another Client, on another
// store or the same one.
const maxConcurrentTicks = 64

type leaseHeap []*Lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = int32(i)
	h[j].index = int32(j)
}

func (h *leaseHeap) Push(x any) {
	l := x.(*Lease)
	l.index = int32(len(*h))
	*h = append(*h, l)
}

func (h *leaseHeap) Pop() any {
	old := *h
	n := len(old)
	l := old[n-1]
	old[n-1] = nil
	l.index = -1
	*h = old[:n-1]
	return l
}
