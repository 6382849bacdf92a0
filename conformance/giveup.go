package conformance

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// LinkDelayer is an optional Harness hook for a client that reaches the
// store over more than one link (the endpoints of several members, or
// several connections to one member): DelayOneLink makes one of b's links
// deliver every byte d late, both ways, and leaves the others alone, until
// Undelay (of Delayer). Requests that b sends on its fast links then
// overtake those on the slow one, as across the members of a cluster when
// one of them sits behind a slow network. faultproxy.Hooks implements it
// for a backend registered with several proxies.
type LinkDelayer interface {
	Delayer
	DelayOneLink(ctx context.Context, b backend.Backend, d time.Duration) error
}

// giveUpUnderLoad: waiters give up after a few milliseconds on busy keys,
// while their clients take, hold and release keys of their own, and the
// other clients try to take those. Links to the store are slow
// (LinkDelayer: one link of every client; else Delayer: all of client 0's;
// else
// none; see LinkDelayer). So attempts end while on their way, their undo (a release, a
// waiter leaving the queue) races the client's next requests, and requests
// overtake each other. The keys of their own are checked against the
// lease-lock model: a lock freed under its holder by the late undo of an
// earlier attempt, or by the reuse of a resource (a session, a lease) that
// such an undo still acts on, shows as a second holder. The busy keys must
// never have two holders at once either.
func (s *suite) giveUpUnderLoad(t *testing.T) {
	ctx := s.ctx(t)
	const clients = 4
	duration := 8 * time.Second
	backends := make([]backend.Backend, clients)
	cs := make([]*lock.Client, clients)
	own := make([]string, clients)
	for i := range cs {
		backends[i] = s.backend(t)
		// Sections are far shorter than the TTL: no renewals, so the
		// model knows every lease's expiry.
		cs[i] = s.clientOver(t, backends[i], lock.WithAutoRenew(false))
		own[i] = s.key(t)
	}
	busy := []string{s.key(t), s.key(t)}
	delay := 50 * time.Millisecond
	if ld, ok := s.h.(LinkDelayer); ok {
		// One slow link on every client, as when one member of a
		// cluster sits behind a slow network.
		for _, b := range backends {
			if err := ld.DelayOneLink(ctx, unguarded(b), delay); err != nil {
				t.Fatalf("DelayOneLink: %v", err)
			}
			defer ld.Undelay(context.Background(), unguarded(b))
		}
		t.Logf("one link of every client delayed %v each way (all of a client that has one)", delay)
	} else if dl, ok := s.h.(Delayer); ok {
		if err := dl.Delay(ctx, unguarded(backends[0]), delay); err != nil {
			t.Fatalf("Delay: %v", err)
		}
		defer dl.Undelay(context.Background(), unguarded(backends[0]))
		t.Logf("client 0's link delayed %v each way (the harness has no LinkDelayer)", delay)
	}

	rec := s.newRecorder()
	end := time.Now().Add(duration)
	var (
		wg        sync.WaitGroup
		holders   [2]atomic.Int32
		most      atomic.Int32
		gaveUp    atomic.Int64
		sections  atomic.Int64
		ownCycles atomic.Int64
	)
	// A client that takes the busy keys without waiting for them, so that
	// its releases free them instead of handing them to a waiter (its
	// backend does not follow them): the waiter at the head then takes the
	// key with an attempt of its own, which may be on its way when the
	// waiter gives up.
	hog := s.client(t, lock.WithAutoRenew(false))
	for k := range busy {
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				l, err := hog.TryAcquire(ctx, busy[k], lock.WithTTL(s.long))
				if err == nil {
					n := holders[k].Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(10*time.Millisecond + rand.N(30*time.Millisecond)) // the section
					holders[k].Add(-1)
					sections.Add(1)
					if err := l.Release(ctx); errors.Is(err, lock.ErrNotHeld) {
						t.Errorf("the store freed a busy key under its holder, %v before the lease's deadline: %v", time.Until(l.Deadline()), err)
					}
				} else if !errors.Is(err, lock.ErrLocked) {
					t.Errorf("TryAcquire of a busy key: %v", err)
					return
				}
				time.Sleep(rand.N(5 * time.Millisecond)) // between sections
			}
		})
	}
	for i, c := range cs {
		// Waiters on the busy keys that give up after 2-120ms.
		for range 2 {
			wg.Go(func() {
				for time.Now().Before(end) && ctx.Err() == nil {
					k := rand.N(len(busy))
					wctx, cancel := context.WithTimeout(ctx, 2*time.Millisecond+rand.N(118*time.Millisecond))
					l, err := c.Acquire(wctx, busy[k], lock.WithTTL(s.long))
					cancel()
					if err != nil {
						if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, lock.ErrLocked) {
							t.Errorf("client %d: Acquire of a busy key: %v", i, err)
							return
						}
						gaveUp.Add(1)
						continue
					}
					n := holders[k].Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(5*time.Millisecond + rand.N(25*time.Millisecond)) // the section
					holders[k].Add(-1)
					sections.Add(1)
					if err := l.Release(ctx); errors.Is(err, lock.ErrNotHeld) {
						t.Errorf("client %d: the store freed a busy key under its holder, %v before the lease's deadline: %v", i, time.Until(l.Deadline()), err)
					}
				}
			})
		}
		// The client's own key: taken, held 20-200ms, released.
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				l, err := rec.acquire(ctx, i, c, own[i], false, s.long)
				if err == nil {
					ownCycles.Add(1)
					time.Sleep(20*time.Millisecond + rand.N(180*time.Millisecond)) // the section
					rec.release(ctx, i, l)
				} else if !errors.Is(err, lock.ErrLocked) {
					t.Errorf("client %d: TryAcquire of its own key: %v", i, err)
					return
				}
				time.Sleep(rand.N(10 * time.Millisecond)) // between sections
			}
		})
		// A prober of the other clients' own keys.
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				j := (i + 1 + rand.N(clients-1)) % clients
				l, err := rec.acquire(ctx, i, c, own[j], false, s.long)
				if err == nil {
					rec.release(ctx, i, l)
				} else if !errors.Is(err, lock.ErrLocked) {
					t.Errorf("client %d: TryAcquire of client %d's key: %v", i, j, err)
					return
				}
				time.Sleep(20 * time.Millisecond) // between probes
			}
		})
	}
	wg.Wait()
	t.Logf("%d busy-key sections, %d acquires given up, %d sections on own keys", sections.Load(), gaveUp.Load(), ownCycles.Load())
	if m := most.Load(); m > 1 {
		t.Errorf("up to %d holders of a busy key at once; want at most 1", m)
	}
	if gaveUp.Load() == 0 || sections.Load() == 0 {
		t.Errorf("no waiter gave up, or none got a busy key: the case tested nothing")
	}
	s.checkHistory(t, rec)
}
