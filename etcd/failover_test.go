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
	"github.com/distlock/lock/backend"
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
			endpoints := addrsOf(members)
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
			// leader restarts every lease's TTL. The members that did
			// not fail tell when the store dropped it.
			abandoned, ttl := newLocks(), time.Second
			sent := time.Now()
			if _, err := abandoned.TryAcquire(ctx, "abandoned", lock.WithTTL(ttl), lock.WithAutoRenew(false)); err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			leader := leaderOf(ctx, t, newClient(t, endpoints[0]), members)
			dropped, watcher := make(chan time.Time, 1), newClient(t, addrsOf(without(members, leader))...)
			go func() { dropped <- whenDropped(ctx, watcher, etcd.DefaultPrefix+"k/abandoned\xff") }()
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
			at := <-dropped
			if at.IsZero() {
				t.Fatalf("the abandoned lock was never dropped")
			}
			freed := at.Sub(sent)
			caps := abandoned.Capabilities()
			bound, changes, _ := dropBound(caps, ttl, sent, at, members)
			if freed < ttl {
				t.Errorf("a lock of TTL %v was dropped %v after its acquire, before its TTL", ttl, freed.Round(time.Millisecond))
			}
			if freed > bound+300*time.Millisecond {
				t.Errorf("a lock of TTL %v abandoned before the leader's %s was dropped %v after its acquire, after %d leader changes; the latest expiry for them is %v", ttl, fault, freed.Round(time.Millisecond), changes, bound.Round(time.Millisecond))
				for _, m := range members {
					t.Logf("log of %s:", m)
					for _, l := range etcdtest.MemberLog(m, "leader", "lease", "Lease", "revok") {
						t.Log("  ", l)
					}
				}
			} else {
				t.Logf("a lock of TTL %v abandoned before the fault was dropped %v after its acquire, after %d leader changes (latest expiry for them %v)", ttl, freed.Round(time.Millisecond), changes, bound.Round(time.Millisecond))
			}
			// And a client of the lock takes it.
			taker := newLocks()
			for tries := 1; ; tries++ {
				// Each try is short: one sent to a member that has
				// not caught up would wait for the client to give up.
				actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				l, err := taker.TryAcquire(actx, "abandoned", lock.WithTTL(ttl))
				cancel()
				if err == nil {
					t.Logf("a client took it %v after its acquire, with attempt %d", time.Since(sent).Round(time.Millisecond), tries)
					l.Release(ctx)
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("the dropped lock was never taken: %v", err)
				}
				time.Sleep(20 * time.Millisecond) // poll until the cluster serves
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

// Each leader change restarts every lease. A lock abandoned before two
// leader changes in a row, the second while the lease restarted by the
// first still ran, is kept for its lease's full TTL after the second, and
// dropped within the bound that TestLeaderFailure allows.
func TestLeaderChangesRestartLeases(t *testing.T) {
	members := startCluster(t)
	endpoints := addrsOf(members)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := etcd.New(newClient(t, endpoints...), etcd.WithElectionTimeout(electionTimeout))
	if err != nil {
		t.Fatalf("etcd.New: %v", err)
	}
	locks, err := lock.New(b)
	if err != nil {
		t.Fatalf("lock.New: %v", err)
	}
	defer locks.Close()
	status := newClient(t, endpoints[0])
	first := leaderOf(ctx, t, status, members)
	// A lease of 3s: the second leader change must come while the lease
	// that the first restarted still lives, on a busy machine too.
	ttl := 2 * time.Second
	sent := time.Now()
	if _, err := locks.TryAcquire(ctx, "abandoned", lock.WithTTL(ttl), lock.WithAutoRenew(false)); err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	first.Stop()
	second := leaderOf(ctx, t, status, without(members, first))
	tookOver := time.Now() // about when the second restarted the lease
	first.Continue()
	for !etcdtest.Healthy(first.Addr) { // back, to make a quorum without the second
		if ctx.Err() != nil {
			t.Fatalf("%s never came back", first)
		}
		time.Sleep(10 * time.Millisecond) // poll until it follows the second
	}
	// Half the restarted lease runs out before the second change, so
	// that a lease the third leader did not restart would be dropped
	// well before its full TTL after that change.
	time.Sleep(time.Until(tookOver.Add(etcd.LeaseTTL(ttl) / 2)))
	second.Stop()
	rest := without(members, second)
	leaderOf(ctx, t, status, rest)
	at := whenDropped(ctx, newClient(t, addrsOf(rest)...), etcd.DefaultPrefix+"k/abandoned\xff")
	second.Continue()
	if at.IsZero() {
		t.Fatal("the abandoned lock was never dropped")
	}
	bound, changes, last := dropBound(locks.Capabilities(), ttl, sent, at, members)
	if changes < 2 {
		t.Fatalf("%d leader changes between the acquire and the drop, by the members' logs; want 2 or more", changes)
	}
	if lease := etcd.LeaseTTL(ttl); at.Sub(last) < lease {
		t.Errorf("the lock was dropped %v after the last leader change; a new leader restarts its lease of %v", at.Sub(last).Round(time.Millisecond), lease)
	}
	if freed := at.Sub(sent); freed > bound+300*time.Millisecond {
		t.Errorf("a lock of TTL %v was dropped %v after its acquire, after %d leader changes; the latest expiry for them is %v", ttl, freed.Round(time.Millisecond), changes, bound.Round(time.Millisecond))
	} else {
		t.Logf("a lock of TTL %v was dropped %v after its acquire, %v after the last of %d leader changes (latest expiry for them %v; declared for one, %v)", ttl, freed.Round(time.Millisecond), at.Sub(last).Round(time.Millisecond), changes, bound.Round(time.Millisecond), locks.Capabilities().LatestExpiry(ttl))
	}
}

// addrsOf returns the client addresses of members.
func addrsOf(members []*serverproc.Process) []string {
	var addrs []string
	for _, m := range members {
		addrs = append(addrs, m.Addr)
	}
	return addrs
}

// without returns members but m.
func without(members []*serverproc.Process, m *serverproc.Process) []*serverproc.Process {
	var rest []*serverproc.Process
	for _, o := range members {
		if o != m {
			rest = append(rest, o)
		}
	}
	return rest
}

// dropBound returns how long after sent the store may keep a lock of TTL
// ttl that was abandoned at sent and dropped at at, and how many leader
// changes came between, and when the last of them was. The declared bound covers one leader change while
// the lease lives; each further one (a loaded machine can make a member
// miss its 100ms election timeout) restarts the lease again: the store may
// then keep it for the lease's TTL and an election timeout after the last
// change, plus the leader's half-second scan for expired leases and the
// revoke's commit.
func dropBound(caps backend.Capabilities, ttl time.Duration, sent, at time.Time, members []*serverproc.Process) (bound time.Duration, changes int, last time.Time) {
	bound = caps.LatestExpiry(ttl)
	for _, c := range etcdtest.LeaderChanges(members) {
		if c.After(sent) && c.Before(at) {
			changes, last = changes+1, c
			if changes > 1 {
				bound = max(bound, c.Sub(sent)+etcd.LeaseTTL(ttl)+electionTimeout+600*time.Millisecond)
			}
		}
	}
	return bound, changes, last
}

// whenDropped polls key through cli until the store no longer has it, and
// returns when it saw it gone (the zero time when ctx ended first).
func whenDropped(ctx context.Context, cli *clientv3.Client, key string) time.Time {
	for ctx.Err() == nil {
		gctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		resp, err := cli.Get(gctx, key, clientv3.WithCountOnly())
		cancel()
		if err == nil && resp.Count == 0 {
			return time.Now()
		}
		time.Sleep(20 * time.Millisecond) // poll until the lease is revoked
	}
	return time.Time{}
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
