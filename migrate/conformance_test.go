package migrate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/memory"
	"github.com/distlock/lock/migrate"
)

// pairHarness gives the suite phase 2 or 3 over two memory stores: each
// backend is a pair of the stores' clients, and each hook acts on both
// (a network fault between a process and its stores, a store paused or
// restarted as a whole: both, which is what the fault runs can do to a
// process that uses both).
type pairHarness struct {
	from, to *memory.Store
	phase    migrate.Phase
}

var (
	_ conformance.Pauser       = pairHarness{}
	_ conformance.Disconnecter = pairHarness{}
	_ conformance.Restarter    = pairHarness{}
	_ conformance.ReplyHolder  = pairHarness{}
	_ conformance.Evicter      = pairHarness{}
)

func (h pairHarness) NewBackend(context.Context) (backend.Backend, error) {
	b, _, err := migrate.Config{From: h.from.NewBackend(), To: h.to.NewBackend(), Phase: h.phase}.Backend()
	return b, err
}

func (h pairHarness) Capabilities() backend.Capabilities {
	b, err := h.NewBackend(context.Background())
	if err != nil {
		panic(err)
	}
	defer b.Close()
	return b.(backend.Describer).Capabilities()
}

// each applies f to both clients of b.
func each(b backend.Backend, f func(*memory.Backend)) error {
	from, to, ok := migrate.Stores(b)
	if !ok {
		return fmt.Errorf("backend %T is not a phase 2 or 3 backend", b)
	}
	f(from.(*memory.Backend))
	f(to.(*memory.Backend))
	return nil
}

func (h pairHarness) Pause(context.Context) error  { h.from.Pause(); h.to.Pause(); return nil }
func (h pairHarness) Resume(context.Context) error { h.from.Resume(); h.to.Resume(); return nil }
func (h pairHarness) Disconnect(_ context.Context, b backend.Backend) error {
	return each(b, (*memory.Backend).Disconnect)
}
func (h pairHarness) Reconnect(_ context.Context, b backend.Backend) error {
	return each(b, (*memory.Backend).Reconnect)
}
func (h pairHarness) HoldReplies(_ context.Context, b backend.Backend) error {
	return each(b, (*memory.Backend).HoldReplies)
}
func (h pairHarness) DeliverReplies(_ context.Context, b backend.Backend) error {
	return each(b, (*memory.Backend).DeliverReplies)
}
func (h pairHarness) DropReplies(_ context.Context, b backend.Backend) error {
	return each(b, (*memory.Backend).DropReplies)
}

// Evict drops the lock from both stores, as their expiry would.
func (h pairHarness) Evict(_ context.Context, key string) error {
	h.from.Evict(key)
	h.to.Evict(key)
	return nil
}

func (h pairHarness) Restart(_ context.Context, keepData bool) error {
	mode := memory.LoseData
	if keepData {
		mode = memory.KeepData
	}
	h.from.Restart(mode)
	h.to.Restart(mode)
	return nil
}

// harnessMaxTTL is the stores' maximum TTL, raised from
// memory.DefaultMaxTTL: above every TTL the suite uses (ManyKeys takes
// 2m).
const harnessMaxTTL = 10 * time.Minute

func newPair(t *testing.T, phase migrate.Phase) conformance.Harness {
	h := pairHarness{from: memory.NewStore(memory.WithMaxTTL(harnessMaxTTL)), to: memory.NewStore(memory.WithMaxTTL(harnessMaxTTL)), phase: phase}
	t.Cleanup(func() {
		for _, s := range []*memory.Store{h.from, h.to} {
			if n := s.Watchers(); n != 0 {
				t.Errorf("%d watches left open after the case; want 0", n)
			}
		}
	})
	return h
}

// TestConformance runs the suite over phases 2 and 3 on two memory
// stores, under virtual time, with every hook.
func TestConformance(t *testing.T) {
	for _, phase := range []migrate.Phase{migrate.BothFromFences, migrate.BothToFences} {
		t.Run(fmt.Sprintf("phase%d", phase), func(t *testing.T) {
			conformance.Run(t, func(t *testing.T) conformance.Harness { return newPair(t, phase) },
				conformance.RequireHooks(), conformance.VirtualTime())
		})
	}
}

// TestFaultRuns makes the seeded fault runs over phases 2 and 3 on two
// memory stores, under virtual time.
func TestFaultRuns(t *testing.T) {
	for _, phase := range []migrate.Phase{migrate.BothFromFences, migrate.BothToFences} {
		t.Run(fmt.Sprintf("phase%d", phase), func(t *testing.T) {
			conformance.RunFaults(t, func(t *testing.T) conformance.Harness { return newPair(t, phase) },
				conformance.FaultVirtualTime(), conformance.FaultRuns(20))
		})
	}
}
