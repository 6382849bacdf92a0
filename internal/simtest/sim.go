// Package simtest is a deterministic simulation harness for package lock:
// the library's real code (clients, leases, watchdog, per-client queue,
// handover, cleanups) runs inside a testing/synctest bubble, on its virtual
// clock, against a model of a store (see Model): the memory store with a
// seeded simulated network between each client and the store (see Conn),
// or another backend's real code over a network of its own (package
// simredis: the Redis backend and its Lua scripts); every run is checked
// (see check.go).
//
// The faults: per request (while the faulty phase lasts), a request lost,
// a reply lost after the store acted, a request applied twice, a request or
// a reply delayed by a quarter of the TTL to over two TTLs (past the
// caller's context: the store acts after the caller gave up), and always a
// latency of its own, so requests overtake each other; wake-ups delayed;
// timed, a partition of one client, a store pause, a store restart keeping
// its data; per client, a clock drifting within package lock's allowance
// (1% fast or slow); in the workload, holders that stall past their TTL
// without looking at the lease, and acquires given up while waiting or
// while their request is on its way.
//
// Run must be called inside a synctest bubble (synctest.Test): the harness
// sleeps on the virtual clock, so a run of minutes of simulated time costs
// milliseconds. The tests in this package drive it; see sim_test.go for the
// flags that replay one seed or run many.
//
// What a seed decides: the timed faults (partitions, store pauses and
// restarts, with their virtual times), the request timeout, each worker's
// choices (keys, kinds of sections, hold times, patience), and per client,
// operation and key, the stream of request fates (latencies, losses,
// duplicates, delays). What it does not decide: the order in which
// goroutines runnable at the same virtual instant run (the race detector
// shuffles the run queue, and select picks among ready cases at random),
// and package lock's own jitter (math/rand/v2's global source, which
// cannot be seeded). So a replay repeats the timed schedule exactly
// (TestSimReplay checks it), but the interleaving, and with it which
// request draws which fate, diverges within the first simulated seconds;
// replaying a failing seed runs it several times (-simtries), and the
// failing run's own fault log is printed with its violations.
package simtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/clock"
	"github.com/distlock/lock/fence"
)

// Config is one simulated run.
type Config struct {
	Seed    uint64
	Clients int           // lock.Clients, each over a connection of its own (default: 2 to 4, drawn)
	Workers int           // goroutines per client (default: 1 to 4, drawn)
	Keys    int           // keys they share (default: 1 to 3, drawn)
	TTL     time.Duration // lease TTL (default 1s)
	// Faulty is how long the phase with faults lasts (default 30 TTLs);
	// a phase without faults follows, where every waiter must be served
	// and nothing may be left behind.
	Faulty time.Duration
	// ClockRate, if set, is the rate of every client's clock against true
	// time (negative controls: a drift beyond the allowance). Otherwise
	// each client's clock is true, or drifts within the allowance, as
	// the seed draws.
	ClockRate float64
	// Hoard is how many leases one worker of client 0 holds at once,
	// auto-renewed, on keys of its own, while the faults last: more than
	// package lock renews at once, so that hanging renewals queue up while
	// the client's other leases reach their deadlines (default: drawn,
	// 70 in one run of three, none otherwise; negative: none).
	Hoard int
	// Model is the store and network of the run (default: the memory
	// model, NewMemory(Wrap)).
	Model NewModel
	// Wrap, if set and Model is not, wraps each connection of the
	// memory model before package lock gets it: for negative controls,
	// which break the backend contract on purpose and require the
	// checkers to notice.
	Wrap func(Backend) Backend
}

// defaults fills in what c leaves zero; the shape of the run (clients,
// workers, keys) is drawn from the seed.
func (c *Config) defaults(r *rand.Rand) {
	clients, workers, keys := 2+r.IntN(3), 1+r.IntN(4), 1+r.IntN(3)
	if r.IntN(2) == 0 {
		// Half the runs on one key, with two to four goroutines per
		// client: handovers and transfers between them, where the
		// subtlest histories were.
		keys, workers = 1, 2+r.IntN(3)
	}
	if c.Clients <= 0 {
		c.Clients = clients
	}
	if c.Workers <= 0 {
		c.Workers = workers
	}
	if c.Keys <= 0 {
		c.Keys = keys
	}
	if c.TTL <= 0 {
		c.TTL = time.Second
	}
	if c.Faulty <= 0 {
		c.Faulty = 30 * c.TTL
	}
	if hoard := r.IntN(3) == 0; c.Hoard == 0 && hoard {
		c.Hoard = 70
	}
}

// Result is what a run saw.
type Result struct {
	Seed     uint64
	Sections int // critical sections: leases granted and used
	Lost     int // leases lost before their release
	// DeadOnArrival counts leases Acquire returned after their deadline
	// had passed (the grant's reply came late): lost as they were made.
	DeadOnArrival int
	Cancelled     int            // acquires that ended with their context
	Simulated     time.Duration  // virtual time the run took
	Faults        []string       // the fault schedule, with virtual times
	Requests      map[string]int // requests sent, by operation
	Violations    []string
	// Leases is the history of the keys the violations name: every
	// lease of those keys, in the order they were granted.
	Leases []string
}

// faultLog records the faults of a run with their virtual times.
type faultLog struct {
	start time.Time
	mu    sync.Mutex
	lines []string
	more  int // lines not kept
}

const maxFaultLines = 5000

func (l *faultLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) >= maxFaultLines {
		l.more++
		return
	}
	l.lines = append(l.lines, fmt.Sprintf("%v ", time.Since(l.start))+fmt.Sprintf(format, args...))
}

// Run makes one simulated run and checks it. Call it inside a synctest
// bubble.
func Run(cfg Config) *Result {
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	sub := func() *rand.Rand { return rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())) }
	cfg.defaults(rng)
	ttl := cfg.TTL
	start := time.Now()
	log := &faultLog{start: start}
	log.add("%d clients of %d workers on %d keys, TTL %v", cfg.Clients, cfg.Workers, cfg.Keys, ttl)

	newModel := cfg.Model
	if newModel == nil {
		newModel = NewMemory(cfg.Wrap)
	}
	model := newModel(Env{TTL: ttl, Log: log.add})
	defer model.Close()
	// The request timeout of the simulated client library: from a
	// fifth of the TTL (renewals time out and are tried again) to twice
	// the TTL (renewals hang past the lease's deadline).
	timeout := ttl/5 + time.Duration(rng.Int64N(int64(2*ttl)))
	log.add("request timeout %v", timeout)
	clients := make([]*lock.Client, cfg.Clients)
	clocks := make([]clientClock, cfg.Clients)
	for i := range clients {
		b, err := model.Client(i, rng, timeout)
		if err != nil {
			return &Result{Seed: cfg.Seed, Violations: []string{fmt.Sprintf("client %d: %v", i, err)}}
		}
		opts := []lock.Option{lock.WithTTL(ttl)}
		clocks[i] = trueClock{clock.Real}
		rate := cfg.ClockRate
		if rate == 0 && rng.IntN(2) == 0 {
			// Within package lock's default allowance, 1% of the TTL
			// plus 2ms: the clock may run up to 1% slow or fast.
			rate = 1 + (rng.Float64()*2-1)/100
		}
		if rate != 0 && rate != 1 {
			clocks[i] = newSkewed(rate)
			opts = append(opts, lock.WithClock(clocks[i]))
			log.add("client %d's clock runs at %.5f times true time", i, rate)
		}
		c, err := lock.New(b, opts...)
		if err != nil {
			return &Result{Seed: cfg.Seed, Violations: []string{"lock.New: " + err.Error()}}
		}
		clients[i] = c
	}
	keys := make([]string, cfg.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	var hoard []string // the hoarder's keys
	for i := range max(cfg.Hoard, 0) {
		hoard = append(hoard, fmt.Sprintf("h%d", i))
	}
	if len(hoard) > 0 {
		log.add("client 0 hoards %d leases", len(hoard))
	}
	// Every key the run uses, for the leftover check: the shared keys,
	// the hoarder's, each worker's own key for giving up (see calm), and
	// the probes' (see probeIndependence).
	allKeys := append(slices.Clone(keys), hoard...)
	for ci := range clients {
		for wi := 0; wi < cfg.Workers; wi++ {
			allKeys = append(allKeys, ownKey(ci, wi))
		}
	}
	allKeys = append(allKeys, probeKeys...)

	h := &history{ttl: ttl, start: start}
	var guard fence.Guard

	// Phase 1: faults.
	model.SetFaults(true)
	faultyEnd := start.Add(cfg.Faulty)
	var wg sync.WaitGroup
	for ci, c := range clients {
		for wi := 0; wi < cfg.Workers; wi++ {
			w := &worker{client: ci, id: wi, c: c, clk: clocks[ci], keys: keys, ttl: ttl, rng: sub(), h: h, guard: &guard}
			wg.Go(func() { w.faulty(faultyEnd) })
		}
	}
	if len(hoard) > 0 {
		w := &worker{client: 0, id: cfg.Workers, c: clients[0], clk: clocks[0], keys: hoard, ttl: ttl, rng: sub(), h: h, guard: &guard}
		wg.Go(func() { w.hoard(faultyEnd) })
	}
	schedule(rng, log, model, cfg.Clients, ttl, faultyEnd, h)
	model.SetFaults(false)
	wg.Wait()

	// Phase 2: no faults (latency only). Wait until every request of the
	// faulty phase has landed and every lock it left has expired, then
	// every worker takes its keys again with a patient context (each must
	// be served: liveness) and gives up on a few acquires on purpose
	// (each must leave nothing behind).
	time.Sleep(2*timeout + 6*ttl)
	for _, s := range model.Settled() {
		h.violate("%v after the faults stopped, longer than any request travels plus the TTL, with no acquire running, the store still has: %s", time.Since(faultyEnd), s)
	}
	for ci, c := range clients {
		for wi := 0; wi < cfg.Workers; wi++ {
			w := &worker{client: ci, id: wi, c: c, clk: clocks[ci], keys: keys, ttl: ttl, rng: sub(), h: h, guard: &guard}
			wg.Go(w.calm)
		}
	}
	wg.Wait()
	probeIndependence(h, clients, keys)
	for _, c := range clients {
		c.Close() // waits for the clients' cleanups
	}
	// In-flight requests land within two latencies of the last reply.
	time.Sleep(50 * time.Millisecond)
	checkLeftovers(h, model, allKeys)

	res := &Result{Seed: cfg.Seed, Simulated: time.Since(start), Requests: model.Requests()}
	h.check(res)
	log.mu.Lock()
	res.Faults = append(res.Faults, log.lines...)
	if log.more > 0 {
		res.Faults = append(res.Faults, fmt.Sprintf("(%d more)", log.more))
	}
	log.mu.Unlock()
	return res
}

// checkLeftovers checks that the store holds no lock and no watch once
// every client is closed: the calm phase's cancelled acquires left nothing
// behind. Locks of the calm phase would still be within their TTL here.
func checkLeftovers(h *history, model Model, keys []string) {
	if h.lastGrant().Add(h.ttl).Before(time.Now()) {
		h.violate("the leftover check came more than a TTL after the calm phase's last grant: it proves nothing (the harness's fault)")
	}
	for _, s := range model.Leftovers(keys) {
		h.violate("after the calm phase, with every client closed, the store still holds %s: an acquire or a release left it behind", s)
	}
}

// schedule injects the timed faults until end, one at a time: a partition
// of one client, a pause of a store node, a restart of one keeping data.
// It heals each before the next.
//
// A model that is an EmptyRestarter also restarts a node empty, at most once
// a run: what its store promises holds while at most one node at a time
// has lost its data (see package redis, Redlock).
func schedule(rng *rand.Rand, log *faultLog, model Model, clients int, ttl time.Duration, end time.Time, h *history) {
	emptied := false
	for {
		wait := ttl + time.Duration(rng.Int64N(int64(3*ttl)))
		d := []time.Duration{ttl / 2, 2 * ttl, ttl / 10}[rng.IntN(3)]
		kind := rng.IntN(3)
		target := rng.IntN(clients)
		node := rng.IntN(model.Nodes())
		if time.Now().Add(wait + d).After(end) {
			time.Sleep(time.Until(end))
			return
		}
		time.Sleep(wait)
		switch kind {
		case 0:
			log.add("client %d cut off for %v", target, d)
			model.Partition(target, d)
			time.Sleep(d)
		case 1:
			log.add("store node %d paused for %v", node, d)
			model.Pause(node)
			time.Sleep(d)
			model.Resume(node)
		case 2:
			if e, ok := model.(EmptyRestarter); ok && !emptied && rng.IntN(3) == 0 {
				emptied = true
				h.loseData()
				log.add("store node %d restarted empty", node)
				e.RestartEmpty(node)
				continue
			}
			log.add("store node %d restarted, keeping its data", node)
			model.Restart(node)
		}
	}
}

// worker is one goroutine of one client taking locks.
type worker struct {
	client, id int
	c          *lock.Client
	clk        clientClock // c's
	keys       []string
	ttl        time.Duration
	rng        *rand.Rand
	h          *history
	guard      *fence.Guard
}

// section kinds
const (
	kindRenewed = iota // watchdog on, holds up to 2 TTLs, stops when lost
	kindShort          // watchdog off, holds less than the TTL
	kindStall          // watchdog off, holds past the TTL without looking: a stalled process
	kindDo             // Client.Do, watchdog on, holds up to 2 TTLs, stops when its context ends
	kindHoarded        // one of the hoarder's leases: watchdog on, held 1 to 3 TTLs
)

var kindNames = [...]string{"renewed", "short", "stalled", "Do", "hoarded"}

func (w *worker) faulty(end time.Time) {
	r := w.rng
	for time.Now().Before(end) {
		key := w.keys[r.IntN(len(w.keys))]
		kind := []int{kindRenewed, kindDo, kindShort, kindStall}[r.IntN(4)]
		// One section in four asks for half the client's TTL: a
		// handover between goroutines of one client may then pass a
		// lock to a lease with a shorter TTL than its holder's.
		ttl := w.ttl
		if r.IntN(4) == 0 {
			ttl /= 2
		}
		var hold time.Duration
		switch kind {
		case kindRenewed, kindDo:
			hold = time.Duration(r.Int64N(int64(2 * ttl)))
		case kindShort:
			hold = time.Duration(r.Int64N(int64(ttl * 9 / 10)))
		case kindStall:
			hold = ttl + time.Duration(r.Int64N(int64(ttl)))
		}
		wait := r.IntN(4) > 0
		patience := 5 * w.ttl
		if r.IntN(3) == 0 {
			patience = time.Duration(r.Int64N(int64(w.ttl))) // often ends while waiting or in flight
		}
		pause := time.Duration(r.Int64N(int64(w.ttl / 10)))
		err := w.section(key, kind, ttl, hold, wait, patience)
		if err != nil {
			time.Sleep(pause) // the caller's own pace after a refusal
		}
	}
}

// hoard takes every one of its keys, holds them all for 1 to 3 TTLs with
// the watchdog on, and releases them: twice while the faults last, each
// time at a moment the seed draws (auto-renewed leases cost a renewal a
// third of a TTL each, so the hoard comes in bursts).
func (w *worker) hoard(end time.Time) {
	r := w.rng
	for range 2 {
		hold := w.ttl + time.Duration(r.Int64N(int64(2*w.ttl)))
		room := (time.Until(end) - hold) / 2
		if room <= 0 {
			return // no room left for another hoard
		}
		time.Sleep(time.Duration(r.Int64N(int64(room))))
		type held struct {
			rec  *leaseRec
			l    *lock.Lease
			done chan time.Time
		}
		var hs []held
		for _, key := range w.keys {
			ctx, cancel := context.WithTimeout(context.Background(), w.ttl)
			l, err := w.c.TryAcquire(ctx, key)
			cancel()
			if err != nil {
				w.failed(err)
				continue
			}
			rec, done := w.begin(key, kindHoarded, w.ttl, l)
			w.write(rec, l)
			hs = append(hs, held{rec, l, done})
		}
		time.Sleep(hold)
		for _, x := range hs {
			x.rec.observe(x.l)
			if x.l.Err() == nil {
				w.write(x.rec, x.l)
			}
			err := w.release(x.rec, x.l)
			w.end(x.rec, <-x.done, err)
		}
	}
}

// ownKey is the key of client ci's worker wi alone (see calm).
func ownKey(ci, wi int) string { return fmt.Sprintf("c%d.%d", ci, wi) }

// calm is the phase without faults: two sections per key that must be
// served, and acquires given up on purpose.
func (w *worker) calm() {
	ttl, r := w.ttl, w.rng
	// Acquires given up after 0 to 3 ms on a key of the worker's own,
	// with a long TTL: a lock one of them left behind would still be on
	// the store when the leftover check runs, and no other acquire
	// would hide it by taking the key.
	long := min(20*ttl, 50*time.Second)
	for range 6 {
		w.section(ownKey(w.client, w.id), kindShort, long, 0, true, time.Duration(r.Int64N(int64(3*time.Millisecond))))
	}
	for i := 0; i < 2*len(w.keys); i++ {
		key := w.keys[i%len(w.keys)]
		if r.IntN(3) == 0 {
			w.section(key, kindShort, ttl, 0, true, time.Duration(r.Int64N(int64(ttl/20)))) // may be cancelled; must leave nothing
		}
		// Liveness: with faults gone, a patient waiter is served. The
		// bound is generous: every other worker's sections in this
		// phase, one after another.
		if err := w.section(key, kindShort, ttl, time.Duration(r.Int64N(int64(ttl/4))), true, 200*ttl); err != nil {
			w.h.violate("liveness: client %d worker %d was not served %q within %v after the faults stopped: %v", w.client, w.id, key, 200*ttl, err)
		}
	}
}

// probeKeys are keys that a store may confuse with other keys: one with a
// brace (Redis hash tags), and the SHA-1 in hex of it.
var probeKeys = []string{"a{b}", "28abe73a16bdb9982d4d12d2ca89653ed5aa55a1"}

// probeIndependence checks that distinct keys are distinct locks: with
// each key held by client 0, client 1 takes each other key at once. It
// runs after the calm phase, when nothing holds any of the keys.
func probeIndependence(h *history, clients []*lock.Client, keys []string) {
	if len(clients) < 2 {
		return
	}
	ks := append(slices.Clone(keys), probeKeys...)
	ctx := context.Background()
	for i, a := range ks {
		la, err := clients[0].TryAcquire(ctx, a, lock.WithAutoRenew(false))
		if err != nil {
			h.violate("independent keys: after the calm phase, client 0's TryAcquire of %q failed: %v", a, err)
			continue
		}
		for j, b := range ks {
			if i == j {
				continue
			}
			lb, err := clients[1].TryAcquire(ctx, b, lock.WithAutoRenew(false))
			if err != nil {
				h.violate("independent keys: with %q held by client 0, client 1's TryAcquire of %q failed: %v", a, b, err)
				continue
			}
			lb.Release(ctx)
		}
		la.Release(ctx)
	}
}

// section takes key with the TTL ttl, holds it as kind says, writes to
// the fenced resource at the start and at the end, releases, and records
// the lease.
func (w *worker) section(key string, kind int, ttl, hold time.Duration, wait bool, patience time.Duration) error {
	opts := []lock.Option{lock.WithTTL(ttl)}
	if kind != kindRenewed && kind != kindDo {
		opts = append(opts, lock.WithAutoRenew(false))
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if kind == kindDo {
		// Do: the section's context ends when the lease is lost (or
		// the patience runs out), and Do releases when it returns.
		var rec *leaseRec
		var done chan time.Time
		err := w.c.Do(ctx, key, func(fctx context.Context, l *lock.Lease) error {
			rec, done = w.begin(key, kind, ttl, l)
			w.hold(rec, l, kind, hold, fctx.Done())
			rec.release = time.Now() // Do releases as fn returns
			return nil
		}, opts...)
		if rec == nil {
			w.failed(err)
			return err
		}
		w.end(rec, <-done, err)
		return nil
	}
	var l *lock.Lease
	var err error
	if wait {
		l, err = w.c.Acquire(ctx, key, opts...)
	} else {
		l, err = w.c.TryAcquire(ctx, key, opts...)
	}
	if err != nil {
		w.failed(err)
		return err
	}
	rec, done := w.begin(key, kind, ttl, l)
	w.hold(rec, l, kind, hold, l.Done())
	err = w.release(rec, l)
	w.end(rec, <-done, err)
	return nil
}

// release releases l, records when, and checks the answer: a release
// that reports the lease lost, called while the lease was valid and
// answered before its deadline, is a false report, or a store that
// freed the lock before its expiry; either is a violation.
func (w *worker) release(rec *leaseRec, l *lock.Lease) error {
	rctx, rcancel := context.WithTimeout(context.Background(), w.ttl)
	defer rcancel()
	dl := l.Deadline()
	valid := l.Err() == nil && w.clk.Now().Before(dl)
	rec.release = time.Now()
	err := l.Release(rctx)
	rec.err = l.Err()
	// Only the release's own answer counts: a lease handed over ahead of
	// the store may end as lost while Release waits for the handover to
	// settle (its transfer failed), which is a loss, reported as such.
	own := err != nil && strings.Contains(err.Error(), "no longer held it at release")
	// A node restarted empty forgets the locks it held: a release may
	// then find the lock gone from a majority while no one else can take
	// it (the empty node does not vote yet), a true "not held".
	if valid && own && errors.Is(err, lock.ErrLost) && w.clk.Now().Before(dl) && !w.h.lostData() {
		w.h.violate("release reported lost while held: %s was valid when Release was called, and Release answered before its deadline (%v left): %v", w.h.describe(rec), w.clk.Until(dl), err)
	}
	return err
}

func (w *worker) failed(err error) {
	if errors.Is(err, context.DeadlineExceeded) {
		w.h.cancelled()
	}
}

// begin records a lease as it is granted, and starts watching its Done.
func (w *worker) begin(key string, kind int, ttl time.Duration, l *lock.Lease) (*leaseRec, chan time.Time) {
	rec := &leaseRec{client: w.client, worker: w.id, key: key, kind: kind, ttl: ttl, fence: l.Fence(), token: l.Token(), start: time.Now(), l: l, clk: w.clk}
	rec.observe(l)
	done := make(chan time.Time, 1)
	go func() { <-l.Done(); done <- time.Now() }()
	return rec, done
}

// hold is the critical section: a fenced write, work for hold (cut short
// when stop closes, unless the holder stalls), and another write.
func (w *worker) hold(rec *leaseRec, l *lock.Lease, kind int, hold time.Duration, stop <-chan struct{}) {
	w.write(rec, l)
	if kind == kindStall {
		time.Sleep(hold) // not looking at the lease
	} else {
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-stop:
		}
		t.Stop()
	}
	rec.observe(l)
	if kind == kindStall || l.Err() == nil {
		w.write(rec, l) // a stalled holder writes without looking: the resource must refuse it if stale
	}
}

// end records a lease once it has ended.
func (w *worker) end(rec *leaseRec, done time.Time, relErr error) {
	rec.done = done
	rec.relErr = relErr
	rec.observe(rec.l)
	if rec.err == nil {
		rec.err = rec.l.Err()
	}
	w.h.add(rec)
}

// write writes to the fenced resource key with the lease's fence.
func (w *worker) write(rec *leaseRec, l *lock.Lease) {
	err := w.guard.Do(rec.key, l.Fence(), l.Token(), func() error { return nil })
	valid := w.clk.Now().Before(l.Deadline()) && l.Err() == nil
	switch {
	case errors.Is(err, fence.ErrStale) && valid:
		w.h.violate("client %d: the fenced resource %q refused fence %d of a lease that is still valid (deadline in %v): a newer fence was accepted while this lease was valid, or fences went backwards: %v", w.client, rec.key, l.Fence(), w.clk.Until(l.Deadline()), err)
	case err != nil && !errors.Is(err, fence.ErrStale):
		w.h.violate("client %d: fenced write to %q: %v", w.client, rec.key, err)
	}
}
