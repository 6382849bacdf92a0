// Package conformance is the test suite every backend of package lock runs
// against itself, including backends written outside this module. It drives
// the backend through package lock, the way applications use it, against a
// real store, and checks every promise of package lock's documentation:
// mutual exclusion between clients and between goroutines of one client,
// token-checked renew and release, expiry and takeover bounds, fence
// monotonicity, context cancellation, the lost-lock signal, many keys without
// leaks, bad input, and a recorded history checked with a lease-lock model.
// A backend that implements backend.Transferer also runs the Transfer case,
// which checks that contract on the store directly.
//
// A backend's whole test wiring is one small test:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, func(t *testing.T) conformance.Harness {
//			return newHarness(t) // starts or connects to a store
//		})
//	}
//
// Cases are subtests, so `go test -run 'TestConformance/Fences'` picks some.
// The suite derives every wait from the TTL bounds the harness declares.
package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
)

// Harness gives the suite access to one store.
type Harness interface {
	// NewBackend returns a new, independent client of the store: its own
	// connection or session, as a separate process would have. The suite
	// closes it.
	NewBackend(ctx context.Context) (backend.Backend, error)
	// Capabilities declares what the store guarantees. The suite trusts
	// these declarations (not the backend's own Describer) to derive its
	// TTLs and waits: MinTTL, Granularity, the latest expiry, DurableFence.
	Capabilities() backend.Capabilities
}

// Pauser is an optional Harness hook: the whole store stops answering (a
// SIGSTOP, for a server process) until Resume.
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// Disconnecter is an optional Harness hook: one client is cut off from the
// store (its requests vanish, as behind a partition) until Reconnect. b is a
// backend the harness returned from NewBackend.
type Disconnecter interface {
	Disconnect(ctx context.Context, b backend.Backend) error
	Reconnect(ctx context.Context, b backend.Backend) error
}

// ReplyHolder is an optional Harness hook for replies lost or late after
// the store acted: the store keeps receiving and acting on b's requests,
// while the replies to them are held (HoldReplies) until DeliverReplies
// delivers them, in order, or DropReplies loses them (b's connections are
// reset, as when a reply packet is lost and the connection fails; the
// client library may then send the request again). b is a backend the
// harness returned from NewBackend.
type ReplyHolder interface {
	HoldReplies(ctx context.Context, b backend.Backend) error
	DeliverReplies(ctx context.Context, b backend.Backend) error
	DropReplies(ctx context.Context, b backend.Backend) error
}

// Restarter is an optional Harness hook: the store restarts, keeping its data
// (in its documented durable configuration) or losing it. Clients returned
// before may need to reconnect; backends are expected to do that on their
// own.
type Restarter interface {
	Restart(ctx context.Context, keepData bool) error
}

// Run runs the whole suite against the store newHarness gives. newHarness is
// called once; every case uses its own keys, and the cases that fault the
// store (pause, restart) run last.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	h := newHarness(t)
	if h == nil {
		t.Fatal("conformance: newHarness returned nil")
	}
	s := newSuite(t, h)
	cases := []struct {
		name string
		run  func(*testing.T)
	}{
		{"BadInput", s.badInput},
		{"TryAcquireRace", s.tryAcquireRace},
		{"MutualExclusion", s.mutualExclusion},
		{"SharedClient", s.sharedClient},
		{"FencesSequential", s.fencesSequential},
		{"FencesContended", s.fencesContended},
		{"StaleOwner", s.staleOwner},
		{"ExpiryNotEarly", s.expiryNotEarly},
		{"TokenExact", s.tokenExact},
		{"ReleaseAfterExpiry", s.releaseAfterExpiry},
		{"WakeOnRelease", s.wakeOnRelease},
		{"InspectAfterExpiry", s.inspectAfterExpiry},
		{"FenceAfterIdle", s.fenceAfterIdle},
		{"RenewAfterLoss", s.renewAfterLoss},
		{"Takeover", s.takeover},
		{"CancelWhileWaiting", s.cancelWhileWaiting},
		{"ManyKeys", s.manyKeys},
		{"LostSignal", s.lostSignal},
		{"LostSignalWhileRenewalsHang", s.lostSignalWhileRenewalsHang},
		{"DeadlineWithinStore", s.deadlineWithinStore},
		{"RetriedAcquire", s.retriedAcquire},
		{"CancelUnderLoad", s.cancelUnderLoad},
		{"ReplyLost", s.replyLost},
		{"CancelWhileStoreHangs", s.cancelWhileStoreHangs},
		{"FenceAfterRestart", s.fenceAfterRestart},
	}
	if s.transfers(t) {
		// Only for stores that can pass a lock between owners.
		cases = append(cases[:1], append([]struct {
			name string
			run  func(*testing.T)
		}{{"Transfer", s.transfer}}, cases[1:]...)...)
	}
	for _, c := range cases {
		t.Run(c.name, c.run)
	}
}

// timeouts of the suite, generous because CI machines are slow and -race
// slows everything down; they bound hangs, not performance.
const (
	caseTimeout = 2 * time.Minute
	checkBudget = 30 * time.Second // for the history checker
)
