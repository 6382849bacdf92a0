package migratetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/conformance/serverproc"
	"github.com/distlock/lock/etcd"
	"github.com/distlock/lock/internal/etcdtest"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/migrate"
	"github.com/distlock/lock/redis"
)

// confHarness gives the conformance suite phase 2 or 3 of a move from a
// real redis-server (From, appendfsync always, durable fences) to a real
// etcd member in a process of its own (To). Each backend it makes is the
// backend of migrate.Config.Backend over a redis client of its own, which
// reaches redis-server through a fault proxy of its own, and an etcd
// client of its own, which reaches the member through two fault proxies of
// its own (two endpoints of one client, as the etcd package's harness
// does). The network hooks act on all three proxies of a backend: the
// process that runs the dual backend is cut off from, or loses the
// replies of, both stores at once. Pause and Restart act on both servers.
//
// The suite must see the dual backend itself (its Notifier, Inspector and
// Describer), so the harness does not wrap it: it wraps the two stores'
// backends instead (confRedis, confEtcd), whose Close, called by the dual
// backend's Close, also closes their clients and proxies and makes the
// harness forget the dual backend's proxies.
//
// The suite's clients run under the phase's fence epoch, as a
// deployment's do (ClientOptions): 0 in phase 2, 1 in phase 3.
type confHarness struct {
	faultproxy.Hooks
	t     *testing.T
	phase migrate.Phase
	redis *redistest.Server
	etcd  *serverproc.Process
	caps  backend.Capabilities
}

var (
	_ conformance.Pauser       = (*confHarness)(nil)
	_ conformance.Restarter    = (*confHarness)(nil)
	_ conformance.Disconnecter = (*confHarness)(nil)
	_ conformance.ReplyHolder  = (*confHarness)(nil)
	_ conformance.Delayer      = (*confHarness)(nil)
	_ conformance.LinkDelayer  = (*confHarness)(nil)
	_ conformance.ConnResetter = (*confHarness)(nil)

	_ conformance.ProcessContenders = confProcHarness{}
	_ conformance.ClientOptioner    = (*confHarness)(nil)
)

// confNewHarness starts a redis-server and an etcd member for t, and
// declares the capabilities of a backend of phase.
func confNewHarness(t *testing.T, phase migrate.Phase) *confHarness {
	h := &confHarness{t: t, phase: phase, redis: redistest.Start(t, redistest.AOFAlways), etcd: etcdtest.Start(t)}
	// The declaration is the dual backend's own: taken once, from a
	// backend of the harness.
	b, err := h.NewBackend(context.Background())
	if err != nil {
		t.Fatalf("harness: a backend for its capabilities: %v", err)
	}
	d, ok := b.(backend.Describer)
	if !ok {
		t.Fatalf("harness: the phase %v backend %T does not describe its capabilities", phase, b)
	}
	h.caps = d.Capabilities()
	if err := b.Close(); err != nil {
		t.Fatalf("harness: closing the backend: %v", err)
	}
	return h
}

// confRedis is the From store of one dual backend: a redis backend that
// closes its go-redis client and its proxy with it, as the exit of its
// process would, and then makes the harness forget the dual backend.
// It embeds *redis.Backend, so that its optional interfaces stay visible
// to the dual backend (its Notifier, Inspector, Describer).
type confRedis struct {
	*redis.Backend
	rdb    *goredis.Client
	px     *faultproxy.Proxy
	forget func()
}

func (c *confRedis) Close() error {
	err := c.Backend.Close()
	c.rdb.Close()
	c.px.Close()
	c.forget()
	return err
}

// confEtcd is the To store of one dual backend, as confRedis is From.
type confEtcd struct {
	*etcd.Backend
	cli    *clientv3.Client
	pxs    []*faultproxy.Proxy
	forget func()
}

func (c *confEtcd) Close() error {
	err := c.Backend.Close() // before its client
	c.cli.Close()
	for _, px := range c.pxs {
		px.Close()
	}
	c.forget()
	return err
}

func (h *confHarness) NewBackend(ctx context.Context) (backend.Backend, error) {
	return h.newBackendOf(ctx, h.phase)
}

// newBackendOf makes a backend of phase (see NewBackend); in phase 1 it
// is the redis store's wrapper, in phase 4 the etcd store's, each still
// registered with every proxy of the three.
func (h *confHarness) newBackendOf(_ context.Context, phase migrate.Phase) (backend.Backend, error) {
	rpx := faultproxy.Start(h.t, h.redis.Addr)
	rdb := redistest.Client(h.t, rpx.Addr)
	epx1, epx2 := faultproxy.Start(h.t, h.etcd.Addr), faultproxy.Start(h.t, h.etcd.Addr)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{epx1.Addr, epx2.Addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		rdb.Close()
		for _, px := range []*faultproxy.Proxy{rpx, epx1, epx2} {
			px.Close()
		}
		return nil, fmt.Errorf("clientv3.New: %w", err)
	}
	eb, err := etcd.New(cli, etcd.WithElectionTimeout(etcdtest.ElectionTimeout), etcd.WithMaxTTL(confMaxTTL))
	if err != nil {
		cli.Close()
		rdb.Close()
		for _, px := range []*faultproxy.Proxy{rpx, epx1, epx2} {
			px.Close()
		}
		return nil, err
	}
	var dual backend.Backend
	forget := func() { h.Forget(dual) }
	from := &confRedis{Backend: redis.New(rdb, redis.WithDurableFence(true), redis.WithMaxTTL(confMaxTTL)), rdb: rdb, px: rpx, forget: forget}
	to := &confEtcd{Backend: eb, cli: cli, pxs: []*faultproxy.Proxy{epx1, epx2}, forget: forget}
	dual, _, err = migrate.Config{From: from, To: to, Phase: phase}.Backend()
	if err != nil {
		return nil, errors.Join(err, from.Close(), to.Close())
	}
	pxs := []*faultproxy.Proxy{epx1, epx2, rpx}
	switch phase {
	case migrate.FromOnly:
		to.Close() // unused in phase 1
		pxs = []*faultproxy.Proxy{rpx}
	case migrate.ToOnly:
		from.Close()
		pxs = []*faultproxy.Proxy{epx1, epx2}
	default:
		if _, _, ok := migrate.Stores(dual); !ok {
			dual.Close()
			return nil, fmt.Errorf("migrate.Config.Backend of phase %v gave %T, not a backend over both stores", phase, dual)
		}
	}
	// The first proxy is the link that LinkDelayer slows (see
	// conformance.LinkDelayer): one of etcd's two, so that requests to
	// To on the other link overtake it.
	h.Add(dual, pxs...)
	return dual, nil
}

func (h *confHarness) Capabilities() backend.Capabilities { return h.caps }

// confMaxTTL is both stores' maximum TTL, raised from the default
// (lock.DefaultMaxTTL): above every TTL the suite uses (ManyKeys takes
// 2m).
const confMaxTTL = 10 * time.Minute

// Evict makes both stores lose the lock, as their expiries would (see
// conformance.Evicter): in redis a DEL of the keys that carry the lock's
// expiry (the lock, its :next and its holder's :h), in etcd a delete of
// the lock key and its holder's label key, guarded by the key's revision;
// counters, queues, leases and tombstones stay.
func (h *confHarness) Evict(ctx context.Context, key string) error {
	rdb := redistest.Client(h.t, h.redis.Addr)
	defer rdb.Close()
	// The redis backend's lock key: the key in a hash tag, its "}" bytes
	// replaced (redis/redis.go, keys).
	lk := redis.DefaultPrefix + "{" + strings.ReplaceAll(key, "}", "\xff") + "}"
	if err := rdb.Del(ctx, lk, lk+":next", lk+":h").Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{h.etcd.Addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ek := etcd.DefaultPrefix + "k/" + key + "\xff"
	for range 10 {
		get, err := cli.Get(ctx, ek)
		if err != nil || len(get.Kvs) == 0 {
			return err
		}
		kv := get.Kvs[0]
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ek), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(ek), clientv3.OpDelete(ek+"h/"+string(kv.Value))).Commit()
		if err != nil || resp.Succeeded {
			return err
		}
	}
	return fmt.Errorf("evict %q: the etcd lock changed hands 10 times while it was evicted", key)
}

// Pause stops both servers with SIGSTOP; Resume continues them.
func (h *confHarness) Pause(context.Context) error {
	h.redis.Stop()
	h.etcd.Stop()
	return nil
}

func (h *confHarness) Resume(context.Context) error {
	h.redis.Continue()
	h.etcd.Continue()
	return nil
}

// Restart kills both servers and starts them again on their data
// (redis-server with appendfsync always, etcd from its data directory);
// the clients reconnect on their own.
func (h *confHarness) Restart(_ context.Context, keepData bool) error {
	if !keepData {
		return errors.New("harness: the suite restarts the stores keeping their data only; etcd's member cannot lose it")
	}
	h.redis.Restart(true)
	h.etcd.Restart()
	return nil
}

// ClientOptions implements conformance.ClientOptioner: the phase's fence
// epoch.
func (h *confHarness) ClientOptions(backend.Backend) []lock.Option {
	if h.phase >= migrate.BothToFences {
		return []lock.Option{lock.WithFenceEpoch(1)}
	}
	return []lock.Option{lock.WithFenceEpoch(0)}
}

// confProcHarness adds contenders in helper processes: they open the same
// move from a migrate URL, whose phase sets the same fence epoch as
// ClientOptions.
type confProcHarness struct{ *confHarness }

// ContenderURL implements conformance.ProcessContenders: helper processes
// reach the servers directly.
func (h confProcHarness) ContenderURL(context.Context) (string, error) {
	return rollURL(h.redis.Addr, h.etcd.Addr, h.phase), nil
}

// TestConfHarness checks the harness's wiring, which the suite takes on
// trust: the network hooks of a dual backend reach both stores' proxies
// (a cut-off backend gets no answer from either store, and both answer
// once it is reconnected), and closing the dual backend makes the harness
// forget its proxies.
func TestConfHarness(t *testing.T) {
	h := confNewHarness(t, migrate.BothToFences)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := h.NewBackend(ctx)
	if err != nil {
		t.Fatalf("NewBackend: %v", err)
	}
	from, to, ok := migrate.Stores(b)
	if !ok {
		t.Fatalf("NewBackend returned %T; want the dual backend itself", b)
	}
	for _, i := range []any{from, to} {
		if _, ok := i.(backend.Notifier); !ok {
			t.Errorf("store %T hides its backend.Notifier", i)
		}
		if _, ok := i.(backend.Inspector); !ok {
			t.Errorf("store %T hides its backend.Inspector", i)
		}
	}
	stores := map[string]backend.Backend{"from (redis)": from, "to (etcd)": to}
	// Warm both clients up, so that the cut holds open connections.
	for name, s := range stores {
		if _, err := s.(backend.Inspector).Inspect(ctx, "conf/warm"); err != nil {
			t.Fatalf("Inspect on %s: %v", name, err)
		}
	}
	if err := h.Disconnect(ctx, b); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	for name, s := range stores {
		cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := s.(backend.Inspector).Inspect(cctx, "conf/cut")
		ccancel()
		if err == nil {
			t.Errorf("Inspect on %s answered while the dual backend was cut off; want no answer", name)
		}
	}
	if err := h.Reconnect(ctx, b); err != nil {
		t.Fatalf("Reconnect: %v", err)
	}
	for name, s := range stores {
		if _, err := s.(backend.Inspector).Inspect(ctx, "conf/healed"); err != nil {
			t.Errorf("Inspect on %s after Reconnect: %v", name, err)
		}
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := h.Disconnect(ctx, b); err == nil {
		t.Errorf("Disconnect of a closed backend: the harness still has its proxies; want them forgotten")
	}
}
