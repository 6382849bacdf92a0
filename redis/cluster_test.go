package redis_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// keysAcrossSlots returns perThird keys in each third of the hash slots:
// redis-cli gives each of three masters one third, so every master holds
// some of them.
func keysAcrossSlots(perThird int) []string {
	var out []string
	for third := range 3 {
		lo, hi := third*16384/3, (third+1)*16384/3
		n := 0
		for i := 0; n < perThird; i++ {
			key := fmt.Sprintf("order:%d", i)
			if s := redis.HashSlot("lock:{" + key + "}"); s >= lo && s < hi {
				out = append(out, key)
				n++
			}
		}
	}
	return out
}

// A Redis Cluster of three masters on loopback, opened from a
// redis+cluster:// URL by three clients whose goroutines contend for keys
// on every master: one holder at a time per key, fences increasing, and no
// error (a script whose keys were in two slots would fail with CROSSSLOT).
func TestClusterURL(t *testing.T) {
	srvs := redistest.StartCluster(t, 3)
	var addrs []string
	for _, s := range srvs {
		addrs = append(addrs, s.Addr)
	}
	keys := keysAcrossSlots(4)
	for _, mode := range []string{"per-key counters", "slot counters"} {
		t.Run(mode, func(t *testing.T) {
			u := "redis+cluster://" + strings.Join(addrs, ",")
			if mode == "slot counters" {
				u += "?slotfences=true&prefix=slot:"
			}
			ctx := context.Background()
			var clients []*lock.Client
			for range 3 {
				c, err := lock.Open(ctx, u, lock.WithTTL(5*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				clients = append(clients, c)
			}
			type state struct {
				mu     sync.Mutex
				holder string
				fence  uint64
				grants int
			}
			states := map[string]*state{}
			for _, k := range keys {
				states[k] = &state{}
			}
			var wg sync.WaitGroup
			for c, locks := range clients {
				for g := range 4 {
					who := fmt.Sprintf("client %d goroutine %d", c, g)
					wg.Go(func() {
						for range 25 {
							key := keys[rand.N(len(keys))]
							actx, cancel := context.WithTimeout(ctx, 10*time.Second)
							l, err := locks.Acquire(actx, key)
							cancel()
							if err != nil {
								t.Errorf("%s: Acquire %s: %v", who, key, err)
								return
							}
							st := states[key]
							st.mu.Lock()
							if st.holder != "" {
								t.Errorf("%s acquired %s while %s holds it", who, key, st.holder)
							}
							if l.Fence() <= st.fence {
								t.Errorf("%s: %s fence %d after %d: want strictly increasing", who, key, l.Fence(), st.fence)
							}
							st.holder, st.fence = who, l.Fence()
							st.grants++
							st.mu.Unlock()
							time.Sleep(100 * time.Microsecond) // the section: lets the others queue
							st.mu.Lock()
							st.holder = ""
							st.mu.Unlock()
							if err := l.Release(ctx); err != nil {
								t.Errorf("%s: Release %s: %v", who, key, err)
							}
						}
					})
				}
			}
			wg.Wait()
			in := clients[0].Backend().(backend.Inspector)
			for _, k := range keys {
				if h, err := in.Inspect(ctx, k); err != nil || h.Held {
					t.Errorf("Inspect %s after the run: %+v, %v; want free", k, h, err)
				}
			}
			for i, s := range srvs {
				if n := newGoRedis(t, s.Addr).DBSize(ctx).Val(); n == 0 {
					t.Errorf("master %d holds no key: the keys did not spread over the cluster", i)
				}
			}
		})
	}
}

// A plain redis:// URL of one cluster node cannot follow the cluster's
// redirections: the error says MOVED; redis+cluster:// is the way.
func TestClusterNeedsTheClusterURL(t *testing.T) {
	srvs := redistest.StartCluster(t, 3)
	ctx := context.Background()
	keys := keysAcrossSlots(1)
	locks, err := lock.Open(ctx, "redis://"+srvs[0].Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	moved := 0
	for _, k := range keys {
		if l, err := locks.TryAcquire(ctx, k); err == nil {
			l.Release(ctx)
		} else if strings.Contains(err.Error(), "MOVED") {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("no MOVED from a plain redis:// URL of one node of three")
	}
	for _, u := range []string{"redis+cluster://" + srvs[0].Addr + "/1", "redis+cluster://?addr=" + srvs[0].Addr, "redis+cluster://" + srvs[0].Addr + ",,x:1"} {
		if c, err := lock.Open(ctx, u); err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", u)
		} else if !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("Open(%q): %v; want ErrInvalid", u, err)
		}
	}
	// One node is enough to find the others.
	one, err := lock.Open(ctx, "redis+cluster://"+srvs[1].Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	for _, k := range keys {
		l, err := one.TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("redis+cluster:// of one node, key %s: %v", k, err)
		}
		l.Release(ctx)
	}
}

// redis+sentinel:// finds the master through Sentinel.
func TestSentinelURL(t *testing.T) {
	master := redistest.Start(t, redistest.NoPersistence)
	sentinel := redistest.StartSentinel(t, master, "locks")
	ctx := context.Background()
	locks, err := lock.Open(ctx, "redis+sentinel://"+sentinel.Addr+"?master_name=locks")
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	l, err := locks.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if v := newGoRedis(t, master.Addr).Get(ctx, "lock:{k}").Val(); v != l.Token() {
		t.Errorf("the master holds %q for the lock; want the lease's token", v)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ url, want string }{
		{"redis+sentinel://" + sentinel.Addr, "needs master_name"},
		{"redis+sentinel://" + sentinel.Addr + "?master_name=locks&replica_only=true", "unknown query parameter"},
	} {
		if c, err := lock.Open(ctx, tc.url); err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", tc.url)
		} else if !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want ErrInvalid saying %q", tc.url, err, tc.want)
		}
	}
}

// clusterHarness is a Redis Cluster of three masters; every backend has a
// cluster client of its own. It offers no fault hooks: the cases that need
// them are skipped.
type clusterHarness struct {
	t     *testing.T
	addrs []string
}

func (h *clusterHarness) NewBackend(context.Context) (backend.Backend, error) {
	rdb := h.clusterClient()
	return &ownsCluster{redis.New(rdb, redis.WithMaxTTL(harnessMaxTTL)), rdb}, nil
}

func (h *clusterHarness) clusterClient() *goredis.ClusterClient {
	return goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:                    h.addrs,
		ContextTimeoutEnabled:    true,
		MaxRetries:               -1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// Evict implements conformance.Evicter: the master of the lock's slot
// loses the keys an expiry of the lock removes (see evictedKeys). They
// share the lock's hash tag, so one DEL on that master takes them all.
func (h *clusterHarness) Evict(ctx context.Context, key string) error {
	rdb := h.clusterClient()
	defer rdb.Close()
	return rdb.Del(ctx, evictedKeys(key, false)...).Err()
}

func (h *clusterHarness) Capabilities() backend.Capabilities {
	return redis.New(nil, redis.WithMaxTTL(harnessMaxTTL)).Capabilities()
}

// ownsCluster closes its cluster client with the backend.
type ownsCluster struct {
	*redis.Backend
	rdb *goredis.ClusterClient
}

func (o *ownsCluster) Close() error {
	err := o.Backend.Close()
	o.rdb.Close()
	return err
}

// The single deployment's backend on Redis Cluster, where every script's
// keys must share a slot.
func TestConformanceCluster(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		h := &clusterHarness{t: t}
		for _, s := range redistest.StartCluster(t, 3) {
			h.addrs = append(h.addrs, s.Addr)
		}
		return h
	})
}
