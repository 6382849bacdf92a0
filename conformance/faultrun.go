package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/fence"
)

// Randomized fault runs: contenders take and release locks on a few keys
// (some in helper processes of their own, see ProcessContenders) while a
// seeded schedule injects one fault every 1 to 5 seconds, drawn from the
// hooks the harness offers: the store paused shorter and longer than the
// TTL, restarted keeping its data (for stores whose fences are durable),
// one client cut off, one client's traffic delayed by a fifth of the TTL
// each way, one client's connections reset, replies held after the store
// acted and then delivered late or dropped, a helper process stopped for
// twice the TTL. Then the faults heal and the run is checked:
//
//   - the validity intervals of the holders of one key never overlap on this
//     process's monotonic clock (an interval runs from Acquire's return to
//     the earlier of the lease's deadline and the call of Release);
//   - the fenced resources (fence.Guard in memory, and, with the harness
//     hook SQLResourcer, a fence.Table in the harness's SQL database,
//     written through Apply in transactions) never refuse
//     the write of a lease that is still valid: that would mean that a
//     holder with a higher fence wrote while the lease was valid, or that
//     fences went backwards;
//   - every lost signal (Done closing with ErrLost) fires no later than the
//     lease's deadline plus the suite's scheduling slack;
//   - the porcupine check of the history against the lease-lock model.
//
// A run's seed is printed; a failing run writes its fault schedule, its
// violations and its history (every acquire, renew and release with its
// times and outcome) to a file (the path is printed) and is replayed with
// LOCK_FAULT_SEED=seed (the schedule repeats; the timing of the contenders
// does not). LOCK_FAULT_RUNS sets the number of runs (say 100 on demand),
// LOCK_FAULT_DURATION the length of each.

// FaultOption configures RunFaults.
type FaultOption func(*faultOptions)

type faultOptions struct {
	runs       int
	duration   time.Duration
	contenders int
	processes  int
	keys       int
	flaw       string // FaultFlaw
	virtual    bool   // FaultVirtualTime
}

// FaultRuns sets how many seeded runs RunFaults makes (default 5;
// LOCK_FAULT_RUNS overrides it).
func FaultRuns(n int) FaultOption { return func(o *faultOptions) { o.runs = n } }

// FaultDuration sets the length of each run before the faults heal
// (default 10s; LOCK_FAULT_DURATION overrides it).
func FaultDuration(d time.Duration) FaultOption { return func(o *faultOptions) { o.duration = d } }

// FaultKeys sets how many keys the contenders share (default 2).
func FaultKeys(n int) FaultOption { return func(o *faultOptions) { o.keys = n } }

// FaultProcesses sets how many more contenders run in helper processes of
// their own, when the harness implements ProcessContenders (default 2).
func FaultProcesses(n int) FaultOption { return func(o *faultOptions) { o.processes = n } }

// FaultContenders sets how many clients contend, each with a backend of its
// own (default 4).
func FaultContenders(n int) FaultOption { return func(o *faultOptions) { o.contenders = n } }

// FaultVirtualTime makes RunFaults make each run in a bubble of its own
// (testing/synctest), as VirtualTime does for Run: the run's seconds of
// sections, faults and waits pass in virtual time, at no wall-clock cost,
// and the run's checks (overlaps, the lost signal's deadline) hold on an
// exact clock. newHarness is called in each run's bubble (and once more,
// in a bubble of its own, before the runs), so that the store and its
// connections belong to the bubble. For harnesses whose store and
// connections live in the test process (see VirtualTime); not with
// ProcessContenders, whose helper processes run in real time.
func FaultVirtualTime() FaultOption { return func(o *faultOptions) { o.virtual = true } }

func faultOptionsOf(opts []FaultOption) (faultOptions, error) {
	o := faultOptions{runs: 5, duration: 10 * time.Second, contenders: 4, processes: 2, keys: 2}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if v := os.Getenv("LOCK_FAULT_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return o, fmt.Errorf("LOCK_FAULT_RUNS=%q: want a count of 1 or more", v)
		}
		o.runs = n
	}
	if v := os.Getenv("LOCK_FAULT_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return o, fmt.Errorf("LOCK_FAULT_DURATION=%q: want a positive Go duration such as 10s", v)
		}
		o.duration = d
	}
	if err := checkFlaw(o.flaw); err != nil {
		return o, err
	}
	if o.runs < 1 || o.duration <= 0 || o.contenders < 2 || o.keys < 1 || o.processes < 0 {
		return o, fmt.Errorf("fault runs: %d runs of %v with %d contenders (%d more in helper processes) on %d keys; want at least 1 run, a positive duration, 2 contenders, no negative count of processes and 1 key", o.runs, o.duration, o.contenders, o.processes, o.keys)
	}
	return o, nil
}

// RunFaults makes seeded randomized fault runs against the store newHarness
// gives (see the comment above FaultOption), each a subtest named by its
// seed, and fails each run that finds a violation.
func RunFaults(t *testing.T, newHarness func(t *testing.T) Harness, opts ...FaultOption) {
	t.Helper()
	o, err := faultOptionsOf(opts)
	if err != nil {
		t.Fatal(err)
	}
	s := suiteOf(t, o.virtual, newHarness, nil)
	seeds := make([]uint64, o.runs)
	for i := range seeds {
		seeds[i] = rand.Uint64() >> 1
	}
	if v := os.Getenv("LOCK_FAULT_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("LOCK_FAULT_SEED=%q: want a seed printed by an earlier run", v)
		}
		seeds = []uint64{seed}
	}
	for _, seed := range seeds {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			inBubble(t, o.virtual, func(t *testing.T) {
				rs := s
				if o.virtual {
					rs = s.over(t, newHarness(t))
				}
				r := rs.faultRun(t, seed, o)
				t.Logf("seed %d: %s", seed, r.summary())
				if len(r.violations) > 0 {
					path := r.save(t, seed)
					t.Errorf("seed %d: %d violations (replay: LOCK_FAULT_SEED=%d; schedule and violations in %s):\n%s", seed, len(r.violations), seed, path, strings.Join(r.violations, "\n"))
				}
			})
		})
	}
}

// FaultRun makes one seeded fault run against h and returns the violations
// it found: for negative controls, which run a store with a known flaw and
// require the runs to find it. To make the run in virtual time, call it
// in a bubble (synctest.Test) with h made in that bubble, and give
// FaultVirtualTime.
func FaultRun(t *testing.T, h Harness, seed uint64, opts ...FaultOption) []string {
	t.Helper()
	o, err := faultOptionsOf(opts)
	if err != nil {
		t.Fatal(err)
	}
	s := newSuite(t, h)
	s.virtual = o.virtual
	return s.faultRun(t, seed, o).violations
}

// faultResult is what a run saw.
type faultResult struct {
	faults     []string
	violations []string
	history    []string // the operations, saved when the run fails
	sections   int
	lost       int
	errs       int
	helpers    int // helper processes whose reports were merged
	// epochRefused counts writes of valid leases that a fenced resource
	// refused because it had accepted a fence of a newer epoch (see
	// olderEpoch): expected while a move between stores changes epochs.
	epochRefused int
}

// epochWrites keeps, per key, the newest fence epoch a fenced resource of
// the run accepted, to tell a refusal for an older epoch (see olderEpoch)
// from a refusal of a valid lease.
type epochWrites struct {
	mu      sync.Mutex
	newest  map[string]uint64
	refused atomic.Int64
}

func (e *epochWrites) accepted(key string, f uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.newest[key] = max(e.newest[key], f>>lock.FenceEpochShift)
}

// refusedForEpoch reports, for a refused write with fence f, whether a
// fence of a newer epoch was accepted for key before; it counts it.
func (e *epochWrites) refusedForEpoch(key string, f uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f>>lock.FenceEpochShift < e.newest[key] {
		e.refused.Add(1)
		return true
	}
	return false
}

func (r *faultResult) summary() string {
	epochs := ""
	if r.epochRefused > 0 {
		epochs = fmt.Sprintf(", %d writes of valid leases refused for a fence of an older epoch", r.epochRefused)
	}
	return fmt.Sprintf("%d helper processes, %d sections, %d leases lost, %d acquires or releases returned errors (releases of lost leases included)%s, %d faults [%s], %d violations", r.helpers, r.sections, r.lost, r.errs, epochs, len(r.faults), strings.Join(r.faults, "; "), len(r.violations))
}

func (r *faultResult) save(t *testing.T, seed uint64) string {
	dir := filepath.Join(os.TempDir(), "lock-faultruns")
	path := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".txt") // the name ends in the seed
	text := fmt.Sprintf("%s\nseed %d\nfaults:\n  %s\nviolations:\n  %s\nhistory:\n  %s\n", t.Name(), seed, strings.Join(r.faults, "\n  "), strings.Join(r.violations, "\n  "), strings.Join(r.history, "\n  "))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "(not saved: " + err.Error() + ")"
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return "(not saved: " + err.Error() + ")"
	}
	return path
}

// interval is one holder's validity on one key.
type interval struct {
	client      int
	fence       uint64
	start, end  time.Time
	startOffset time.Duration
}

func (s *suite) faultRun(t *testing.T, seed uint64, o faultOptions) *faultResult {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ttl := s.short
	begin := time.Now()
	at := func() string { return time.Since(begin).Round(time.Millisecond).String() }
	res := &faultResult{}
	var mu sync.Mutex
	violate := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(res.violations) < 50 {
			res.violations = append(res.violations, at()+": "+fmt.Sprintf(format, args...))
		}
	}

	keys := make([]string, o.keys)
	for i := range keys {
		keys[i] = s.key(t)
	}
	backends := make([]backend.Backend, o.contenders)
	clients := make([]*lock.Client, o.contenders)
	flaws := newFlawState()
	for i := range clients {
		backends[i] = s.backend(t)
		b := backends[i]
		if o.flaw != "" {
			b = withFlaw(b, o.flaw, flaws)
		}
		clients[i] = s.clientOver(t, b, lock.WithTTL(ttl))
	}
	rec := s.newRecorder()
	var guard fence.Guard
	var sqlRes *sqlResource
	if sr, ok := s.h.(SQLResourcer); ok {
		sqlRes = newSQLResource(t, sr)
	}
	intervals := map[string][]interval{}
	epochs := &epochWrites{newest: map[string]uint64{}}
	defer func() { res.epochRefused = int(epochs.refused.Load()) }()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	// Helper processes, when the store can be reached from them.
	var helpers []*helper
	if pc, ok := s.h.(ProcessContenders); ok && o.processes > 0 && o.flaw == "" {
		if o.virtual {
			t.Fatal("conformance: FaultVirtualTime with a harness that has ProcessContenders: helper processes run in real time; leave FaultVirtualTime out, or set FaultProcesses(0)")
		}
		url, err := pc.ContenderURL(ctx)
		if err != nil {
			t.Fatalf("harness ContenderURL: %v", err)
		}
		for k := range o.processes {
			h, err := startHelper(contenderConfig{URL: url, Keys: keys, TTL: ttl, Client: o.contenders + k, Seed1: rng.Uint64(), Seed2: rng.Uint64()})
			if err != nil {
				t.Fatal(err)
			}
			defer h.kill()
			helpers = append(helpers, h)
		}
	}

	var wg sync.WaitGroup
	for i, c := range clients {
		crng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		ct := &contender{client: i, c: c, keys: keys, ttl: ttl, rec: rec, rng: crng,
			write: func(key string, l *lock.Lease) {
				err := guard.Do(key, l.Fence(), l.Token(), func() error { return nil })
				if err == nil {
					epochs.accepted(key, l.Fence())
				}
				if errors.Is(err, fence.ErrStale) && time.Now().Before(l.Deadline()) && l.Err() == nil && !epochs.refusedForEpoch(key, l.Fence()) {
					violate("client %d: a fenced resource refused fence %d of a lease of %q that is still valid: a holder with a higher fence wrote while this lease was valid (two valid leases at once), or fences went backwards (%v)", i, l.Fence(), key, err)
				}
				if sqlRes == nil {
					return
				}
				err = sqlRes.write(key, l.Fence(), l.Token())
				switch {
				case errors.Is(err, fence.ErrStale):
					if time.Now().Before(l.Deadline()) && l.Err() == nil && !epochs.refusedForEpoch(key, l.Fence()) {
						violate("client %d: the SQL fenced resource refused fence %d of a lease of %q that is still valid (%v)", i, l.Fence(), key, err)
					}
				case err != nil:
					violate("client %d: the SQL fenced resource failed: %v", i, err)
				}
			},
			failed: func() {
				if ctx.Err() == nil {
					mu.Lock()
					res.errs++
					mu.Unlock()
				}
			},
			done: func(sec section) {
				mu.Lock()
				defer mu.Unlock()
				res.sections++
				if sec.relErr != nil {
					res.errs++
				}
				l := sec.l
				if errors.Is(l.Err(), lock.ErrLost) {
					res.lost++
					if late := sec.closed.Sub(l.Deadline()); late > s.slack && sec.closed.Before(sec.end) {
						// Done closed after the deadline by more
						// than the slack while the section was
						// still running.
						res.violations = append(res.violations, fmt.Sprintf("%s: client %d: the lost signal of %q fired %v after the deadline", at(), i, sec.key, late.Round(time.Millisecond)))
					}
				}
				intervals[sec.key] = append(intervals[sec.key], interval{client: i, fence: l.Fence(), start: sec.start, end: sec.end, startOffset: sec.start.Sub(begin)})
			},
		}
		wg.Go(func() { ct.run(ctx) })
	}

	// The fault schedule.
	faults := s.faultMenu(backends, ttl)
	if len(helpers) > 0 {
		faults = append(faults, fault{name: "a helper process stopped (SIGSTOP)", durations: []time.Duration{2 * ttl}, start: func(target int) (func(), error) {
			h := helpers[target%len(helpers)]
			h.signal(syscall.SIGSTOP)
			return func() { h.signal(syscall.SIGCONT) }, nil
		}})
	}
	deadline := begin.Add(o.duration)
	var heal []func()
	for len(faults) > 0 {
		wait := time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))
		if time.Now().Add(wait).After(deadline) {
			break
		}
		time.Sleep(wait) // the schedule's own pace, not synchronisation
		f := faults[rng.IntN(len(faults))]
		d := f.durations[rng.IntN(len(f.durations))]
		target := rng.IntN(len(backends))
		name := f.name
		if f.perClient {
			name += fmt.Sprintf(" client %d", target)
		}
		res.faults = append(res.faults, fmt.Sprintf("%s %s for %v", at(), name, d))
		undo, err := f.start(target)
		if err != nil {
			violate("fault %s: the harness failed: %v", name, err)
			continue
		}
		heal = append(heal, undo)
		time.Sleep(d) // the fault lasts d
		undo()
		heal = heal[:len(heal)-1]
	}
	if rest := time.Until(deadline); rest > 0 {
		time.Sleep(rest)
	}
	for _, undo := range heal {
		undo()
	}
	stop()
	wg.Wait()
	for _, h := range helpers {
		rep, err := h.finish(5*ttl + 10*time.Second)
		if err != nil {
			res.violations = append(res.violations, err.Error())
			continue
		}
		rec.merge(h.client, rep, intervals)
		res.sections += len(rep.Sections)
		res.lost += rep.Lost
		res.errs += rep.Errs
		res.helpers++
	}

	for key, ivs := range intervals {
		slices.SortFunc(ivs, func(a, b interval) int { return a.start.Compare(b.start) })
		for i := range ivs {
			for j := i + 1; j < len(ivs) && ivs[j].start.Before(ivs[i].end); j++ {
				if ivs[j].end.After(ivs[j].start) && ivs[i].end.After(ivs[i].start) {
					res.violations = append(res.violations, fmt.Sprintf("overlap on %q: client %d (fence %d) valid from %v for %v, client %d (fence %d) from %v", key, ivs[i].client, ivs[i].fence, ivs[i].startOffset.Round(time.Millisecond), ivs[i].end.Sub(ivs[i].start).Round(time.Millisecond), ivs[j].client, ivs[j].fence, ivs[j].startOffset.Round(time.Millisecond)))
				}
			}
		}
	}
	if err := rec.check(checkBudget); err != nil {
		res.violations = append(res.violations, "history: "+err.Error())
	}
	if len(res.violations) > 0 {
		res.history = rec.lines()
	}
	return res
}

// contender takes and releases locks on keys until ctx ends, recording
// every operation; in this process, or in a helper process of its own
// (see MaybeContend).
type contender struct {
	client int
	c      *lock.Client
	keys   []string
	ttl    time.Duration
	rec    *recorder
	rng    *rand.Rand
	write  func(key string, l *lock.Lease) // a guarded write in the section, or nil
	failed func()                          // an acquire that returned an error
	done   func(section)                   // a section that ended
}

// section is one lease from its acquire to its release.
type section struct {
	key        string
	l          *lock.Lease
	start, end time.Time // the lease's validity: Acquire's return to the earlier of its deadline and Release's call
	closed     time.Time // when Done closed
	relErr     error
}

func (ct *contender) run(ctx context.Context) {
	ttl, crng := ct.ttl, ct.rng
	for ctx.Err() == nil {
		key := ct.keys[crng.IntN(len(ct.keys))]
		// Sections of three kinds: renewed automatically and up to
		// twice the TTL; not renewed and within the TTL; not renewed
		// and overrunning it (the lease is lost, and released after).
		var opts []lock.Option
		var hold time.Duration
		switch crng.IntN(4) {
		case 0, 1:
			hold = time.Duration(crng.Int64N(int64(2 * ttl)))
		case 2:
			opts = append(opts, lock.WithAutoRenew(false))
			hold = time.Duration(crng.Int64N(int64(ttl * 9 / 10)))
		case 3:
			opts = append(opts, lock.WithAutoRenew(false))
			hold = ttl + time.Duration(crng.Int64N(int64(ttl/2)))
		}
		// A third of the attempts do not wait: a key freed early is
		// then taken at once.
		wait := crng.IntN(3) > 0
		actx, cancel := context.WithTimeout(ctx, 3*ttl)
		l, err := ct.rec.acquire(actx, ct.client, ct.c, key, wait, ttl, opts...)
		cancel()
		if !wait && errors.Is(err, lock.ErrLocked) {
			sleepCtx(ctx, time.Duration(crng.Int64N(int64(ttl/10)))) // the caller's own pace
			continue
		}
		if err != nil {
			ct.failed()
			continue
		}
		start := time.Now()
		signal := make(chan time.Time, 1)
		go func() { <-l.Done(); signal <- time.Now() }()
		// The section: a guarded write, some work, another.
		if ct.write != nil {
			ct.write(key, l)
		}
		sleepCtx(ctx, hold)
		if ct.write != nil {
			ct.write(key, l)
		}
		end := time.Now()
		if dl := l.Deadline(); dl.Before(end) {
			end = dl
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 3*ttl)
		err = ct.rec.release(rctx, ct.client, l)
		rcancel()
		ct.done(section{key: key, l: l, start: start, end: end, closed: <-signal, relErr: err})
	}
}

// sqlResource is the SQL fenced resource of a fault run: a fence.Table in
// the harness's database (SQLResourcer) whose writes go through Apply in
// their own transactions, beside the in-memory fence.Guard: the same rule,
// kept by a database.
type sqlResource struct {
	db    *sql.DB
	table *fence.Table
}

// sqlTable is the fence table of the fault runs in the harness's database.
const sqlTable = "lock_conformance_fences"

func newSQLResource(t *testing.T, sr SQLResourcer) *sqlResource {
	t.Helper()
	db, dialect := sr.SQLResource(t)
	table, err := fence.NewTable(dialect, sqlTable)
	if err != nil {
		t.Fatalf("fault runs: the harness's SQL resource: %v", err)
	}
	if err := table.Create(context.Background(), db); err != nil {
		t.Fatalf("fault runs: the harness's SQL resource: creating the fence table: %v", err)
	}
	return &sqlResource{db: db, table: table}
}

// write applies a write with fence f for holder to resource, in a
// transaction of its own, and returns fence.ErrStale when the table
// refused it.
func (r *sqlResource) write(resource string, f uint64, holder string) error {
	ctx := context.Background()
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := r.table.Apply(ctx, tx, resource, f, holder); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// sleepCtx sleeps for d or until ctx ends: a section's simulated work.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// A fault the harness can inject: start it for client target (ignored
// unless perClient) and get the function that heals it.
type fault struct {
	name      string
	perClient bool
	durations []time.Duration
	start     func(target int) (heal func(), err error)
}

// faultMenu lists the faults the harness's hooks allow.
func (s *suite) faultMenu(backends []backend.Backend, ttl time.Duration) []fault {
	ctx := context.Background()
	shortLong := []time.Duration{ttl / 2, 2 * ttl}
	var out []fault
	if p, ok := s.h.(Pauser); ok {
		out = append(out, fault{name: "store paused", durations: shortLong, start: func(int) (func(), error) {
			if err := p.Pause(ctx); err != nil {
				return func() {}, err
			}
			return func() { p.Resume(ctx) }, nil
		}})
	}
	if dl, ok := s.h.(Delayer); ok {
		out = append(out, fault{name: fmt.Sprintf("latency %v each way", ttl/5), perClient: true, durations: shortLong, start: func(i int) (func(), error) {
			if err := dl.Delay(ctx, unguarded(backends[i]), ttl/5); err != nil {
				return func() {}, err
			}
			return func() { dl.Undelay(ctx, unguarded(backends[i])) }, nil
		}})
	}
	if cr, ok := s.h.(ConnResetter); ok {
		out = append(out, fault{name: "connections reset", perClient: true, durations: []time.Duration{0}, start: func(i int) (func(), error) {
			return func() {}, cr.ResetConns(ctx, unguarded(backends[i]))
		}})
	}
	if r, ok := s.h.(Restarter); ok && s.caps.DurableFence {
		out = append(out, fault{name: "store restarted keeping its data", durations: []time.Duration{0}, start: func(int) (func(), error) {
			return func() {}, r.Restart(ctx, true)
		}})
	}
	if d, ok := s.h.(Disconnecter); ok {
		out = append(out, fault{name: "cut off", perClient: true, durations: shortLong, start: func(i int) (func(), error) {
			if err := d.Disconnect(ctx, unguarded(backends[i])); err != nil {
				return func() {}, err
			}
			return func() { d.Reconnect(ctx, unguarded(backends[i])) }, nil
		}})
	}
	if rh, ok := s.h.(ReplyHolder); ok {
		for _, drop := range []bool{false, true} {
			name := "replies held, then delivered late"
			if drop {
				name = "replies held, then dropped"
			}
			out = append(out, fault{name: name, perClient: true, durations: shortLong, start: func(i int) (func(), error) {
				b := unguarded(backends[i])
				if err := rh.HoldReplies(ctx, b); err != nil {
					return func() {}, err
				}
				return func() {
					if drop {
						rh.DropReplies(ctx, b)
					} else {
						rh.DeliverReplies(ctx, b)
					}
				}, nil
			}})
		}
	}
	return out
}
