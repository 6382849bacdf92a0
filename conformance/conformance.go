package conformance

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/fence"
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
// store, as behind a partition that drops packets, until Reconnect: every
// byte between them is held in both directions, on the client's open
// connections and on new ones, and nothing is closed; Reconnect delivers
// what was held, in order, as TCP would once the partition heals. b is a
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

// Delayer is an optional Harness hook: every byte between b and the store
// arrives d late, in order, both ways, until Undelay (bytes already on
// their way keep their delay). b is a backend the harness returned from
// NewBackend.
type Delayer interface {
	Delay(ctx context.Context, b backend.Backend, d time.Duration) error
	Undelay(ctx context.Context, b backend.Backend) error
}

// ConnResetter is an optional Harness hook: b's open connections to the
// store are reset at once (an RST both ways, whatever was on its way is
// lost); new connections work. b is a backend the harness returned from
// NewBackend.
type ConnResetter interface {
	ResetConns(ctx context.Context, b backend.Backend) error
}

// Restarter is an optional Harness hook: the store restarts, keeping its data
// (in its documented durable configuration) or losing it. Clients returned
// before may need to reconnect; backends are expected to do that on their
// own.
type Restarter interface {
	Restart(ctx context.Context, keepData bool) error
}

// Evicter is an optional Harness hook: the store loses the lock on key as
// its own expiry or an eviction would (a key evicted under memory
// pressure, a write lost in a failover), with no release: the holder's
// token stays alive, so that its next renewal finds the key free, and an
// Acquire with that token could take the key again. (A release from
// outside, as StoreLosesLock sends, kills the token.) The store's other
// state (fence counters, waiters) stays as an expiry leaves it.
type Evicter interface {
	Evict(ctx context.Context, key string) error
}

// SQLResourcer is an optional Harness hook: a SQL database in which the
// fault runs keep a second fenced resource, a fence.Table (created there,
// named lock_conformance_fences) written through Apply in transactions of
// its own, beside the in-memory fence.Guard every run checks. db must take
// concurrent transactions (a SQLite database needs _txlock=immediate and a
// busy timeout); the suite does not close it. The suite imports no SQL
// driver: the harness brings its own.
type SQLResourcer interface {
	SQLResource(t *testing.T) (db *sql.DB, dialect fence.Dialect)
}

// ClientOptioner is an optional Harness hook: client options for lock.New
// over a backend the harness returned from NewBackend (b), such as the
// fence epoch of a backend that takes part in a move between stores
// (lock.WithFenceEpoch, package migrate). The suite adds its own options
// after them.
type ClientOptioner interface {
	ClientOptions(b backend.Backend) []lock.Option
}

// Option configures a run of the suite.
type Option func(*runOptions)

type runOptions struct {
	requireHooks bool
	virtual      bool
}

// VirtualTime runs every case in a bubble of its own (testing/synctest),
// where time is virtual: it moves only while every goroutine of the case
// is durably blocked, so waiting out a TTL costs no wall time and every
// bound the suite checks holds on an exact clock. newHarness is then
// called in each case's bubble, with the case's t (and once more, in a
// bubble of its own, for the checks that precede the cases), so that the
// store, its servers, connections and timers belong to the bubble; its
// Capabilities must be the same every time.
//
// It is for harnesses whose store runs in the test process and whose
// clients block only where synctest sees it (channels, timers, sync.Cond,
// net.Pipe connections made in the bubble): the memory store, or a
// networked store over in-memory connections. A store in another process,
// real sockets (a TCP Accept or Read does not block durably: virtual time
// would stop), SIGSTOP and helper processes need real time: leave the
// option out for them.
func VirtualTime() Option { return func(o *runOptions) { o.virtual = true } }

// inBubble runs f in a bubble of its own when virtual is set, and in t's
// goroutine otherwise. A case skipped in the bubble is skipped in t too.
func inBubble(t *testing.T, virtual bool, f func(t *testing.T)) {
	t.Helper()
	if !virtual {
		f(t)
		return
	}
	var inner *testing.T
	synctest.Test(t, func(t *testing.T) {
		inner = t
		f(t)
	})
	// A failure in the bubble has ended t already (synctest.Test calls
	// FailNow); a skip must be passed on.
	if inner != nil && inner.Skipped() {
		t.SkipNow()
	}
}

// RequireHooks makes a run fail when a case is skipped for want of a harness
// hook or a backend interface, instead of passing with the case skipped:
// for a harness that means to offer every hook.
func RequireHooks() Option { return func(o *runOptions) { o.requireHooks = true } }

// Run runs the whole suite against the store newHarness gives. newHarness is
// called once (once per case, with VirtualTime); every case uses its own
// keys, and the cases that fault the store (pause, restart) run last. Cases
// that need a hook the harness does not offer are skipped; Run then prints
// which, also without -v (go test shows it when run in a package's
// directory, or with -v), and fails with RequireHooks.
func Run(t *testing.T, newHarness func(t *testing.T) Harness, opts ...Option) {
	t.Helper()
	var o runOptions
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	var transfers bool
	s := suiteOf(t, o.virtual, newHarness, func(t *testing.T, s *suite) {
		s.checkDeclarations(t)
		transfers = s.transfers(t)
	})
	type kase struct {
		name string
		run  func(*suite, *testing.T)
		// subs names the subtests the case runs with suite.subtest:
		// under VirtualTime each runs in a bubble of its own.
		subs []string
		// realTime: the case runs in real time under VirtualTime too,
		// with a harness of its own.
		realTime bool
	}
	cases := []kase{
		{"BadInput", (*suite).badInput, nil, false},
		{"TryAcquireRace", (*suite).tryAcquireRace, nil, false},
		{"MutualExclusion", (*suite).mutualExclusion, nil, false},
		{"SharedClient", (*suite).sharedClient, nil, false},
		{"FencesSequential", (*suite).fencesSequential, nil, false},
		{"FencesContended", (*suite).fencesContended, nil, false},
		{"StaleOwner", (*suite).staleOwner, []string{"RenewAfterExpiry", "RenewAfterSuccessor", "ReleaseAfterSuccessor"}, false},
		{"ExpiryNotEarly", (*suite).expiryNotEarly, nil, false},
		{"TokenExact", (*suite).tokenExact, nil, false},
		{"KeyShapes", (*suite).keyShapes, nil, false},
		{"ReleaseAfterExpiry", (*suite).releaseAfterExpiry, nil, false},
		{"WakeOnRelease", (*suite).wakeOnRelease, nil, false},
		{"WatchBeforeRelease", (*suite).watchBeforeRelease, nil, false},
		{"HandoverTTLs", (*suite).handoverTTLs, nil, false},
		{"WaiterTTLShorterThanWait", (*suite).waiterTTLShorterThanWait, nil, false},
		{"CancelledWaiterRetakes", (*suite).cancelledWaiterRetakes, nil, false},
		{"FIFOOrder", (*suite).fifoOrder, nil, false},
		{"HotKeyRequests", (*suite).hotKeyRequests, nil, false},
		{"InspectAfterExpiry", (*suite).inspectAfterExpiry, nil, false},
		{"HolderLabel", (*suite).holderLabel, nil, false},
		{"FenceAfterIdle", (*suite).fenceAfterIdle, nil, false},
		{"TokenShape", (*suite).tokenShape, nil, false},
		{"SeveralTTLs", (*suite).severalTTLs, nil, false},
		{"DeadlineFromSend", (*suite).deadlineFromSend, nil, false},
		{"StoreLosesLock", (*suite).storeLosesLock, nil, false},
		{"LockEvicted", (*suite).lockEvicted, nil, false},
		{"CancelInQueue", (*suite).cancelInQueue, nil, false},
		{"RenewAfterLoss", (*suite).renewAfterLoss, nil, false},
		{"Extend", (*suite).extend, nil, false},
		{"Takeover", (*suite).takeover, nil, false},
		{"CancelWhileWaiting", (*suite).cancelWhileWaiting, nil, false},
		{"ManyKeys", (*suite).manyKeys, nil, false},
		{"LostSignal", (*suite).lostSignal, nil, false},
		{"LostSignalWhileRenewalsHang", (*suite).lostSignalWhileRenewalsHang, nil, false},
		{"DeadlineWithinStore", (*suite).deadlineWithinStore, nil, false},
		{"RetriedAcquire", (*suite).retriedAcquire, nil, false},
		{"DeadTokens", (*suite).deadTokens, nil, false},
		// Its load is 16 goroutines that acquire and cancel for a second
		// of the clock without ever blocking for long: under virtual
		// time the clock would not move while they spin, and their 0-3ms
		// timeouts would never race the acquires they cancel.
		{"CancelUnderLoad", (*suite).cancelUnderLoad, nil, true},
		{"ReplyLost", (*suite).replyLost, []string{"ReleaseReplyDropped", "ReleaseReplyLate"}, false},
		{"ReleaseSentAgain", (*suite).releaseSentAgain, nil, false},
		{"CancelWhileStoreHangs", (*suite).cancelWhileStoreHangs, nil, false},
		{"GiveUpUnderLoad", (*suite).giveUpUnderLoad, nil, false},
		{"IdleResourcesExpire", (*suite).idleResourcesExpire, nil, false},
		{"LockFreedOutside", (*suite).lockFreedOutside, nil, false},
		{"FenceAfterRestart", (*suite).fenceAfterRestart, nil, false},
	}
	if transfers {
		// Only for stores that can pass a lock between owners.
		cases = append(cases[:1], append([]kase{{"Transfer", (*suite).transfer, nil, false}, {"HandoverFails", (*suite).handoverFails, nil, false}, {"HandoverLostOnTheWay", (*suite).handoverLostOnTheWay, nil, false}}, cases[1:]...)...)
	}
	var skipped []string
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if t.Skipped() {
					skipped = append(skipped, c.name)
				}
			}()
			if !o.virtual {
				c.run(s, t)
				return
			}
			if c.realTime {
				cs := s.over(t, newHarness(t))
				cs.virtual = false
				c.run(cs, t)
				return
			}
			if len(c.subs) == 0 {
				inBubble(t, true, func(t *testing.T) { c.run(s.over(t, newHarness(t)), t) })
				return
			}
			// t.Run cannot be called in a bubble: each subtest runs
			// the case again, in a bubble of its own, doing only that
			// subtest. A case all of whose subtests skip is skipped.
			all := true
			for _, sub := range c.subs {
				t.Run(sub, func(t *testing.T) {
					defer func() {
						if !t.Skipped() {
							all = false
						}
					}()
					inBubble(t, true, func(t *testing.T) {
						cs := s.over(t, newHarness(t))
						cs.only = sub
						c.run(cs, t)
						if !cs.ranOnly {
							t.Fatalf("conformance: case %s ran no subtest %s", c.name, sub)
						}
					})
				})
			}
			if all {
				t.SkipNow()
			}
		})
	}
	if len(skipped) > 0 {
		msg := fmt.Sprintf("conformance: %d of %d cases skipped for want of a harness hook or backend interface: %s", len(skipped), len(cases), strings.Join(skipped, ", "))
		fmt.Println(msg)
		if o.requireHooks {
			t.Error(msg + " (RequireHooks)")
		} else {
			t.Log(msg)
		}
	}
}

// timeouts of the suite, generous because CI machines are slow and -race
// slows everything down; they bound hangs, not performance.
const (
	caseTimeout = 2 * time.Minute
	// manyKeysTimeout bounds ManyKeys, whose 30,000 requests can take
	// longer on a store that fsyncs every write.
	manyKeysTimeout = 6 * time.Minute
	checkBudget     = 30 * time.Second // for the history checker
)

// suiteOf makes the suite over the harness newHarness returns, in a
// synctest bubble when virtual, and runs more (if not nil) on it in the
// same bubble.
func suiteOf(t *testing.T, virtual bool, newHarness func(t *testing.T) Harness, more func(t *testing.T, s *suite)) *suite {
	var s *suite
	inBubble(t, virtual, func(t *testing.T) {
		h := newHarness(t)
		if h == nil {
			t.Fatal("conformance: newHarness returned nil")
		}
		s = newSuite(t, h)
		s.virtual = virtual
		if more != nil {
			more(t, s)
		}
	})
	return s
}
