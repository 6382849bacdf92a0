// Command bench measures the Redis backend of github.com/distlock/lock beside
// its peers, bsm/redislock and go-redsync/redsync, and beside a floor written
// here (a bare go-redis SET NX PX, then a compare-and-delete script, no
// library), all against one redis-server this program starts, in one run. A
// second floor runs the library's own protocol without the library (a Lua
// SET NX PX plus fence INCR, then the same compare-and-delete script), to
// tell the cost of the protocol from the cost of the library.
//
//	cd bench && go run .
//
// Scenarios, each run in interleaved rounds (the machine is noisy; compare
// ratios, not absolute figures across runs):
//
//   - one goroutine: acquire then release one key, as fast as possible;
//   - 32 goroutines, each on its own key;
//   - hot key: 16 goroutines on one key, each holding it 1ms per section.
//     Utilisation = sections x 1ms / wall time (100% means the lock is never
//     idle while someone waits); requests per section = commands the client
//     sent (counted by a go-redis hook) / sections; gap = median time from
//     the end of one section to the start of the next.
//
// The leases scenario (-only leases, on any -store; see leases.go) holds
// many leases at once through one client and reports what keeping them
// costs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/redistest"
	lockredis "github.com/distlock/lock/redis"
)

const ttl = 10 * time.Second

// locker is one peer's way to take a key once or to wait for it.
type locker interface {
	try(ctx context.Context, key string) (func(context.Context) error, error)
	wait(ctx context.Context, key string) (func(context.Context) error, error)
}

type peer struct {
	name string
	new  func(rdb *goredis.Client) locker
}

var peers = []peer{
	{"lock", newLock},
	{"bsm/redislock", newRedislock},
	{"redsync (default retry)", newRedsync(0)},
	{"redsync (1ms retry)", newRedsync(time.Millisecond)},
	{protocolFloorName, newProtocolFloor},
	{fencedFloorName, newFencedFloor},
	{floorName, newFloor},
}

const (
	protocolFloorName = "floor + fence + dead tokens (bare go-redis, Lua)"
	fencedFloorName   = "floor + fence (bare go-redis, Lua)"
	floorName         = "floor (bare go-redis)"
)

// --- this library

type lockPeer struct{ c *lock.Client }

func newLock(rdb *goredis.Client) locker {
	c, err := lock.New(lockredis.New(rdb), lock.WithTTL(ttl))
	if err != nil {
		panic(err)
	}
	return lockPeer{c}
}

func (p lockPeer) try(ctx context.Context, key string) (func(context.Context) error, error) {
	l, err := p.c.TryAcquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (p lockPeer) wait(ctx context.Context, key string) (func(context.Context) error, error) {
	l, err := p.c.Acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

// --- bsm/redislock

type redislockPeer struct{ c *redislock.Client }

func newRedislock(rdb *goredis.Client) locker { return redislockPeer{redislock.New(rdb)} }

func (p redislockPeer) try(ctx context.Context, key string) (func(context.Context) error, error) {
	l, err := p.c.Obtain(ctx, key, ttl, nil)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (p redislockPeer) wait(ctx context.Context, key string) (func(context.Context) error, error) {
	l, err := p.c.Obtain(ctx, key, ttl, &redislock.Options{RetryStrategy: redislock.LinearBackoff(time.Millisecond)})
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

// --- go-redsync/redsync

type redsyncPeer struct {
	rs    *redsync.Redsync
	retry time.Duration
}

func newRedsync(retry time.Duration) func(*goredis.Client) locker {
	return func(rdb *goredis.Client) locker {
		return redsyncPeer{redsync.New(redsyncgoredis.NewPool(rdb)), retry}
	}
}

func (p redsyncPeer) try(ctx context.Context, key string) (func(context.Context) error, error) {
	m := p.rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(1))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
}

func (p redsyncPeer) wait(ctx context.Context, key string) (func(context.Context) error, error) {
	opts := []redsync.Option{redsync.WithExpiry(ttl)}
	if p.retry > 0 {
		opts = append(opts, redsync.WithRetryDelay(p.retry), redsync.WithTries(math.MaxInt32))
	}
	for {
		m := p.rs.NewMutex(key, opts...)
		err := m.LockContext(ctx)
		if err == nil {
			return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		// The default gives up after 32 tries; a waiter keeps waiting.
	}
}

// --- the floor: the protocol with no library around it

type floorPeer struct{ rdb *goredis.Client }

var floorRelease = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func newFloor(rdb *goredis.Client) locker { return floorPeer{rdb} }

var floorTokens atomic.Uint64

func (p floorPeer) try(ctx context.Context, key string) (func(context.Context) error, error) {
	token := fmt.Sprint(floorTokens.Add(1))
	ok, err := p.rdb.SetNX(ctx, key, token, ttl).Result()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errors.New("locked")
	}
	return func(ctx context.Context) error {
		return floorRelease.Run(ctx, p.rdb, []string{key}, token).Err()
	}, nil
}

func (p floorPeer) wait(ctx context.Context, key string) (func(context.Context) error, error) {
	return pollEveryMillisecond(ctx, key, p.try)
}

// pollEveryMillisecond waits for key by trying every millisecond.
func pollEveryMillisecond(ctx context.Context, key string, try func(context.Context, string) (func(context.Context) error, error)) (func(context.Context) error, error) {
	for {
		unlock, err := try(ctx, key)
		if err == nil {
			return unlock, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
}

// --- the floor with a fence: the protocol package redis runs, with no
// library around it. Its acquire is one Lua script doing SET NX PX and the
// fence INCR, as the issue asks; it shows what the fence and the script cost
// against the bare floor, apart from the library.

type fencedFloorPeer struct{ rdb *goredis.Client }

var fencedAcquire = goredis.NewScript(`if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end return 0`)

func newFencedFloor(rdb *goredis.Client) locker { return fencedFloorPeer{rdb} }

func (p fencedFloorPeer) try(ctx context.Context, key string) (func(context.Context) error, error) {
	token := fmt.Sprint(floorTokens.Add(1))
	fence, err := fencedAcquire.Run(ctx, p.rdb, []string{key, key + ":fence"}, token, ttl.Milliseconds()).Int64()
	if err != nil {
		return nil, err
	}
	if fence == 0 {
		return nil, errors.New("locked")
	}
	return func(ctx context.Context) error {
		return floorRelease.Run(ctx, p.rdb, []string{key}, token).Err()
	}, nil
}

func (p fencedFloorPeer) wait(ctx context.Context, key string) (func(context.Context) error, error) {
	return pollEveryMillisecond(ctx, key, p.try)
}

// --- the floor with a fence and dead tokens: the least the library's
// uncontended cycle must do on the server, with no library around it and
// no queue, handover or session. Its acquire checks the token's tombstone
// and the key's queue in one EXISTS, then SET NX PX and the fence INCR;
// its release compares, writes the tombstone and deletes. What lock
// measures below it is the cost of the library and of its fuller scripts.

type protocolFloorPeer struct{ rdb *goredis.Client }

var (
	protocolAcquire = goredis.NewScript(`if redis.call('EXISTS', KEYS[3], KEYS[4]) == 0 and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end return 0`)
	protocolRelease = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[2], '1', 'PX', ARGV[2]) return redis.call('DEL', KEYS[1]) end return 0`)
)

func newProtocolFloor(rdb *goredis.Client) locker { return protocolFloorPeer{rdb} }

func (p protocolFloorPeer) try(ctx context.Context, key string) (func(context.Context) error, error) {
	token := fmt.Sprint(floorTokens.Add(1))
	dead := key + ":dead:" + token
	fence, err := protocolAcquire.Run(ctx, p.rdb, []string{key, key + ":fence", dead, key + ":q"}, token, ttl.Milliseconds()).Int64()
	if err != nil {
		return nil, err
	}
	if fence == 0 {
		return nil, errors.New("locked")
	}
	return func(ctx context.Context) error {
		return protocolRelease.Run(ctx, p.rdb, []string{key, dead}, token, 15000).Err()
	}, nil
}

func (p protocolFloorPeer) wait(ctx context.Context, key string) (func(context.Context) error, error) {
	return pollEveryMillisecond(ctx, key, p.try)
}

// --- measurement

// counter is a go-redis hook counting the commands a client sends.
type counter struct{ n atomic.Int64 }

func (c *counter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *counter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

type result struct {
	one, own    float64 // cycles per second
	utilisation float64 // percent
	requests    float64 // per section
	gap         float64 // median microseconds between sections
}

var run atomic.Int64 // makes every measurement's keys unique

// cycles runs workers goroutines, each taking and releasing its own key, for
// d, and returns cycles per second.
func cycles(l locker, workers int, d time.Duration) float64 {
	ctx := context.Background()
	prefix := fmt.Sprintf("bench:%d", run.Add(1))
	var total atomic.Int64
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		key := fmt.Sprintf("%s:%d", prefix, w)
		wg.Go(func() {
			n := int64(0)
			for time.Now().Before(stop) {
				unlock, err := l.try(ctx, key)
				if err != nil {
					fmt.Fprintln(os.Stderr, "bench:", err)
					os.Exit(1)
				}
				if err := unlock(ctx); err != nil {
					fmt.Fprintln(os.Stderr, "bench:", err)
					os.Exit(1)
				}
				n++
			}
			total.Add(n)
		})
	}
	wg.Wait()
	return float64(total.Load()) / time.Since(start).Seconds()
}

// hold keeps the section for exactly 1ms. It spins (yielding to other
// goroutines) rather than sleeping: on these machines time.Sleep of anything
// under a millisecond takes about 1.08ms, and that slack would count as idle
// lock time for every peer.
func hold() {
	start := time.Now()
	for time.Since(start) < time.Millisecond {
		runtime.Gosched()
	}
}

// hot runs 16 goroutines on one key for d; it returns the utilisation in
// percent, the requests per section, and the median gap between the end of
// one section and the start of the next, in microseconds.
func hot(l locker, c *counter, d time.Duration) (float64, float64, float64) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	key := fmt.Sprintf("bench:hot:%d", run.Add(1))
	var sections atomic.Int64
	var lastEnd atomic.Int64 // UnixNano of the last section's end
	var mu sync.Mutex
	var gaps []float64
	before := c.n.Load()
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Go(func() {
			for ctx.Err() == nil {
				unlock, err := l.wait(ctx, key)
				if err != nil {
					return // the run ended while waiting
				}
				began := time.Now()
				if end := lastEnd.Load(); end != 0 {
					mu.Lock()
					gaps = append(gaps, float64(began.UnixNano()-end)/1e3)
					mu.Unlock()
				}
				hold()
				sections.Add(1)
				lastEnd.Store(time.Now().UnixNano())
				unlock(context.Background())
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	n := sections.Load()
	return 100 * float64(n) * float64(time.Millisecond) / float64(wall), float64(c.n.Load()-before) / float64(n), median(gaps)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func main() {
	rounds := flag.Int("rounds", 5, "interleaved rounds per scenario; the table shows medians")
	dur := flag.Duration("duration", time.Second, "length of one cycles measurement")
	hotDur := flag.Duration("hot", 3*time.Second, "length of one hot-key measurement")
	only := flag.String("only", "", "comma-separated scenarios to run (default all): one,own,hot,sep,procs for Redis, one,hot,sep for Consul and etcd, and ops for etcd (each request of a one-goroutine cycle, timed) (sep: the hot key with 16 separate clients in this process; procs: with 16 separate processes); leases (many leases held by one client, on any store; never part of the default, and run alone)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	store := flag.String("store", "redis", "the store to measure: redis (this library beside redislock, redsync and the floors), consul (beside api.Lock) or etcd (beside concurrency.Mutex); for the leases scenario also redis-sessions (redis.WithSessions), etcd-sessions (etcd.WithSessions) and consul-sessions (consul.WithSessions)")
	leaseCounts := flag.String("leases", "1000,10000", "leases scenario: comma-separated numbers of leases held at once, each measured on a server started afresh (10k, 1m allowed)")
	leaseHold := flag.Duration("hold", 10*time.Second, "leases scenario: how long the leases are held")
	leaseTTL := flag.Duration("leasettl", 6*time.Second, "leases scenario: the leases' TTL (auto-renew every TTL/3)")
	leaseConc := flag.Int("leaseconc", 64, "leases scenario: acquisitions (and releases) in flight at once")
	leaseProfile := flag.String("leaseprofile", "", "leases scenario: write CPU profiles of each count's acquisitions and hold to PREFIX-STORE-N-acquire.pprof and PREFIX-STORE-N-hold.pprof")
	flag.IntVar(&consulIdle, "consulidle", 0, "leases scenario on Consul: idle connections the client keeps per host (0: the api package's default, GOMAXPROCS+1)")
	flag.Parse()
	if maybeChild() || maybeEtcdServer() {
		return
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	want := func(s string) bool { return *only == "" || strings.Contains(*only, s) }
	if strings.Contains(*only, "leases") {
		counts, err := parseCounts(*leaseCounts)
		if err != nil {
			fatal(err)
		}
		if *leaseConc < 1 || *leaseHold <= 0 || *leaseTTL <= 0 {
			fatal(fmt.Errorf("-leaseconc, -hold and -leasettl must be positive"))
		}
		runLeases(*store, counts, *leaseTTL, *leaseHold, *leaseConc, *leaseProfile)
		return
	}
	switch *store {
	case "consul":
		runConsul(*rounds, *dur, *hotDur, want)
		return
	case "etcd":
		runEtcd(*rounds, *dur, *hotDur, want)
		return
	}

	h := &harness{}
	defer h.cleanup()
	srv := redistest.Start(h, redistest.NoPersistence)
	fmt.Printf("redis-server %s, %d rounds, GOMAXPROCS %d\n\n", srv.Addr, *rounds, runtimeProcs())

	type state struct {
		l                         locker
		c                         *counter
		one, own, util, reqs, gap []float64
		sep                       []locker // 16 separate clients
		sepC                      *counter
		sepRuns                   []sepResult
		wake                      []float64   // wakeFloor, µs (states[0] only)
		procRuns                  []sepResult // 16 separate processes
	}
	newClient := func(c *counter) *goredis.Client {
		rdb := goredis.NewClient(&goredis.Options{
			Addr:                     srv.Addr,
			ContextTimeoutEnabled:    true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		rdb.AddHook(c)
		return rdb
	}
	admin := newClient(&counter{})
	defer admin.Close()
	states := make([]*state, len(peers))
	for i, p := range peers {
		c := &counter{}
		rdb := newClient(c)
		defer rdb.Close()
		st := &state{l: p.new(rdb), c: c, sepC: &counter{}}
		for range 16 {
			r := newClient(st.sepC)
			defer r.Close()
			st.sep = append(st.sep, p.new(r))
		}
		states[i] = st
	}
	// Warm up every peer (connections, script caches), then run the rounds,
	// rotating which peer goes first.
	for _, st := range states {
		cycles(st.l, 1, 200*time.Millisecond)
		cycles(st.l, 32, 200*time.Millisecond)
	}
	for r := 0; r < *rounds; r++ {
		for k := range peers {
			i := (k + r) % len(peers)
			p, st := peers[i], states[i]
			if want("one") {
				st.one = append(st.one, cycles(st.l, 1, *dur))
			}
			if want("own") {
				st.own = append(st.own, cycles(st.l, 32, *dur))
			}
			if want("hot") {
				u, q, g := hot(st.l, st.c, *hotDur)
				st.util, st.reqs, st.gap = append(st.util, u), append(st.reqs, q), append(st.gap, g)
			}
			if want("sep") {
				before := commands(admin)
				r := hotSeparate(st.sep, &st.sepC.n, *hotDur)
				sections := r.util / 100 * hotDur.Seconds() / 0.001
				cmds := float64(commands(admin)-before-1) / max(sections, 1)
				r.cmds = cmds
				st.sepRuns = append(st.sepRuns, r)
			}
			if want("procs") {
				r := hotProcesses(i, srv.Addr, admin, 16, *hotDur)
				st.procRuns = append(st.procRuns, r)
			}
			if (want("sep") || want("procs")) && i == 0 {
				st.wake = append(st.wake, wakeFloor(newClient(&counter{}), newClient(&counter{})))
			}
			fmt.Fprintf(os.Stderr, "round %d/%d: %s done\n", r+1, *rounds, p.name)
		}
	}

	res := make([]result, len(peers))
	for i, st := range states {
		if want("one") {
			res[i].one = median(st.one)
		}
		if want("own") {
			res[i].own = median(st.own)
		}
		if want("hot") {
			res[i].utilisation, res[i].requests, res[i].gap = median(st.util), median(st.reqs), median(st.gap)
		}
	}
	sepTable := func(title, who string, runs func(st *state) []sepResult) {
		fmt.Println(title)
		fmt.Println()
		fmt.Printf("| peer | utilisation | client requests per section | Redis commands per section | median handover gap | busiest %s's sections |\n", who)
		fmt.Println("|---|---|---|---|---|---|")
		for i, p := range peers {
			m := medianSep(runs(states[i]))
			fmt.Printf("| %s | %.1f%% | %.1f | %.1f | %.0f µs | %.0f%% |\n", p.name, m.util, m.reqs, m.cmds, m.gap, m.busiest)
		}
		fmt.Println()
	}
	if want("sep") {
		sepTable("Hot key, 16 separate clients (each its own go-redis client and peer instance, as separate processes would be), 1ms hold:", "client", func(st *state) []sepResult { return st.sepRuns })
	}
	if want("procs") {
		sepTable("Hot key, 16 separate processes (each a copy of this program with its own go-redis client and peer instance), 1ms hold:", "process", func(st *state) []sepResult { return st.procRuns })
	}
	if want("one") || want("own") || want("hot") {
		fmt.Println("| peer | one goroutine, cycles/s | 32 goroutines own keys, cycles/s | hot key 1ms hold: utilisation | requests per section | gap between sections, median |")
		fmt.Println("|---|---|---|---|---|---|")
		for i, p := range peers {
			r := res[i]
			fmt.Printf("| %s | %.0f | %.0f | %.1f%% | %.1f | %.0fus |\n", p.name, r.one, r.own, r.utilisation, r.requests, r.gap)
		}
	}
	byName := func(name string) result {
		for i, p := range peers {
			if p.name == name {
				return res[i]
			}
		}
		panic("no peer " + name)
	}
	lockR, redislockR := res[0], res[1]
	floorR, fenced, protocol := byName(floorName), byName(fencedFloorName), byName(protocolFloorName)
	fmt.Println()
	fmt.Println("Targets for lock (ratios of medians measured side by side in this run):")
	check := func(what string, got, target float64, unit string, atLeast bool) {
		ok := got >= target
		if !atLeast {
			ok = got <= target
		}
		mark := "ok"
		if !ok {
			mark = "MISSED"
		}
		cmp := ">="
		if !atLeast {
			cmp = "<="
		}
		fmt.Printf("  %-44s %8.2f%s (target %s %.2f%s)  %s\n", what, got, unit, cmp, target, unit, mark)
	}
	if want("one") {
		check("one goroutine vs bsm/redislock", lockR.one/redislockR.one, 1.0, "x", true)
		check("one goroutine vs floor + fence", lockR.one/fenced.one, 0.9, "x", true)
		fmt.Printf("  %-44s %8.2fx\n", "one goroutine vs floor (no fence)", lockR.one/floorR.one)
		fmt.Printf("  %-44s %8.2fx (the fence's cost, no library)\n", "one goroutine, floor + fence vs floor", fenced.one/floorR.one)
		fmt.Printf("  %-44s %8.2fx (the dead tokens' cost, no library)\n", "one goroutine, + dead tokens vs floor + fence", protocol.one/fenced.one)
		fmt.Printf("  %-44s %8.2fx (the least the protocol does, against the peer)\n", "one goroutine, + dead tokens vs bsm/redislock", protocol.one/redislockR.one)
		fmt.Printf("  %-44s %8.2fx (1.00: the library costs nothing over its protocol)\n", "one goroutine vs + dead tokens", lockR.one/protocol.one)
	}
	if want("own") {
		check("32 goroutines vs bsm/redislock", lockR.own/redislockR.own, 1.3, "x", true)
		check("32 goroutines vs floor", lockR.own/floorR.own, 0.9, "x", true)
	}
	if want("hot") {
		check("hot key utilisation", lockR.utilisation, 90, "%", true)
		check("hot key requests per section", lockR.requests, 3, "", false)
	}
	sepChecks := func(what string, runs func(st *state) []sepResult) {
		m := medianSep(runs(states[0]))
		check("hot key, 16 "+what+": utilisation", m.util, 90, "%", true)
		check("hot key, 16 "+what+": requests per section", m.reqs, 3, "", false)
		fewest := math.Inf(1)
		for _, st := range states[1:] {
			fewest = min(fewest, medianSep(runs(st)).cmds)
		}
		check("16 "+what+": Redis commands / fewest peer's", m.cmds/fewest, 1, "x", false)
	}
	if want("sep") {
		sepChecks("clients", func(st *state) []sepResult { return st.sepRuns })
	}
	if want("procs") {
		sepChecks("processes", func(st *state) []sepResult { return st.procRuns })
	}
	if want("sep") || want("procs") {
		w := median(states[0].wake)
		fmt.Printf("  %-44s %8.0fµs (a 1ms section's end to an idle client's receipt of a PUBLISH: the least any handover to a waiter that sleeps can take)\n", "wake-up floor, this run", w)
		fmt.Printf("  %-44s %8.1f%% (1ms / (1ms + the floor))\n", "utilisation ceiling of a sleeping waiter", 100*1000/(1000+w))
	}
}

// medianSep returns the median of each figure of runs.
func medianSep(runs []sepResult) sepResult {
	of := func(f func(r sepResult) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = f(r)
		}
		return median(xs)
	}
	return sepResult{
		util:    of(func(r sepResult) float64 { return r.util }),
		reqs:    of(func(r sepResult) float64 { return r.reqs }),
		cmds:    of(func(r sepResult) float64 { return r.cmds }),
		gap:     of(func(r sepResult) float64 { return r.gap }),
		busiest: of(func(r sepResult) float64 { return r.busiest }),
	}
}

// wakeFloor returns the median delay, in µs, from a PUBLISH sent as a 1ms
// section (hold) ends to its receipt by a client that waits on its own
// connection: the least any handover through Redis to a waiter that sleeps
// can take on this machine (a releaser's request to the server, and the
// server's message to the waiter), with no lock work at all.
func wakeFloor(pub, sub *goredis.Client) float64 {
	defer pub.Close()
	defer sub.Close()
	ctx := context.Background()
	ps := sub.Subscribe(ctx, "bench:wake")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		fatal(err)
	}
	var ds []float64
	for range 300 {
		got := make(chan time.Time, 1)
		go func() {
			ps.ReceiveMessage(ctx)
			got <- time.Now()
		}()
		hold()
		sent := time.Now()
		if err := pub.Publish(ctx, "bench:wake", "x").Err(); err != nil {
			fatal(err)
		}
		ds = append(ds, float64((<-got).Sub(sent).Nanoseconds())/1e3)
	}
	return median(ds)
}

// commands returns the commands the server has run (INFO commandstats,
// which counts the commands scripts call too).
func commands(rdb *goredis.Client) int64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(line, ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		var c int64
		fmt.Sscan(calls, &c)
		n += c
	}
	return n
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// harness lets redistest start a server outside a test.
type harness struct{ cleanups []func() }

func (h *harness) Helper() {}
func (h *harness) Fatalf(format string, args ...any) {
	h.cleanup()
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}
func (h *harness) Skip(args ...any) { h.Fatalf("%s", fmt.Sprint(args...)) }
func (h *harness) TempDir() string {
	d, err := os.MkdirTemp("", "lockbench")
	if err != nil {
		h.Fatalf("bench: %v", err)
	}
	h.cleanups = append(h.cleanups, func() { os.RemoveAll(d) })
	return d
}
func (h *harness) Cleanup(f func()) { h.cleanups = append(h.cleanups, f) }
func (h *harness) cleanup() {
	for i := len(h.cleanups) - 1; i >= 0; i-- {
		h.cleanups[i]()
	}
	h.cleanups = nil
}
