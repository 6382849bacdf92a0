package etcd_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distlock/lock"
	"github.com/distlock/lock/conformance/serverproc"
	"github.com/distlock/lock/etcd"
	"github.com/distlock/lock/internal/etcdtest"
)

// startCluster starts a 3-member etcd cluster, each member a process of its
// own, and waits until every member is healthy.
func startCluster(t *testing.T) []*serverproc.Process { return etcdtest.StartCluster(t, 3) }

// leaderOf returns the member that leads the cluster.
func leaderOf(ctx context.Context, t *testing.T, cli *clientv3.Client, members []*serverproc.Process) *serverproc.Process {
	t.Helper()
	for range 100 {
		for _, m := range members {
			if !m.Running() {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := cli.Status(sctx, m.Addr)
			cancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				return m
			}
		}
		time.Sleep(20 * time.Millisecond) // poll until an election ends
	}
	t.Fatal("no member leads the cluster")
	return nil
}

// section is one critical section as its holder saw it: valid from when
// Acquire returned until Release was called or the lease was lost.
type section struct {
	worker     int
	fence      uint64
	start, end time.Time
	lost       bool
}

// The leader of a 3-member cluster stops (SIGSTOP, then SIGCONT) or dies
// (SIGKILL, then a restart on its data) while a lock is held and waiters
// of other clients queue for it: no two valid leases overlap, fences grow
// in holding order, and every waiter is served.
func TestLeaderFailure(t *testing.T) {
	for _, fault := range []string{"SIGSTOP", "SIGKILL"} {
		t.Run(fault, func(t *testing.T) {
			members := startCluster(t)
			var endpoints []string
			for _, m := range members {
				endpoints = append(endpoints, m.Addr)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			newLocks := func() *lock.Client {
				cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second,
					DialKeepAliveTime: time.Second, DialKeepAliveTimeout: time.Second, Logger: zap.NewNop()})
				if err != nil {
					t.Fatalf("clientv3.New: %v", err)
				}
				t.Cleanup(func() { cli.Close() })
				b, err := etcd.New(cli, etcd.WithElectionTimeout(electionTimeout))
				if err != nil {
					t.Fatalf("etcd.New: %v", err)
				}
				c, err := lock.New(b, lock.WithTTL(2*time.Second))
				if err != nil {
					t.Fatalf("lock.New: %v", err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			const workers, rounds = 4, 4
			var (
				mu       sync.Mutex
				sections []section
				wg       sync.WaitGroup
			)
			holding := make(chan struct{}) // the first section began
			var once sync.Once
			for w := range workers {
				c := newLocks()
				wg.Go(func() {
					for r := 0; r < rounds; {
						l, err := c.Acquire(ctx, "k")
						if err != nil {
							if ctx.Err() != nil {
								t.Errorf("worker %d, round %d: not served: %v", w, r, err)
								return
							}
							time.Sleep(50 * time.Millisecond) // the store failed the attempt: try again, as an application would
							continue
						}
						s := section{worker: w, fence: l.Fence(), start: time.Now()}
						once.Do(func() { close(holding) })
						select { // hold it a while, or until lost
						case <-time.After(300 * time.Millisecond):
						case <-l.Done():
							s.lost = true
						}
						s.end = time.Now()
						l.Release(ctx) // lost or not: the section ended
						mu.Lock()
						sections = append(sections, s)
						mu.Unlock()
						r++
					}
				})
			}
			<-holding
			// A lock whose holder stops renewing just before the fault
			// must still expire within the declared bound: a new
			// leader restarts every lease's TTL.
			abandoned, ttl := newLocks(), time.Second
			sent := time.Now()
			if _, err := abandoned.TryAcquire(ctx, "abandoned", lock.WithTTL(ttl), lock.WithAutoRenew(false)); err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			leader := leaderOf(ctx, t, newClient(t, endpoints[0]), members)
			switch fault {
			case "SIGSTOP":
				leader.Stop()
				time.Sleep(2 * time.Second) // the leader hangs this long
				leader.Continue()
			case "SIGKILL":
				leader.Kill()
				time.Sleep(time.Second) // the leader is down this long
				leader.Restart()
			}
			taker := newLocks()
			for {
				// Each try is short: one sent to a hung member would
				// otherwise wait for the client to give up on it.
				actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				l, err := taker.TryAcquire(actx, "abandoned", lock.WithTTL(ttl))
				cancel()
				if err == nil {
					l.Release(ctx)
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("the abandoned lock never expired: %v", err)
				}
				time.Sleep(20 * time.Millisecond) // poll until it expires
			}
			freed := time.Since(sent)
			caps := taker.Capabilities()
			if bound := caps.LatestExpiry(ttl) + 300*time.Millisecond; freed > bound {
				t.Errorf("a lock of TTL %v abandoned before the leader's %s was free %v after its acquire; the declared latest expiry is %v", ttl, fault, freed.Round(time.Millisecond), caps.LatestExpiry(ttl))
			} else {
				t.Logf("a lock of TTL %v abandoned before the fault was free after %v (declared latest expiry %v)", ttl, freed.Round(time.Millisecond), caps.LatestExpiry(ttl))
			}
			wg.Wait()
			sort.Slice(sections, func(i, j int) bool { return sections[i].start.Before(sections[j].start) })
			if len(sections) != workers*rounds {
				t.Errorf("%d sections; want %d", len(sections), workers*rounds)
			}
			for i := 1; i < len(sections); i++ {
				p, s := sections[i-1], sections[i]
				if s.start.Before(p.end) {
					t.Errorf("worker %d's section began %v before worker %d's ended: two valid leases at once", s.worker, p.end.Sub(s.start), p.worker)
				}
				if s.fence <= p.fence {
					t.Errorf("fence %d after %d in holding order; want strictly increasing", s.fence, p.fence)
				}
			}
			lost := 0
			for _, s := range sections {
				if s.lost {
					lost++
				}
			}
			t.Logf("%d sections, %d of them lost during the fault", len(sections), lost)
			if t.Failed() {
				dump(t, newClient(t, endpoints[0]))
				for _, s := range sections {
					t.Logf("worker %d fence %d %s .. %s", s.worker, s.fence, s.start.Format("15:04:05.000"), s.end.Format("15:04:05.000"))
				}
			}
		})
	}
}

// dump logs every key of the backends and the remaining TTL of its lease.
func dump(t *testing.T, cli *clientv3.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, etcd.DefaultPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Logf("dump: %v", err)
		return
	}
	t.Logf("store at revision %d:", resp.Header.Revision)
	for _, kv := range resp.Kvs {
		ttl := int64(-2)
		if kv.Lease != 0 {
			if r, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil {
				ttl = r.TTL
			}
		}
		t.Logf("  %q = %q create %d mod %d lease %x ttl %d", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Lease, ttl)
	}
}
