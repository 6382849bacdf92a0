package redis_test

import (
	"context"
	"sync"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/internal/tcpproxy"
	"github.com/distlock/lock/redis"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newGoRedis returns a go-redis client of addr, closed at the end of the
// test. Context deadlines bound its socket reads, so a hung server cannot
// hold a call past its context.
func newGoRedis(t testing.TB, addr string) *goredis.Client {
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// proxied hands out clients that each reach the servers through their own
// TCP proxies, so one client can be cut off.
type proxied struct {
	t       *testing.T
	mu      sync.Mutex
	proxies map[backend.Backend][]*tcpproxy.Proxy
}

func (p *proxied) clientsOf(addrs []string) ([]*goredis.Client, []*tcpproxy.Proxy) {
	var rdbs []*goredis.Client
	var proxies []*tcpproxy.Proxy
	for _, a := range addrs {
		px := tcpproxy.Start(p.t, a)
		proxies = append(proxies, px)
		rdbs = append(rdbs, newGoRedis(p.t, px.Addr))
	}
	return rdbs, proxies
}

func (p *proxied) remember(b backend.Backend, proxies []*tcpproxy.Proxy) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proxies == nil {
		p.proxies = map[backend.Backend][]*tcpproxy.Proxy{}
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

// singleHarness is one redis-server.
type singleHarness struct {
	proxied
	srv     *redistest.Server
	durable bool
}

func (h *singleHarness) NewBackend(context.Context) (backend.Backend, error) {
	rdbs, proxies := h.clientsOf([]string{h.srv.Addr})
	b := &ownsClients{redis.New(rdbs[0], redis.WithDurableFence(h.durable)), rdbs}
	h.remember(b, proxies)
	return b, nil
}

// ownsClients closes its go-redis clients with the backend, as a process
// that exits would: the suite checks that a closed client leaves nothing.
type ownsClients struct {
	*redis.Backend
	rdbs []*goredis.Client
}

func (o *ownsClients) Close() error {
	err := o.Backend.Close()
	for _, c := range o.rdbs {
		c.Close()
	}
	return err
}

func (h *singleHarness) Capabilities() backend.Capabilities {
	return redis.New(nil, redis.WithDurableFence(h.durable)).Capabilities()
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
)

// The single-node backend on a server with appendfsync always: the
// configuration in which it declares its fences durable.
func TestConformanceSingleNode(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		return &singleHarness{proxied: proxied{t: t}, srv: redistest.Start(t, redistest.AOFAlways), durable: true}
	})
}
