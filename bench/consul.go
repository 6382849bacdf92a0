package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock"
	lockconsul "github.com/distlock/lock/consul"
	"github.com/distlock/lock/internal/consultest"
)

// The Consul table: this library's consul backend beside api.Lock, the
// Consul client's own lock, on one agent this program starts (a server with
// a data dir: Raft writes are fsynced), in one run.
//
//	cd bench && go run . -store consul
//
// Scenarios: one goroutine acquiring and releasing one key; the hot key
// (16 goroutines, 1ms sections) with one shared client, and with 16
// separate clients (each its own lock.Client or api.Client, as separate
// processes would be). Requests per section are the HTTP requests the
// clients sent (counted by their transports) per section.

var consulPeers = []storePeer[*api.Client]{
	{"lock", newConsulLock},
	{"api.Lock, session per goroutine", newAPILockShared},
	{"api.Lock, session per lock", newAPILockOwn},
}

const consulTTL = 10 * time.Second

func newConsulLock(cli *api.Client) locker {
	b, err := lockconsul.New(cli)
	if err != nil {
		fatal(err)
	}
	c, err := lock.New(b, lock.WithTTL(consulTTL))
	if err != nil {
		fatal(err)
	}
	return lockPeer{c}
}

// apiLockPeer runs api.Lock; with sessions, each lock uses a session
// from a free list (one per goroutine at a time), else api.Lock creates
// and destroys a session per lock.
type apiLockPeer struct {
	cli      *api.Client
	shared   bool
	mu       sync.Mutex
	sessions []string
}

func newAPILockShared(cli *api.Client) locker { return &apiLockPeer{cli: cli, shared: true} }
func newAPILockOwn(cli *api.Client) locker    { return &apiLockPeer{cli: cli} }

func (p *apiLockPeer) session() (string, error) {
	p.mu.Lock()
	if n := len(p.sessions); n > 0 {
		s := p.sessions[n-1]
		p.sessions = p.sessions[:n-1]
		p.mu.Unlock()
		return s, nil
	}
	p.mu.Unlock()
	s, _, err := p.cli.Session().CreateNoChecks(&api.SessionEntry{TTL: consulTTL.String(), Behavior: api.SessionBehaviorRelease}, nil)
	if err == nil {
		// As an application that keeps a session per goroutine would:
		// renewed in the background for the whole run.
		go p.cli.Session().RenewPeriodic(consulTTL.String(), s, nil, nil)
	}
	return s, err
}

func (p *apiLockPeer) lock(ctx context.Context, key string, once bool) (func(context.Context) error, error) {
	opts := &api.LockOptions{Key: key, LockTryOnce: once, SessionTTL: consulTTL.String()}
	var sess string
	if p.shared {
		s, err := p.session()
		if err != nil {
			return nil, err
		}
		sess, opts.Session = s, s
	}
	l, err := p.cli.LockOpts(opts)
	if err != nil {
		return nil, err
	}
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-stop:
		}
	}()
	defer close(stop)
	lost, err := l.Lock(ctx.Done())
	if err == nil && lost == nil {
		err = fmt.Errorf("api.Lock: %s not acquired", key)
	}
	if err != nil {
		p.put(sess)
		return nil, err
	}
	return func(context.Context) error {
		err := l.Unlock()
		p.put(sess)
		return err
	}, nil
}

func (p *apiLockPeer) put(sess string) {
	if sess == "" {
		return
	}
	p.mu.Lock()
	p.sessions = append(p.sessions, sess)
	p.mu.Unlock()
}

func (p *apiLockPeer) try(ctx context.Context, key string) (func(context.Context) error, error) {
	return p.lock(ctx, key, true)
}

func (p *apiLockPeer) wait(ctx context.Context, key string) (func(context.Context) error, error) {
	return p.lock(ctx, key, false)
}

// countingTransport counts the HTTP requests a client sends.
type countingTransport struct {
	n    *atomic.Int64
	next http.RoundTripper
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// consulClient returns a client of addr with its own transport, counting
// its requests in n.
func consulClient(addr string, n *atomic.Int64) *api.Client {
	cfg := api.DefaultConfig()
	cfg.Address = addr
	cfg.HttpClient = &http.Client{Transport: countingTransport{n: n, next: cfg.Transport}}
	cli, err := api.NewClient(cfg)
	if err != nil {
		fatal(err)
	}
	return cli
}

// sepResult is one measurement of a hot key contended by separate clients.
type sepResult struct {
	util    float64 // percent
	reqs    float64 // client requests per section
	cmds    float64 // store commands per section (Redis only)
	gap     float64 // median µs from one section's end to the next one's start
	busiest float64 // percent of the sections the busiest client ran (100/16 is fair)
}

// hotSeparate is hot with a locker per goroutine.
func hotSeparate(lockers []locker, n *atomic.Int64, d time.Duration) sepResult {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	key := fmt.Sprintf("bench/hot/%d", run.Add(1))
	var sections atomic.Int64
	var lastEnd atomic.Int64 // UnixNano of the last section's end
	var mu sync.Mutex
	var gaps []float64
	per := make([]int64, len(lockers))
	before := n.Load()
	start := time.Now()
	var wg sync.WaitGroup
	for i, l := range lockers {
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
				per[i]++
				lastEnd.Store(time.Now().UnixNano())
				unlock(context.Background())
			}
		})
	}
	wg.Wait()
	s := max(sections.Load(), 1)
	return sepResult{
		util:    100 * float64(s) * float64(time.Millisecond) / float64(time.Since(start)),
		reqs:    float64(n.Load()-before) / float64(s),
		gap:     median(gaps),
		busiest: 100 * float64(slices.Max(per)) / float64(s),
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// startConsul starts a single-server agent with a data dir on free ports
// and returns its HTTP address, its process id and a function that stops
// it.
func startConsul() (string, int, func()) {
	bin := os.Getenv("LOCK_CONSUL_BIN")
	if bin == "" {
		out, err := exec.Command("../scripts/build-consul").Output()
		if err != nil {
			fatal(fmt.Errorf("scripts/build-consul: %v", err))
		}
		bin = strings.TrimSpace(string(out))
	}
	dir, err := os.MkdirTemp("", "lockbench-consul")
	if err != nil {
		fatal(err)
	}
	var ports [4]int
	var lns []net.Listener
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fatal(err)
		}
		lns = append(lns, ln)
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	for _, ln := range lns {
		ln.Close()
	}
	cmd := exec.Command(bin, consultest.AgentArgs(bin, filepath.Join(dir, "data"), strconv.Itoa(ports[0]), [3]int{ports[1], ports[2], ports[3]})[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the bench, even on fatal
	if err := cmd.Start(); err != nil {
		fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	stop := func() {
		if cmd.Process != nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		os.RemoveAll(dir)
	}
	return addr, cmd.Process.Pid, stop
}

// runConsul prints the Consul table.
func runConsul(rounds int, dur, hotDur time.Duration, want func(string) bool) {
	addr, _, stop := startConsul()
	defer stop()
	waitConsul(addr)
	fmt.Printf("consul agent %s (server, data dir), %d rounds, GOMAXPROCS %d\n\n", addr, rounds, runtimeProcs())
	med := runNetworked(networked(consulPeers, func(n *atomic.Int64) *api.Client { return consulClient(addr, n) }), rounds, dur, hotDur, want)
	printRatio("lock / api.Lock (session per goroutine), one goroutine: %.2fx (target 1.0x)\n", med[0][0], med[1][0])
	printRatio("lock / api.Lock (session per lock), one goroutine: %.2fx (target 1.5x)\n", med[0][0], med[2][0])
	printRatio("hot key utilisation, one client: lock / api.Lock %.2fx (target 3x)\n", med[0][1], max(med[1][1], med[2][1]))
	printRatio("hot key utilisation, 16 clients: lock / api.Lock %.2fx (target 3x)\n", med[0][2], max(med[1][2], med[2][2]))
}

// storePeer makes lockers over clients of one store's client library: one
// per call of new.
type storePeer[C any] struct {
	name string
	new  func(cli C) locker
}

// networked turns peers into networkedPeers whose lockers each get a new
// client from client, counting requests in the counter it is given.
func networked[C any](peers []storePeer[C], client func(n *atomic.Int64) C) []networkedPeer {
	out := make([]networkedPeer, len(peers))
	for i, p := range peers {
		out[i] = networkedPeer{p.name, func(n *atomic.Int64) locker { return p.new(client(n)) }}
	}
	return out
}

// networkedPeer makes a locker over a new client of a networked store,
// counting the client's requests in n.
type networkedPeer struct {
	name string
	new  func(n *atomic.Int64) locker
}

// runNetworked measures peers in interleaved rounds (one goroutine; the hot
// key through one shared client and through 16 separate clients), prints
// the table, and returns each peer's medians: cycles/s, utilisation with
// one client, utilisation with 16 clients, requests per section with 16.
// Scenarios that want rejects are skipped (their medians are 0).
func runNetworked(peers []networkedPeer, rounds int, dur, hotDur time.Duration, want func(string) bool) [][4]float64 {
	type state struct {
		one, shared, sep, sepReqs []float64
		l                         locker
		sepLockers                []locker
		sepN                      *atomic.Int64
	}
	states := make([]*state, len(peers))
	for i, p := range peers {
		st := &state{sepN: &atomic.Int64{}}
		st.l = p.new(&atomic.Int64{})
		for range 16 {
			st.sepLockers = append(st.sepLockers, p.new(st.sepN))
		}
		states[i] = st
		cycles(st.l, 1, 200*time.Millisecond) // warm up
	}
	for r := 0; r < rounds; r++ {
		for k := range peers {
			i := (k + r) % len(peers)
			st := states[i]
			if want("one") {
				st.one = append(st.one, cycles(st.l, 1, dur))
			}
			if want("hot") {
				u, _, _ := hot(st.l, &counter{}, hotDur)
				st.shared = append(st.shared, u)
			}
			if want("sep") {
				r2 := hotSeparate(st.sepLockers, st.sepN, hotDur)
				st.sep, st.sepReqs = append(st.sep, r2.util), append(st.sepReqs, r2.reqs)
			}
			fmt.Fprintf(os.Stderr, "round %d/%d: %s done\n", r+1, rounds, peers[i].name)
		}
	}
	fmt.Println("| peer | one goroutine, cycles/s | hot key, one client: utilisation | hot key, 16 clients: utilisation | 16 clients: requests per section |")
	fmt.Println("|---|---|---|---|---|")
	med := make([][4]float64, len(peers))
	for i, p := range peers {
		st := states[i]
		med[i] = [4]float64{median(st.one), median(st.shared), median(st.sep), median(st.sepReqs)}
		fmt.Printf("| %s | %.0f | %.1f%% | %.1f%% | %.1f |\n", p.name, med[i][0], med[i][1], med[i][2], med[i][3])
	}
	fmt.Println()
	return med
}

// printRatio prints a/b with format, unless a scenario was skipped (0).
func printRatio(format string, a, b float64) {
	if a > 0 && b > 0 {
		fmt.Printf(format, a/b)
	}
}

// waitConsul waits until the agent has a leader and its node is registered.
func waitConsul(addr string) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if consultest.Ready(addr) {
			return
		}
		time.Sleep(50 * time.Millisecond) // poll the starting agent
	}
	fatal(fmt.Errorf("consul agent on %s not ready within a minute", addr))
}
