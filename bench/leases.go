package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/distlock/lock"
	lockconsul "github.com/distlock/lock/consul"
	locketcd "github.com/distlock/lock/etcd"
	"github.com/distlock/lock/internal/consultest"
	"github.com/distlock/lock/internal/redistest"
	lockredis "github.com/distlock/lock/redis"
)

// The many-leases scenario: one process holds N leases at once, on N
// distinct keys, through one lock.Client with auto-renew on, and the bench
// reports what keeping them costs.
//
//	cd bench && go run . -store redis -only leases -leases 10000,100000,300000 -hold 1m -leasettl 6s
//
// For each count N, on a server started afresh for it (redis-server; an
// etcd server, the bench's embedded one run in a child process of its own
// so that its heap and CPU are not the client's; a Consul agent):
//
//   - acquire: N TryAcquires on N distinct keys, -leaseconc at once;
//   - hold: keep them for -hold, while the watchdog renews each about every
//     TTL/3; every few seconds a scan asks each lease for Err (lost?) and
//     Deadline (how much validity it has left: with renewals on time, about
//     2/3 of the TTL at worst);
//   - release: release them all, -leaseconc at once.
//
// Figures: acquisitions/s and releases/s; leases lost while acquiring and
// during the hold (Lease.Err wraps lock.ErrLost); the Go heap per lease
// (HeapAlloc after a GC with the leases held, minus before, over N: the
// client's, the server being another process); the store's work during the
// hold per lease per TTL: client requests (Redis: scripts and commands sent,
// counted by a go-redis hook, and the round trips that carried them, a
// pipeline counting once; etcd: unary calls, streams opened and messages
// sent on streams, counted by gRPC interceptors; Consul: HTTP requests,
// each a round trip, counted and timed by the client's transport) and
// commands the server ran (Redis: INFO commandstats, which counts the
// commands scripts call too, with the server's time per command; etcd: the
// server's grpc_server_msg_received_total, every request message it
// received, by method; Consul: not available); and the CPU the server,
// this process and the whole machine (whose cores other work may share)
// used during the hold, in percent of one core.
//
// The hold's figures per TTL count the renewals that fell inside it: leases
// acquired within a fraction of a second renew in bursts every TTL/3, so a
// hold of a few seconds can catch one burst more or less than the steady
// rate; a hold of a minute is within a burst in 30 of it.

// leaseTarget is one store, started afresh, with the lock.Client whose
// leases are measured.
type leaseTarget struct {
	desc   string
	client *lock.Client
	sample func() storeSample
	stop   func()
}

// storeSample is what the store's counters say at one moment; a figure the
// store cannot give is -1.
type storeSample struct {
	requests int64         // client requests sent
	trips    int64         // round trips that carried them (Redis, Consul)
	wire     time.Duration // time spent in those round trips (Redis, Consul)
	commands int64         // commands or request messages the server ran
	cpu      time.Duration // the server process's CPU time
	memory   int64         // the server's memory in use, bytes (Redis)
	// byCommand counts the commands the server ran by name (Redis), or
	// the request messages it received by gRPC method (etcd).
	byCommand map[string]int64
	usec      map[string]int64 // server time by command name, µs (Redis)
	dials     int64            // connections the client opened (Consul); -1 unknown
	timings   *etcdCounts      // the client's request times (etcd)
}

// leaseRow is one count's figures.
type leaseRow struct {
	n, acquired       int
	acqErrs           int
	acqErr            string
	acqRate           float64
	heapPerLease      float64
	lostAcq, lostHold int
	reasons           map[string]int
	reqs, trips, cmds float64  // per lease per TTL during the hold; < 0: unknown
	wirePerTrip       float64  // µs
	holdCPU, acqCPU   cpuShare // during the hold, and while acquiring
	latency           string   // the client's request times during the hold (etcd)
	memPerLease       float64  // bytes; < 0: unknown
	byCommand         string   // server commands per lease per TTL by name
	dialsPerSec       float64  // connections opened per second during the hold; < 0: unknown
	minLeft, p1Left   time.Duration
	medLeft           time.Duration
	maxGoroutines     int
	stackMB           float64 // goroutine stacks in use when the heap was measured, MB
	relRate           float64
	relLost, relErrs  int
	relErr            string
	holdWall, acqWall time.Duration
	relWall           time.Duration
}

// parseCounts parses "10000,100k,1m".
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ToLower(f))
		mult := 1
		switch {
		case strings.HasSuffix(f, "k"):
			mult, f = 1000, strings.TrimSuffix(f, "k")
		case strings.HasSuffix(f, "m"):
			mult, f = 1000000, strings.TrimSuffix(f, "m")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-leases: %q is not a positive count", f)
		}
		out = append(out, n*mult)
	}
	return out, nil
}

// runLeases runs the scenario on store for each count and prints the table.
func runLeases(store string, counts []int, ttl, hold time.Duration, conc int, profile string) {
	var rows []leaseRow
	var desc string
	for _, n := range counts {
		t := startLeaseTarget(store, ttl)
		desc = t.desc
		fmt.Fprintf(os.Stderr, "leases: %s: %d leases, TTL %v, hold %v, %d at once\n", t.desc, n, ttl, hold, conc)
		var prof string
		if profile != "" {
			prof = fmt.Sprintf("%s-%s-%d", profile, store, n)
		}
		r := leaseRun(t, n, ttl, hold, conc, prof)
		t.stop()
		rows = append(rows, r)
		printLeaseRows(os.Stderr, store, []leaseRow{r})
	}
	fmt.Printf("%s; one lock.Client, TTL %v (auto-renew every TTL/3), hold %v, %d acquisitions or releases at once, GOMAXPROCS %d\n\n",
		desc, ttl, hold, conc, runtimeProcs())
	printLeaseRows(os.Stdout, store, rows)
}

// printLeaseRows prints the table of rows and, under it, each count's
// details and the kinds of losses.
func printLeaseRows(w io.Writer, store string, rows []leaseRow) {
	num := func(x float64, prec int) string {
		if x < 0 {
			return "n/a"
		}
		return strconv.FormatFloat(x, 'f', prec, 64)
	}
	fmt.Fprintf(w, "| store | leases | acquisitions/s | Go heap per lease | lost while acquiring / during hold | client requests per lease per TTL | round trips per lease per TTL | server commands per lease per TTL | CPU during hold: server / bench / whole machine (of %d00%%) | validity left at scans, worst: min / p1 / median | releases/s |\n", runtime.NumCPU())
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %d | %.0f | %.0f B | %d / %d | %s | %s | %s | %s | %.2fs / %.2fs / %.2fs | %.0f |\n",
			store, r.n, r.acqRate, r.heapPerLease, r.lostAcq, r.lostHold,
			num(r.reqs, 2), num(r.trips, 3), num(r.cmds, 2), r.holdCPU,
			r.minLeft.Seconds(), r.p1Left.Seconds(), r.medLeft.Seconds(), r.relRate)
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		fmt.Fprintf(w, "- %d leases: acquired %d in %.1fs", r.n, r.acquired, r.acqWall.Seconds())
		if r.acqErrs > 0 {
			fmt.Fprintf(w, " (%d failed; first: %s)", r.acqErrs, r.acqErr)
		}
		fmt.Fprintf(w, ", CPU meanwhile: server / bench / whole machine %s", r.acqCPU)
		fmt.Fprintf(w, "; held %.1fs; released in %.1fs", r.holdWall.Seconds(), r.relWall.Seconds())
		if r.relLost > 0 || r.relErrs > 0 {
			fmt.Fprintf(w, " (%d reported lost, %d other errors", r.relLost, r.relErrs)
			if r.relErr != "" {
				fmt.Fprintf(w, "; first: %s", r.relErr)
			}
			fmt.Fprint(w, ")")
		}
		fmt.Fprintf(w, "; goroutines at most %d at the scans, stacks %.0f MB when the heap was measured", r.maxGoroutines, r.stackMB)
		if r.wirePerTrip >= 0 {
			fmt.Fprintf(w, "; during the hold %.1f requests per round trip, %.0f µs per round trip (mean, from send to reply, in the client)", r.reqs/r.trips, r.wirePerTrip)
		}
		if r.memPerLease >= 0 {
			fmt.Fprintf(w, "; server memory %.0f B per lease", r.memPerLease)
		}
		if r.byCommand != "" {
			fmt.Fprintf(w, "; server commands per lease per TTL during the hold: %s", r.byCommand)
			if strings.Contains(r.byCommand, "µs each") {
				fmt.Fprint(w, " (a script's time includes the commands it calls)")
			}
		}
		if r.latency != "" {
			fmt.Fprintf(w, "; during the hold %s", r.latency)
		}
		if r.dialsPerSec >= 0 {
			fmt.Fprintf(w, "; the client opened %.0f connections/s during the hold", r.dialsPerSec)
		}
		fmt.Fprintln(w)
		type reason struct {
			s string
			n int
		}
		var rs []reason
		for s, n := range r.reasons {
			rs = append(rs, reason{s, n})
		}
		slices.SortFunc(rs, func(a, b reason) int { return b.n - a.n })
		for i, x := range rs {
			if i == 4 {
				fmt.Fprintf(w, "  - and %d more kinds\n", len(rs)-4)
				break
			}
			fmt.Fprintf(w, "  - lost: %d x %s\n", x.n, x.s)
		}
	}
	fmt.Fprintln(w)
}

// leaseRun measures n leases on t.
func leaseRun(t leaseTarget, n int, ttl, hold time.Duration, conc int, profile string) leaseRow {
	r := leaseRow{n: n, reasons: map[string]int{}}
	leases := make([]*lock.Lease, n)
	prefix := fmt.Sprintf("leases:%d:", run.Add(1))

	// Acquire.
	stopProfile := startProfile(profile, "acquire")
	runtime.GC()
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	var next, acquired, failed atomic.Int64
	var errMu sync.Mutex
	a0, acpu0, abusy0 := t.sample(), selfCPU(), machineBusy()
	start := time.Now()
	progress := ticker(5*time.Second, func() {
		a := acquired.Load()
		fmt.Fprintf(os.Stderr, "leases: %d acquired (%.0f/s), %d failed\n", a, float64(a)/time.Since(start).Seconds(), failed.Load())
	})
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				l, err := t.client.TryAcquire(ctx, prefix+strconv.Itoa(i))
				cancel()
				if err != nil {
					if failed.Add(1) == 1 {
						errMu.Lock()
						r.acqErr = oneLine(err.Error())
						errMu.Unlock()
					}
					continue
				}
				leases[i] = l
				acquired.Add(1)
			}
		})
	}
	wg.Wait()
	progress()
	stopProfile()
	r.acqWall = time.Since(start)
	a1, acpu1, abusy1 := t.sample(), selfCPU(), machineBusy()
	r.acqCPU = cpuShares(a0.cpu, a1.cpu, acpu0, acpu1, abusy0, abusy1, r.acqWall)
	r.acquired, r.acqErrs = int(acquired.Load()), int(failed.Load())
	r.acqRate = float64(r.acquired) / r.acqWall.Seconds()
	runtime.GC()
	runtime.ReadMemStats(&m1)
	r.heapPerLease = float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc)) / float64(max(r.acquired, 1))
	r.stackMB = float64(m1.StackInuse) / 1e6
	sc := scanLeases(leases, nil)
	r.lostAcq = sc.lost
	r.maxGoroutines = runtime.NumGoroutine()

	// Hold.
	stopProfile = startProfile(profile, "hold")
	s0, cpu0, busy0 := t.sample(), selfCPU(), machineBusy()
	holdStart := time.Now()
	every := min(max(hold/6, time.Second), 10*time.Second)
	for scans := 0; time.Since(holdStart) < hold; scans++ {
		time.Sleep(min(every, hold-time.Since(holdStart)))
		sc := scanLeases(leases, nil)
		if scans == 0 {
			r.minLeft, r.p1Left, r.medLeft = sc.min, sc.p1, sc.med
		}
		r.minLeft, r.p1Left, r.medLeft = min(r.minLeft, sc.min), min(r.p1Left, sc.p1), min(r.medLeft, sc.med)
		r.maxGoroutines = max(r.maxGoroutines, runtime.NumGoroutine())
		fmt.Fprintf(os.Stderr, "leases: held %.0fs: %d lost, validity left min %.2fs p1 %.2fs median %.2fs, %d goroutines\n",
			time.Since(holdStart).Seconds(), sc.lost, sc.min.Seconds(), sc.p1.Seconds(), sc.med.Seconds(), runtime.NumGoroutine())
	}
	s1, cpu1, busy1 := t.sample(), selfCPU(), machineBusy()
	r.holdWall = time.Since(holdStart)
	stopProfile()
	sc = scanLeases(leases, r.reasons)
	r.lostHold = sc.lost - r.lostAcq
	perLeaseTTL := float64(max(r.acquired, 1)) * r.holdWall.Seconds() / ttl.Seconds()
	per := func(a, b int64) float64 {
		if a < 0 || b < 0 {
			return -1
		}
		return float64(b-a) / perLeaseTTL
	}
	r.reqs, r.trips, r.cmds = per(s0.requests, s1.requests), per(s0.trips, s1.trips), per(s0.commands, s1.commands)
	var names []string
	for name, c := range s1.byCommand {
		if per(s0.byCommand[name], c) >= 0.01 {
			names = append(names, name)
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		return int((s1.byCommand[b] - s0.byCommand[b]) - (s1.byCommand[a] - s0.byCommand[a]))
	})
	for i, name := range names {
		if i > 0 {
			r.byCommand += ", "
		}
		r.byCommand += fmt.Sprintf("%s %.2f", name, per(s0.byCommand[name], s1.byCommand[name]))
		if calls := s1.byCommand[name] - s0.byCommand[name]; s1.usec != nil && calls > 0 {
			r.byCommand += fmt.Sprintf(" (%.1f µs each)", float64(s1.usec[name]-s0.usec[name])/float64(calls))
		}
	}
	r.wirePerTrip = -1
	if s0.trips >= 0 && s1.trips > s0.trips {
		r.wirePerTrip = float64((s1.wire - s0.wire).Microseconds()) / float64(s1.trips-s0.trips)
	}
	r.dialsPerSec = -1
	if s0.dials >= 0 && s1.dials >= 0 {
		r.dialsPerSec = float64(s1.dials-s0.dials) / r.holdWall.Seconds()
	}
	r.holdCPU = cpuShares(s0.cpu, s1.cpu, cpu0, cpu1, busy0, busy1, r.holdWall)
	r.latency = ""
	if s1.timings != nil {
		r.latency = s1.timings.since(s0.timings)
	}
	r.memPerLease = -1
	if s1.memory >= 0 {
		r.memPerLease = float64(s1.memory) / float64(max(r.acquired, 1))
	}

	// Release.
	next.Store(0)
	var released, lostRel, errRel atomic.Int64
	start = time.Now()
	progress = ticker(5*time.Second, func() {
		fmt.Fprintf(os.Stderr, "leases: %d released\n", released.Load())
	})
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				l := leases[i]
				if l == nil {
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := l.Release(ctx)
				cancel()
				switch {
				case err == nil && errors.Is(l.Err(), lock.ErrLost):
					lostRel.Add(1) // lost before its release, which then answers nil
				case err == nil:
				case errors.Is(err, lock.ErrLost):
					lostRel.Add(1)
				default:
					if errRel.Add(1) == 1 {
						errMu.Lock()
						r.relErr = oneLine(err.Error())
						errMu.Unlock()
					}
				}
				released.Add(1)
			}
		})
	}
	wg.Wait()
	progress()
	r.relWall = time.Since(start)
	r.relRate = float64(released.Load()) / r.relWall.Seconds()
	r.relLost, r.relErrs = int(lostRel.Load()), int(errRel.Load())
	return r
}

// cpuShare is the CPU the server, this process and the whole machine used
// in a period, in percent of one core; < 0: unknown.
type cpuShare struct{ server, self, machine float64 }

// cpuShares returns the shares of a period of length wall from CPU times
// at its start and its end (< 0: unknown).
func cpuShares(server0, server1, self0, self1, busy0, busy1, wall time.Duration) cpuShare {
	pct := func(a, b time.Duration) float64 {
		if a < 0 || b < 0 {
			return -1
		}
		return 100 * (b - a).Seconds() / wall.Seconds()
	}
	return cpuShare{pct(server0, server1), pct(self0, self1), pct(busy0, busy1)}
}

// String formats s as "server / bench / machine".
func (s cpuShare) String() string {
	pct := func(x float64) string {
		if x < 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.0f%%", x)
	}
	return pct(s.server) + " / " + pct(s.self) + " / " + pct(s.machine)
}

// startProfile starts a CPU profile into prefix-phase.pprof, unless
// prefix is "", and returns the function that ends it.
func startProfile(prefix, phase string) (stop func()) {
	if prefix == "" {
		return func() {}
	}
	f, err := os.Create(prefix + "-" + phase + ".pprof")
	if err != nil {
		fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fatal(fmt.Errorf("-leaseprofile: %v (with -cpuprofile too?)", err))
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// ticker calls f every d until the function it returns is called.
func ticker(d time.Duration, f func()) (stop func()) {
	done := make(chan struct{})
	var once sync.Once
	go func() {
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				f()
			case <-done:
				return
			}
		}
	}()
	return func() { once.Do(func() { close(done) }) }
}

// leaseScan is what one pass over the leases found.
type leaseScan struct {
	lost         int
	min, p1, med time.Duration // validity left of the held leases
}

// scanLeases counts the lost leases (and, when reasons is not nil, why
// they were lost) and measures the validity the held ones have left.
func scanLeases(leases []*lock.Lease, reasons map[string]int) leaseScan {
	var s leaseScan
	left := make([]time.Duration, 0, len(leases))
	now := time.Now()
	for _, l := range leases {
		if l == nil {
			continue
		}
		if err := l.Err(); err != nil {
			s.lost++
			if reasons != nil {
				reasons[reasonOf(err)]++
			}
			continue
		}
		left = append(left, l.Deadline().Sub(now))
	}
	if len(left) > 0 {
		slices.Sort(left)
		s.min, s.p1, s.med = left[0], left[len(left)/100], left[len(left)/2]
	}
	return s
}

var longNumber = regexp.MustCompile(`[0-9]{4,}`)

// reasonOf is err's message with its long numbers and quoted parts blotted
// out, so that the losses of many keys group by kind.
func reasonOf(err error) string {
	var b strings.Builder
	quoted := false
	for _, c := range err.Error() {
		switch {
		case c == '"':
			quoted = !quoted
			if quoted {
				b.WriteString(`"…"`)
			}
		case quoted:
		default:
			b.WriteRune(c)
		}
	}
	// Numbers of four digits or more (ports, durations in ns, ids) go;
	// HTTP status codes stay.
	s := longNumber.ReplaceAllString(oneLine(b.String()), "#")
	if len(s) > 240 {
		s = s[:240] + "…"
	}
	return s
}

// oneLine returns s on one line: Consul's error texts end in a newline.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// selfCPU returns the CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU returns the CPU time process pid has used, from /proc, or -1.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The command name, in parentheses, may hold spaces: count fields
	// after its closing parenthesis. utime and stime are fields 14 and 15
	// of the line, 12 and 13 after the name.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return -1
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(ut+st) * time.Second / clockTicks
}

// machineBusy returns the time every core of the machine has spent busy
// (not idle, not waiting for I/O), from /proc/stat, or -1.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return -1
	}
	var busy int64
	for i, x := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 7 { // steal, guest and guest_nice: guests are counted in user
			break
		}
		v, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return -1
		}
		busy += v
	}
	return time.Duration(busy) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ (getconf CLK_TCK): 100 on Linux.
const clockTicks = 100

// startLeaseTarget starts store's server afresh and a lock.Client on it.
func startLeaseTarget(store string, ttl time.Duration) leaseTarget {
	switch store {
	case "redis":
		return startRedisLeases(ttl, false)
	case "redis-sessions":
		return startRedisLeases(ttl, true)
	case "etcd":
		return startEtcdLeases(ttl, false)
	case "etcd-sessions":
		return startEtcdLeases(ttl, true)
	case "consul":
		return startConsulLeases(ttl, false)
	case "consul-sessions":
		return startConsulLeases(ttl, true)
	}
	fatal(fmt.Errorf("-store %q: want redis, redis-sessions, etcd, etcd-sessions, consul or consul-sessions", store))
	return leaseTarget{}
}

// tripCounter is a go-redis hook that counts the commands and scripts a
// client sends, the round trips that carry them (a pipeline is one), and
// the time those round trips take.
type tripCounter struct {
	cmds, trips, nanos atomic.Int64
}

func (c *tripCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *tripCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		c.cmds.Add(1)
		c.trips.Add(1)
		start := time.Now()
		err := next(ctx, cmd)
		c.nanos.Add(int64(time.Since(start)))
		return err
	}
}

func (c *tripCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		c.cmds.Add(int64(len(cmds)))
		c.trips.Add(1)
		start := time.Now()
		err := next(ctx, cmds)
		c.nanos.Add(int64(time.Since(start)))
		return err
	}
}

func startRedisLeases(ttl time.Duration, sessions bool) leaseTarget {
	h := &harness{}
	srv := redistest.Start(h, redistest.NoPersistence)
	opts := func() *goredis.Options {
		return &goredis.Options{
			Addr:                     srv.Addr,
			ContextTimeoutEnabled:    true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		}
	}
	hook := &tripCounter{}
	rdb := goredis.NewClient(opts())
	rdb.AddHook(hook)
	admin := goredis.NewClient(opts())
	c, err := lock.New(lockredis.New(rdb, lockredis.WithSessions(sessions)), lock.WithTTL(ttl))
	if err != nil {
		fatal(err)
	}
	sample := func() storeSample {
		// One INFO for the three sections; the commands it adds (one
		// INFO per sample) are not worth subtracting.
		info, err := admin.Info(context.Background(), "commandstats", "cpu", "memory").Result()
		if err != nil {
			fatal(err)
		}
		s := storeSample{requests: hook.cmds.Load(), trips: hook.trips.Load(), wire: time.Duration(hook.nanos.Load()), memory: -1, cpu: -1, byCommand: map[string]int64{}, usec: map[string]int64{}, dials: -1}
		var user, sys float64
		for _, line := range strings.Split(info, "\r\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			switch {
			case strings.HasPrefix(k, "cmdstat_"):
				calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
				c, _ := strconv.ParseInt(calls, 10, 64)
				s.commands += c
				name := strings.TrimPrefix(k, "cmdstat_")
				s.byCommand[name] = c
				if _, u, ok := strings.Cut(v, ",usec="); ok {
					u, _, _ = strings.Cut(u, ",")
					s.usec[name], _ = strconv.ParseInt(u, 10, 64)
				}
			case k == "used_cpu_user":
				user, _ = strconv.ParseFloat(v, 64)
			case k == "used_cpu_sys":
				sys, _ = strconv.ParseFloat(v, 64)
			case k == "used_memory":
				s.memory, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		s.cpu = time.Duration((user + sys) * float64(time.Second))
		return s
	}
	var version string
	if info, err := admin.Info(context.Background(), "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
				version = v
			}
		}
	}
	// Memory per lease counts from an empty server.
	base := sample().memory
	s0 := sample
	sample = func() storeSample {
		s := s0()
		s.memory -= base
		return s
	}
	return leaseTarget{
		desc:   fmt.Sprintf("redis-server %s on %s (no persistence)", version, srv.Addr),
		client: c,
		sample: sample,
		stop: func() {
			c.Close()
			rdb.Close()
			admin.Close()
			h.cleanup()
		},
	}
}

// etcdServerEnv makes this program run as the etcd server of the leases
// scenario: the bench's embedded server (startEtcd) in a process of its
// own, so that its heap and CPU are apart from the client's. It prints the
// server's address and serves until its stdin closes.
const etcdServerEnv = "LOCKBENCH_ETCD_SERVER"

// maybeEtcdServer runs this process as that server when etcdServerEnv says
// so, and reports whether it did.
func maybeEtcdServer() bool {
	if os.Getenv(etcdServerEnv) == "" {
		return false
	}
	addr, stop := startEtcd()
	fmt.Println(addr)
	io.Copy(io.Discard, os.Stdin) // until the parent closes it, or dies
	stop()
	return true
}

// startEtcdProcess starts this program as an etcd server and returns the
// server's address, its process id, and a function that stops it.
func startEtcdProcess() (string, int, func()) {
	exe, err := os.Executable()
	if err != nil {
		fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), etcdServerEnv+"=1")
	// The server's messages reach stderr until it is told to stop: its
	// shutdown logs errors about closed listeners that mean nothing.
	var stopping atomic.Bool
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(errPipe)
		for sc.Scan() {
			if !stopping.Load() {
				fmt.Fprintln(os.Stderr, sc.Text())
			}
		}
	}()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the bench
	in, err := cmd.StdinPipe()
	if err != nil {
		fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		fatal(err)
	}
	if err := cmd.Start(); err != nil {
		fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		fatal(fmt.Errorf("the etcd server process: %v", err))
	}
	stop := func() {
		stopping.Store(true)
		in.Close()
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	return strings.TrimSpace(line), cmd.Process.Pid, stop
}

func startEtcdLeases(ttl time.Duration, sessions bool) leaseTarget {
	addr, pid, stopServer := startEtcdProcess()
	tm := &etcdTimings{}
	cli := etcdTimedClient(addr, tm)
	b, err := locketcd.New(cli, locketcd.WithSessions(sessions))
	if err != nil {
		fatal(err)
	}
	c, err := lock.New(b, lock.WithTTL(ttl))
	if err != nil {
		fatal(err)
	}
	metrics := &http.Client{Timeout: 5 * time.Second}
	sample := func() storeSample {
		received, byMethod := etcdReceived(metrics, addr)
		snap := tm.snapshot()
		return storeSample{requests: snap.requests, trips: -1, commands: received, byCommand: byMethod, cpu: procCPU(pid), memory: -1, dials: -1, timings: &snap}
	}
	return leaseTarget{
		desc:   fmt.Sprintf("etcd v3.7.3 server %s (embedded, fsync on, in a process of its own)", addr),
		client: c,
		sample: sample,
		stop: func() {
			c.Close()
			cli.Close()
			stopServer()
		},
	}
}

// etcdTimings counts an etcd client's requests as etcdClient does (unary
// calls, streams opened, messages sent on streams) and times its unary
// calls by method and its lease keep-alives: the server answers a stream's
// keep-alives in the order it received them, so each answer is matched
// with the oldest keep-alive sent on its stream that has none yet.
type etcdTimings struct {
	mu sync.Mutex
	c  etcdCounts
}

// etcdCounts is what etcdTimings counted up to a moment.
type etcdCounts struct {
	requests int64
	unary    map[string]timing // by method
	ka       timing            // keep-alives, from send to answer
}

type timing struct {
	n     int64
	total time.Duration
}

func (t *etcdTimings) snapshot() etcdCounts {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.c
	out.unary = maps.Clone(t.c.unary)
	return out
}

func (t *etcdTimings) add(f func(c *etcdCounts)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.c.unary == nil {
		t.c.unary = map[string]timing{}
	}
	f(&t.c)
}

// since formats the mean times of the requests made after a.
func (c etcdCounts) since(a *etcdCounts) string {
	var parts []string
	mean := func(name string, b, a timing) {
		if n := b.n - a.n; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f µs (mean of %d)", name, float64((b.total-a.total).Microseconds())/float64(n), n))
		}
	}
	mean("keep-alive, send to answer on the stream,", c.ka, a.ka)
	for _, m := range slices.Sorted(maps.Keys(c.unary)) {
		mean(m[strings.LastIndexByte(m, '/')+1:], c.unary[m], a.unary[m])
	}
	return strings.Join(parts, ", ")
}

// etcdTimedClient returns a client of addr whose requests t counts and
// times.
func etcdTimedClient(addr string, t *etcdTimings) *clientv3.Client {
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		t.add(func(c *etcdCounts) { c.requests++ })
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		d := time.Since(start)
		t.add(func(c *etcdCounts) {
			x := c.unary[method]
			x.n++
			x.total += d
			c.unary[method] = x
		})
		return err
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		t.add(func(c *etcdCounts) { c.requests++ })
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &timedStream{ClientStream: s, t: t, keepAlive: strings.HasSuffix(method, "/LeaseKeepAlive")}, nil
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{addr},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)},
	})
	if err != nil {
		fatal(err)
	}
	return cli
}

// timedStream counts the messages sent on a stream and, on a keep-alive
// stream, times each answer from its request's send.
type timedStream struct {
	grpc.ClientStream
	t         *etcdTimings
	keepAlive bool
	mu        sync.Mutex
	sent      []time.Time // keep-alives without an answer yet, oldest first
}

func (s *timedStream) SendMsg(m any) error {
	s.t.add(func(c *etcdCounts) { c.requests++ })
	if s.keepAlive {
		s.mu.Lock()
		s.sent = append(s.sent, time.Now())
		s.mu.Unlock()
	}
	return s.ClientStream.SendMsg(m)
}

func (s *timedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil && s.keepAlive {
		s.mu.Lock()
		var d time.Duration
		if len(s.sent) > 0 {
			d = time.Since(s.sent[0])
			s.sent = s.sent[1:]
		}
		s.mu.Unlock()
		s.t.add(func(c *etcdCounts) {
			c.ka.n++
			c.ka.total += d
		})
	}
	return err
}

// etcdReceived returns the request messages the etcd server on addr has
// received (the sum of its grpc_server_msg_received_total: one per unary
// call, one per message on a stream), in all and by gRPC method, or -1 if
// its metrics are out of reach.
func etcdReceived(c *http.Client, addr string) (int64, map[string]int64) {
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1, nil
	}
	defer resp.Body.Close()
	var total int64
	found := false
	byMethod := map[string]int64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "grpc_server_msg_received_total{") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			continue
		}
		found = true
		total += int64(v)
		if _, m, ok := strings.Cut(line, `grpc_method="`); ok {
			m, _, _ = strings.Cut(m, `"`)
			byMethod[m] += int64(v)
		}
	}
	if !found {
		return -1, nil
	}
	return total, byMethod
}

// timedTransport counts the HTTP requests a client sends and the time
// they take, from the request to its response's headers.
type timedTransport struct {
	n, nanos atomic.Int64
	next     http.RoundTripper
}

func (t *timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.n.Add(1)
	start := time.Now()
	resp, err := t.next.RoundTrip(r)
	t.nanos.Add(int64(time.Since(start)))
	return resp, err
}

// consulIdle, when > 0, is the idle connections the Consul client of the
// leases scenario keeps per host (-consulidle); else the api package's
// default, GOMAXPROCS+1.
var consulIdle int

func startConsulLeases(ttl time.Duration, sessions bool) leaseTarget {
	addr, pid, stopAgent := startConsul()
	waitConsul(addr)
	var dials atomic.Int64
	cfg := api.DefaultConfig()
	cfg.Address = addr
	tr := cfg.Transport
	if consulIdle > 0 {
		tr.MaxIdleConnsPerHost = consulIdle
	}
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, address string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, address)
	}
	timed := &timedTransport{next: tr}
	cfg.HttpClient = &http.Client{Transport: timed}
	cli, err := api.NewClient(cfg)
	if err != nil {
		fatal(err)
	}
	b, err := lockconsul.New(cli, lockconsul.WithMinTTL(consultest.MinTTL), lockconsul.WithSessions(sessions))
	if err != nil {
		fatal(err)
	}
	c, err := lock.New(b, lock.WithTTL(ttl))
	if err != nil {
		fatal(err)
	}
	return leaseTarget{
		desc:   fmt.Sprintf("consul v1.14.11 agent %s (server, data dir), client keeping %d idle connections", addr, tr.MaxIdleConnsPerHost),
		client: c,
		sample: func() storeSample {
			// Each HTTP request is a round trip of its own.
			n := timed.n.Load()
			return storeSample{requests: n, trips: n, wire: time.Duration(timed.nanos.Load()), commands: -1, cpu: procCPU(pid), memory: -1, dials: dials.Load()}
		},
		stop: func() {
			c.Close()
			stopAgent()
		},
	}
}
