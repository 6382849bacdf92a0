package redis_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

func TestMain(m *testing.M) {
	conformance.MaybeContend() // a fault run's helper process
	maybeQueueHelper()         // TestQueueAcrossProcesses's waiter process
	goleak.VerifyTestMain(m)
}

// newGoRedis returns a test client of addr (see redistest.Client).
func newGoRedis(t testing.TB, addr string) *goredis.Client { return redistest.Client(t, addr) }

// proxied hands out clients that each reach the servers through their own
// TCP proxies, so one client can be cut off.
type proxied struct {
	t        *testing.T
	requests requestCount
	mu       sync.Mutex
	proxies  map[backend.Backend][]*faultproxy.Proxy
}

func (p *proxied) clientsOf(addrs []string) ([]*goredis.Client, []*faultproxy.Proxy) {
	var rdbs []*goredis.Client
	var proxies []*faultproxy.Proxy
	for _, a := range addrs {
		px := faultproxy.Start(p.t, a)
		proxies = append(proxies, px)
		rdb := newGoRedis(p.t, px.Addr)
		rdb.AddHook(&p.requests)
		rdbs = append(rdbs, rdb)
	}
	return rdbs, proxies
}

// Requests implements conformance.RequestCounter: the commands and
// scripts the harness's clients sent (pub/sub subscriptions aside).
func (p *proxied) Requests() int64 { return p.requests.n.Load() }

// requestCount is a go-redis hook that counts requests.
type requestCount struct{ n atomic.Int64 }

func (c *requestCount) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *requestCount) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *requestCount) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func (p *proxied) remember(b backend.Backend, proxies []*faultproxy.Proxy) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proxies == nil {
		p.proxies = map[backend.Backend][]*faultproxy.Proxy{}
	}
	p.proxies[b] = proxies
}

func (p *proxied) Disconnect(_ context.Context, b backend.Backend) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, px := range p.proxies[b] {
		px.Cut()
	}
	return nil
}

func (p *proxied) Reconnect(_ context.Context, b backend.Backend) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, px := range p.proxies[b] {
		px.Heal()
	}
	return nil
}

// HoldReplies, DeliverReplies and DropReplies act on the server-to-client
// direction of b's proxies: requests still reach the servers.
func (p *proxied) HoldReplies(_ context.Context, b backend.Backend) error {
	return p.each(b, func(px *faultproxy.Proxy) { px.Hold(faultproxy.ToClient) })
}

func (p *proxied) DeliverReplies(_ context.Context, b backend.Backend) error {
	return p.each(b, func(px *faultproxy.Proxy) { px.Deliver(faultproxy.ToClient) })
}

func (p *proxied) DropReplies(_ context.Context, b backend.Backend) error {
	return p.each(b, func(px *faultproxy.Proxy) {
		px.Reset() // held replies go with the connections
		px.Deliver(faultproxy.ToClient)
	})
}

func (p *proxied) Delay(_ context.Context, b backend.Backend, d time.Duration) error {
	return p.each(b, func(px *faultproxy.Proxy) { px.Delay(faultproxy.Both, d) })
}

func (p *proxied) Undelay(_ context.Context, b backend.Backend) error {
	return p.each(b, func(px *faultproxy.Proxy) { px.Delay(faultproxy.Both, 0) })
}

func (p *proxied) ResetConns(_ context.Context, b backend.Backend) error {
	return p.each(b, (*faultproxy.Proxy).Reset)
}

func (p *proxied) each(b backend.Backend, f func(*faultproxy.Proxy)) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, px := range p.proxies[b] {
		f(px)
	}
	return nil
}

var (
	_ conformance.ReplyHolder  = (*singleHarness)(nil)
	_ conformance.ReplyHolder  = (*redlockHarness)(nil)
	_ conformance.Disconnecter = (*singleHarness)(nil)
)

// singleHarness is one redis-server.
type singleHarness struct {
	proxied
	srv        *redistest.Server
	durable    bool
	slotFences bool
	sessions   bool
}

func (h *singleHarness) NewBackend(context.Context) (backend.Backend, error) {
	rdbs, proxies := h.clientsOf([]string{h.srv.Addr})
	b := &ownsClients{redis.New(rdbs[0], redis.WithDurableFence(h.durable), redis.WithSlotFenceCounters(h.slotFences), redis.WithSessions(h.sessions), redis.WithMaxTTL(harnessMaxTTL)), rdbs, proxies}
	h.remember(b, proxies)
	return b, nil
}

// ownsClients closes its go-redis clients with the backend, as a process
// that exits would: the suite checks that a closed client leaves nothing.
type ownsClients struct {
	*redis.Backend
	rdbs    []*goredis.Client
	proxies []*faultproxy.Proxy
}

func (o *ownsClients) Close() error {
	err := o.Backend.Close()
	closeAll(o.rdbs, o.proxies)
	return err
}

// closeAll closes a backend's go-redis clients and its proxies, as the exit
// of its process would.
func closeAll(rdbs []*goredis.Client, proxies []*faultproxy.Proxy) {
	for _, c := range rdbs {
		c.Close()
	}
	for _, p := range proxies {
		p.Close()
	}
}

func (h *singleHarness) Capabilities() backend.Capabilities {
	c := redis.New(nil, redis.WithDurableFence(h.durable), redis.WithMaxTTL(harnessMaxTTL)).Capabilities()
	c.FixedTTL = h.sessions // a session is for locks of one TTL
	return c
}

// ContenderURL implements conformance.ProcessContenders: helper processes
// reach the server directly, with the harness's maximum TTL.
func (h *singleHarness) ContenderURL(context.Context) (string, error) {
	return fmt.Sprintf("redis://%s?maxttl=%v", h.srv.Addr, harnessMaxTTL), nil
}

func (h *singleHarness) Pause(context.Context) error  { h.srv.Stop(); return nil }
func (h *singleHarness) Resume(context.Context) error { h.srv.Continue(); return nil }

func (h *singleHarness) Restart(_ context.Context, keepData bool) error {
	h.srv.Restart(keepData)
	return nil
}

var (
	_ conformance.Pauser       = (*singleHarness)(nil)
	_ conformance.Disconnecter = (*singleHarness)(nil)
	_ conformance.Restarter    = (*singleHarness)(nil)
	_ conformance.Evicter      = (*singleHarness)(nil)
	_ conformance.Evicter      = (*redlockHarness)(nil)
	_ conformance.Evicter      = (*clusterHarness)(nil)
)

// evictedKeys returns the Redis keys that the lock on key loses when Redis
// expires it, or evicts it under a volatile-* maxmemory policy: the keys
// that carry the lock's own expiry (renewals and sessions' walks extend
// them together; see the package doc's Keys): the lock "lock:{KEY}", its
// next key ":next" and its holder key ":h", and with slot fence counters
// its fence key ":fence", which then only records the holder's fence, with
// the lock's expiry. Everything else stays as an expiry leaves it: the
// fence counter (the key's ":fence" without slot counters, or the slot's
// counter), which has no expiry and must keep fences growing; the
// waiters' queue ":q" and records ":w:ID", which live by their waiters'
// refreshes; the tombstones of dead tokens; and with sessions the
// session's key and lock table (the session lives on, and its next walk
// drops the lock from the table, as after an expiry). The holder's token
// has no tombstone, so it stays alive, as Evicter asks.
func evictedKeys(key string, slotFences bool) []string {
	lk := redis.KeysOf(redis.DefaultPrefix, key)[0]
	ks := []string{lk, lk + ":next", lk + ":h"}
	if slotFences {
		ks = append(ks, lk+":fence")
	}
	return ks
}

// Evict implements conformance.Evicter: a DEL of the keys an expiry of
// the lock removes (evictedKeys), by a raw client of the server, not the
// backend's release, which would kill the token and publish a wake-up.
// An expiry wakes nobody: waiters learn of it from their own refreshes.
func (h *singleHarness) Evict(ctx context.Context, key string) error {
	rdb := newGoRedis(h.t, h.srv.Addr)
	defer rdb.Close()
	return rdb.Del(ctx, evictedKeys(key, h.slotFences)...).Err()
}

// Evict implements conformance.Evicter: every node loses the lock, as
// when its expiry (the same PX on every node) passes on all of them; see
// singleHarness.Evict.
func (h *redlockHarness) Evict(ctx context.Context, key string) error {
	for _, s := range h.srvs {
		rdb := newGoRedis(h.t, s.Addr)
		err := rdb.Del(ctx, evictedKeys(key, false)...).Err()
		rdb.Close()
		if err != nil {
			return fmt.Errorf("node %s: %w", s.Addr, err)
		}
	}
	return nil
}

// The single-node backend on a server with appendfsync always: the
// configuration in which it declares its fences durable.
func TestConformanceSingleNode(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		return &singleHarness{proxied: proxied{t: t}, srv: redistest.Start(t, redistest.AOFAlways), durable: true}
	}, conformance.RequireHooks())
}

// The same with fences from slot counters (WithSlotFenceCounters).
func TestConformanceSingleNodeSlotFences(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		return &singleHarness{proxied: proxied{t: t}, srv: redistest.Start(t, redistest.AOFAlways), durable: true, slotFences: true}
	}, conformance.RequireHooks())
}

// The same with sessions (WithSessions): the leases that renew themselves
// share a session per TTL.
func TestConformanceSingleNodeSessions(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		return &singleHarness{proxied: proxied{t: t}, srv: redistest.Start(t, redistest.AOFAlways), durable: true, sessions: true}
	}, conformance.RequireHooks())
}

// redlockHarness is N independent redis-servers.
type redlockHarness struct {
	proxied
	srvs []*redistest.Server
}

// redlockNodeTimeout is generous: under -race, with other test packages
// running beside it, a 10,000-key burst saw stalls past 150ms.
const redlockNodeTimeout = 500 * time.Millisecond

// harnessNodeTimeout is the node timeout of the conformance harness's
// Redlock, longer still: its nodes fsync every write (appendfsync always),
// and in one CI run a disk stall held three of five nodes past 500ms at
// once, so that MutualExclusion's Acquire failed with no quorum (the store
// was down for that long; the library said so, as it should).
const harnessNodeTimeout = 2 * time.Second

func newRedlockHarness(t *testing.T, n int, mode string) *redlockHarness {
	h := &redlockHarness{proxied: proxied{t: t}}
	for i := 0; i < n; i++ {
		h.srvs = append(h.srvs, redistest.Start(t, mode))
	}
	initNodes(t, h.srvs)
	return h
}

func (h *redlockHarness) addrs() []string {
	var out []string
	for _, s := range h.srvs {
		out = append(out, s.Addr)
	}
	return out
}

func (h *redlockHarness) NewBackend(context.Context) (backend.Backend, error) {
	rdbs, proxies := h.clientsOf(h.addrs())
	nodes := make([]redis.Conn, len(rdbs))
	for i, c := range rdbs {
		nodes[i] = c
	}
	r, err := redis.NewRedlock(nodes, redis.WithDurableFence(true), redis.WithNodeTimeout(harnessNodeTimeout), redis.WithMaxTTL(harnessMaxTTL))
	if err != nil {
		return nil, err
	}
	b := &ownsRedlockClients{r, rdbs, proxies}
	h.remember(b, proxies)
	return b, nil
}

type ownsRedlockClients struct {
	*redis.Redlock
	rdbs    []*goredis.Client
	proxies []*faultproxy.Proxy
}

func (o *ownsRedlockClients) Close() error {
	err := o.Redlock.Close()
	closeAll(o.rdbs, o.proxies)
	return err
}

func (h *redlockHarness) Capabilities() backend.Capabilities {
	// The single node's declaration (every node expires by its own PX, and
	// the fence is durable with appendfsync always), with the same maximum
	// TTL; Redlock does not queue waiters, so no FIFO.
	c := redis.New(nil, redis.WithDurableFence(true), redis.WithMaxTTL(harnessMaxTTL)).Capabilities()
	c.FIFO = false
	return c
}

// harnessMaxTTL is the harnesses' maximum TTL, raised from the default
// (redis.DefaultMaxTTL): above every TTL the suite uses (ManyKeys takes
// 2m, so that none of its 10,000 leases needs a renewal).
const harnessMaxTTL = 10 * time.Minute

// ContenderURL implements conformance.ProcessContenders: helper processes
// reach the nodes directly, with the harness's node timeout and maximum TTL.
func (h *redlockHarness) ContenderURL(context.Context) (string, error) {
	return fmt.Sprintf("redlock://%s?nodetimeout=%v&maxttl=%v", strings.Join(h.addrs(), ","), harnessNodeTimeout, harnessMaxTTL), nil
}

func (h *redlockHarness) Pause(context.Context) error {
	for _, s := range h.srvs {
		s.Stop()
	}
	return nil
}

func (h *redlockHarness) Resume(context.Context) error {
	for _, s := range h.srvs {
		s.Continue()
	}
	return nil
}

func (h *redlockHarness) Restart(_ context.Context, keepData bool) error {
	for _, s := range h.srvs {
		s.Restart(keepData)
	}
	return nil
}

// Redlock over 3 and 5 nodes, each with appendfsync always.
func TestConformanceRedlock3(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		return newRedlockHarness(t, 3, redistest.AOFAlways)
	}, conformance.RequireHooks())
}

func TestConformanceRedlock5(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		return newRedlockHarness(t, 5, redistest.AOFAlways)
	}, conformance.RequireHooks())
}

// Seeded randomized fault runs (conformance.RunFaults): the single node with
// appendfsync always, and Redlock over 3 nodes.
func TestFaultRunsSingleNode(t *testing.T) {
	conformance.RunFaults(t, func(t *testing.T) conformance.Harness {
		return &singleHarness{proxied: proxied{t: t}, srv: redistest.Start(t, redistest.AOFAlways), durable: true}
	})
}

func TestFaultRunsSingleNodeSessions(t *testing.T) {
	conformance.RunFaults(t, func(t *testing.T) conformance.Harness {
		return &singleHarness{proxied: proxied{t: t}, srv: redistest.Start(t, redistest.AOFAlways), durable: true, sessions: true}
	})
}

func TestFaultRunsRedlock3(t *testing.T) {
	conformance.RunFaults(t, func(t *testing.T) conformance.Harness {
		return newRedlockHarness(t, 3, redistest.AOFAlways)
	})
}

// The negative control under faults: the same runs over a wrapper with a
// known flaw must find it.
func TestFaultRunsCatchFlaws(t *testing.T) {
	conformance.RunFlawControls(t, func(t *testing.T) conformance.Harness {
		return &singleHarness{proxied: proxied{t: t}, srv: redistest.Start(t, redistest.AOFAlways), durable: true}
	}, 10, nil, conformance.FaultDuration(5*time.Second), conformance.FaultContenders(6))
}
