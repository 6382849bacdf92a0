package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/distlock/lock"
	locketcd "github.com/distlock/lock/etcd"
)

// The etcd table: this library's etcd backend beside
// go.etcd.io/etcd/client/v3/concurrency.Mutex, on one embedded etcd server
// this program starts (fsync on), in one run.
//
//	cd bench && go run . -store etcd
//
// Scenarios as for Consul; requests per section are the gRPC calls the
// clients made, the streams they opened and the messages they sent on
// streams (keep-alives, watch requests), counted by interceptors, per
// section.

var etcdPeers = []storePeer[*clientv3.Client]{
	{"lock", newEtcdLock},
	{"concurrency.Mutex, session per goroutine", newMutexShared},
	{"concurrency.Mutex, session per lock", newMutexOwn},
}

const etcdTTL = 10 * time.Second

func newEtcdLock(cli *clientv3.Client) locker {
	b, err := locketcd.New(cli)
	if err != nil {
		fatal(err)
	}
	c, err := lock.New(b, lock.WithTTL(etcdTTL))
	if err != nil {
		fatal(err)
	}
	return lockPeer{c}
}

// mutexPeer runs concurrency.Mutex; with shared sessions each lock uses a
// session from a free list (one per goroutine at a time, kept alive by the
// client), else a session is created and closed per lock.
type mutexPeer struct {
	cli      *clientv3.Client
	shared   bool
	mu       sync.Mutex
	sessions []*concurrency.Session
}

func newMutexShared(cli *clientv3.Client) locker { return &mutexPeer{cli: cli, shared: true} }
func newMutexOwn(cli *clientv3.Client) locker    { return &mutexPeer{cli: cli} }

func (p *mutexPeer) session() (*concurrency.Session, error) {
	if p.shared {
		p.mu.Lock()
		if n := len(p.sessions); n > 0 {
			s := p.sessions[n-1]
			p.sessions = p.sessions[:n-1]
			p.mu.Unlock()
			return s, nil
		}
		p.mu.Unlock()
	}
	return concurrency.NewSession(p.cli, concurrency.WithTTL(int(etcdTTL/time.Second)))
}

func (p *mutexPeer) done(s *concurrency.Session) {
	if !p.shared {
		s.Close()
		return
	}
	p.mu.Lock()
	p.sessions = append(p.sessions, s)
	p.mu.Unlock()
}

func (p *mutexPeer) lock(ctx context.Context, key string, try bool) (func(context.Context) error, error) {
	s, err := p.session()
	if err != nil {
		return nil, err
	}
	m := concurrency.NewMutex(s, "/"+key)
	if try {
		err = m.TryLock(ctx)
	} else {
		err = m.Lock(ctx)
	}
	if err != nil {
		p.done(s)
		return nil, err
	}
	return func(ctx context.Context) error {
		err := m.Unlock(ctx)
		p.done(s)
		return err
	}, nil
}

func (p *mutexPeer) try(ctx context.Context, key string) (func(context.Context) error, error) {
	return p.lock(ctx, key, true)
}

func (p *mutexPeer) wait(ctx context.Context, key string) (func(context.Context) error, error) {
	return p.lock(ctx, key, false)
}

// startEtcd starts an embedded one-member etcd with fsync on.
func startEtcd() (string, func()) {
	dir, err := os.MkdirTemp("", "lockbench-etcd")
	if err != nil {
		fatal(err)
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.LogLevel = "error"
	cu, _ := url.Parse("http://127.0.0.1:0")
	pu, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fatal(err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		fatal(fmt.Errorf("embedded etcd not ready within a minute"))
	}
	return e.Clients[0].Addr().String(), func() { e.Close(); os.RemoveAll(dir) }
}

// etcdClient returns a client of addr counting its gRPC calls in n.
func etcdClient(addr string, n *atomic.Int64) *clientv3.Client {
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	countStream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		n.Add(1) // opening a stream counts once, and each message sent on it once
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return countingStream{s, n}, nil
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{addr},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count), grpc.WithChainStreamInterceptor(countStream)},
	})
	if err != nil {
		fatal(err)
	}
	return cli
}

// runEtcd prints the etcd table.
func runEtcd(rounds int, dur, hotDur time.Duration, want func(string) bool) {
	addr, stop := startEtcd()
	defer stop()
	fmt.Printf("embedded etcd %s (fsync on), %d rounds, GOMAXPROCS %d\n\n", addr, rounds, runtimeProcs())
	if want("one") || want("hot") || want("sep") {
		med := runNetworked(networked(etcdPeers, func(n *atomic.Int64) *clientv3.Client { return etcdClient(addr, n) }), rounds, dur, hotDur, want)
		printRatio("lock / Mutex (session per goroutine), one goroutine: %.2fx (target 1.0x)\n", med[0][0], med[1][0])
		printRatio("lock / Mutex (session per lock), one goroutine: %.2fx (target 2x)\n", med[0][0], med[2][0])
		printRatio("hot key utilisation, one client: lock / Mutex %.2fx (target 1.5x)\n", med[0][1], max(med[1][1], med[2][1]))
		printRatio("hot key utilisation, 16 clients: lock / Mutex %.2fx (target 1.5x)\n", med[0][2], max(med[1][2], med[2][2]))
		if med[0][3] > 0 {
			fmt.Printf("lock's requests per section with 16 clients: %.1f (target <= 3)\n", med[0][3])
		}
		fmt.Println()
	}
	if want("ops") {
		etcdOps(addr, 1000)
	}
}

// countingStream counts the messages a client sends on a stream: lease
// keep-alives and watch requests share long-lived streams, and each is a
// request to the server.
type countingStream struct {
	grpc.ClientStream
	n *atomic.Int64
}

func (c countingStream) SendMsg(m any) error {
	c.n.Add(1)
	return c.ClientStream.SendMsg(m)
}

// etcdOps prints how long each request of a one-goroutine cycle takes, for
// this library and for Mutex, beside bare-client patterns that show what
// the server charges for each way of releasing a lock: this library's
// transactions, its release without the token's tombstone, Mutex's blind
// DeleteRange, and a layout that never deletes the key (acquire guarded by
// the key's mod revision, release overwriting it with a released marker).
// Each cycle runs every pattern once, in a new random order, n cycles in
// all, on one server, so that neither the disk's drift nor the request
// that went before favours one pattern. One goroutine's cycle rate is the
// inverse of its mean cycle, so the last table compares means.
func etcdOps(addr string, n int) {
	ctx := context.Background()
	l := newEtcdLock(etcdClient(addr, &atomic.Int64{})).(lockPeer)
	s, err := concurrency.NewSession(etcdClient(addr, &atomic.Int64{}), concurrency.WithTTL(int(etcdTTL/time.Second)))
	if err != nil {
		fatal(err)
	}
	defer s.Close()
	raw := etcdClient(addr, &atomic.Int64{})
	grant := func() clientv3.LeaseID {
		resp, err := raw.Grant(ctx, 3600) // outlives the measurement, not kept alive
		if err != nil {
			fatal(err)
		}
		return resp.ID
	}
	lease, tombs := grant(), grant()
	defer raw.Revoke(ctx, lease)
	defer raw.Revoke(ctx, tombs)
	key := fmt.Sprintf("bench-ops:%d", run.Add(1))
	commit := func(txn clientv3.Txn) (*clientv3.TxnResponse, error) {
		resp, err := txn.Commit()
		if err == nil && !resp.Succeeded {
			err = fmt.Errorf("bench: a transaction of the ops scenario failed its comparisons")
		}
		return resp, err
	}
	// The lock's acquire transaction as a bare client sends it: the key,
	// the token's tombstone and the queue checked.
	acquireTxn := func(c *clientv3.Client, k, token string) error {
		_, err := commit(c.Txn(ctx).If(
			clientv3.Compare(clientv3.CreateRevision(k), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(k+":tomb:"+token), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(k+":q/"), "=", 0).WithPrefix(),
		).Then(clientv3.OpPut(k, token, clientv3.WithLease(lease))).Else(clientv3.OpGet(k+":tomb:"+token, clientv3.WithCountOnly())))
		return err
	}
	type pattern struct {
		name, acquire, release string
		run                    func(c *clientv3.Client, i int, timed func(j int, f func() error))
	}
	var markRev int64 // the marker key's mod revision, after its last release
	patterns := []pattern{
		{"this library", "lock: TryAcquire", "lock: Release", func(c *clientv3.Client, i int, timed func(int, func() error)) {
			var unlock func(context.Context) error
			timed(0, func() (err error) { unlock, err = l.try(ctx, key+":lock"); return err })
			timed(1, func() error { return unlock(ctx) })
		}},
		{"concurrency.Mutex", "Mutex: TryLock", "Mutex: Unlock", func(c *clientv3.Client, i int, timed func(int, func() error)) {
			m := concurrency.NewMutex(s, "/"+key+":mutex")
			timed(0, func() error { return m.TryLock(ctx) })
			timed(1, func() error { return m.Unlock(ctx) })
		}},
		{"bare: this library's two transactions", "bare: the lock's acquire transaction", "bare: the lock's release transaction (guarded delete, token's tombstone)", func(c *clientv3.Client, i int, timed func(int, func() error)) {
			k, token := key+":txn", fmt.Sprintf("%032x", i)
			timed(0, func() error { return acquireTxn(c, k, token) })
			timed(1, func() error {
				_, err := commit(c.Txn(ctx).If(clientv3.Compare(clientv3.Value(k), "=", token)).Then(
					clientv3.OpDelete(k, clientv3.WithPrevKV()), clientv3.OpPut(k+":tomb:"+token, "1", clientv3.WithLease(tombs))))
				return err
			})
		}},
		{"bare: this library's, without the tombstone", "bare: the lock's acquire transaction (for the release below)", "bare: delete guarded by the token, no tombstone", func(c *clientv3.Client, i int, timed func(int, func() error)) {
			k, token := key+":notomb", fmt.Sprintf("%032x", i)
			timed(0, func() error { return acquireTxn(c, k, token) })
			timed(1, func() error {
				_, err := commit(c.Txn(ctx).If(clientv3.Compare(clientv3.Value(k), "=", token)).Then(clientv3.OpDelete(k)))
				return err
			})
		}},
		{"bare: put, blind delete (Mutex's requests without its queue read)", "bare: put", "bare: blind delete (DeleteRange, as Mutex)", func(c *clientv3.Client, i int, timed func(int, func() error)) {
			k := key + ":blind"
			timed(0, func() error { _, err := c.Put(ctx, k, "token", clientv3.WithLease(lease)); return err })
			timed(1, func() error { _, err := c.Delete(ctx, k); return err })
		}},
		{"bare: a key never deleted", "bare, key never deleted: acquire guarded by its mod revision", "bare, key never deleted: release writes a released marker", func(c *clientv3.Client, i int, timed func(int, func() error)) {
			k, token := key+":marker", fmt.Sprintf("%032x", i)
			timed(0, func() error {
				_, err := commit(c.Txn(ctx).If(
					clientv3.Compare(clientv3.ModRevision(k), "=", markRev),
					clientv3.Compare(clientv3.CreateRevision(k+":q/"), "=", 0).WithPrefix(),
				).Then(clientv3.OpPut(k, token, clientv3.WithLease(lease))).Else(clientv3.OpGet(k)))
				return err
			})
			timed(1, func() error {
				resp, err := commit(c.Txn(ctx).If(clientv3.Compare(clientv3.Value(k), "=", token)).Then(
					clientv3.OpPut(k, "-"+token, clientv3.WithLease(tombs))))
				if err == nil {
					markRev = resp.Header.Revision
				}
				return err
			})
		}},
	}
	// Each bare pattern has a client of its own, as the lock and Mutex (the
	// first two) have: a connection is quicker the more often it is used.
	clients := make([]*clientv3.Client, len(patterns))
	for p := 2; p < len(patterns); p++ {
		clients[p] = etcdClient(addr, &atomic.Int64{})
		defer clients[p].Close()
	}
	took := make([][2][]time.Duration, len(patterns))
	for i := range n {
		for _, p := range rand.Perm(len(patterns)) {
			patterns[p].run(clients[p], i, func(j int, f func() error) {
				start := time.Now()
				if err := f(); err != nil {
					fatal(err)
				}
				took[p][j] = append(took[p][j], time.Since(start))
			})
		}
	}
	mean := func(d []time.Duration) float64 {
		var sum time.Duration
		for _, x := range d {
			sum += x
		}
		return float64(sum) / float64(len(d)) / 1e3
	}
	fmt.Printf("| request (%d each, shuffled in each cycle) | median | mean |\n|---|---|---|\n", n)
	for p, pat := range patterns {
		for j, name := range []string{pat.acquire, pat.release} {
			d := took[p][j]
			slices.Sort(d)
			fmt.Printf("| %s | %.0f µs | %.0f µs |\n", name, float64(d[len(d)/2])/1e3, mean(d))
		}
	}
	fmt.Printf("\n| one-goroutine cycle (mean acquire + mean release) | µs | rate vs Mutex |\n|---|---|---|\n")
	mutex := mean(took[1][0]) + mean(took[1][1])
	for p, pat := range patterns {
		c := mean(took[p][0]) + mean(took[p][1])
		fmt.Printf("| %s | %.0f | %.2fx |\n", pat.name, c, mutex/c)
	}
}
