package consul_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/consul"
	"github.com/distlock/lock/internal/consultest"
	"github.com/distlock/lock/internal/flashsale"
)

// newClient returns a lock.Client over a new backend of addr.
func newClient(t *testing.T, addr string, bopts []consul.Option, opts ...lock.Option) *lock.Client {
	t.Helper()
	b, _ := newBackend(t, addr, bopts...)
	c, err := lock.New(b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sessionOf returns the session that holds key's entry, from outside.
func sessionOf(t *testing.T, cli *api.Client, key string) string {
	t.Helper()
	kv, _, err := cli.KV().Get(consul.DefaultPrefix+key, nil)
	if err != nil || kv == nil || kv.Session == "" {
		t.Fatalf("entry of %q: %+v, %v; want it locked", key, kv, err)
	}
	return kv.Session
}

// A session destroyed from outside: the holder's Done closes within a
// second; nobody gets the key during the lock-delay; a waiter gets it as
// soon as the lock-delay ends, not a fixed retry period later.
func TestSessionDestroyedFromOutside(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	const delay = 2 * time.Second
	bopts := []consul.Option{consul.WithLockDelay(delay)}
	a := newClient(t, agent.Addr, bopts, lock.WithTTL(10*time.Second))
	wb, _ := newBackend(t, agent.Addr, bopts...)
	refused := &seesRefusal{owns: wb, refused: make(chan struct{})}
	w, err := lock.New(refused, lock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	l, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		wl, err := w.Acquire(ctx, "k")
		if err != nil {
			t.Errorf("waiter: %v", err)
			got <- time.Time{}
			return
		}
		at := time.Now()
		wl.Release(ctx)
		got <- at
	}()
	// Destroy the session once the waiter waits (refused once, then once
	// more after it began watching): Consul checks the lock-delay before
	// the Raft write, so a lock request in flight at the moment of the
	// destroy may still land (see the package doc).
	<-refused.refused
	<-refused.refused
	outside, _ := client(t, agent.Addr)
	sess := sessionOf(t, outside, "k")
	destroyed := time.Now()
	if _, err := outside.Session().Destroy(sess, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
		t.Logf("the holder knew it lost the lock %v after its session was destroyed", time.Since(destroyed).Round(time.Millisecond))
	case <-time.After(time.Second):
		t.Fatal("the holder's Done did not close within 1s of its session being destroyed")
	}
	if !errors.Is(l.Err(), lock.ErrLost) {
		t.Errorf("Err %v; want ErrLost", l.Err())
	}
	at := <-got
	if at.IsZero() {
		t.FailNow()
	}
	waited := at.Sub(destroyed)
	if waited < delay-100*time.Millisecond {
		t.Errorf("the waiter got the key %v after the session was destroyed; the lock-delay is %v", waited, delay)
	}
	if waited > delay+time.Second {
		t.Errorf("the waiter got the key %v after the session was destroyed: more than a second past the lock-delay of %v", waited, delay)
	}
	t.Logf("the waiter got the key %v after the session was destroyed (lock-delay %v)", waited.Round(time.Millisecond), delay)
}

// seesRefusal signals when an Acquire found the key held.
type seesRefusal struct {
	*owns
	refused chan struct{}
}

func (s *seesRefusal) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := s.owns.Acquire(ctx, key, token, ttl)
	s.saw(err)
	return g, err
}

func (s *seesRefusal) saw(err error) {
	if errors.Is(err, backend.ErrLocked) {
		select {
		case s.refused <- struct{}{}: // the test waits for two
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Queue gives the waiting acquires (package lock sends them through a
// place in the queue) the same signal.
func (s *seesRefusal) Queue(key string) (backend.Queue, error) {
	q, err := s.owns.Queue(key)
	if err != nil {
		return nil, err
	}
	return refusalQueue{q, s}, nil
}

type refusalQueue struct {
	backend.Queue
	s *seesRefusal
}

func (q refusalQueue) Acquire(ctx context.Context, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := q.Queue.Acquire(ctx, token, ttl)
	q.s.saw(err)
	return g, err
}

// consul#18271: a holder cut off from the agent is told it lost the lock at
// its deadline, never later, and before a successor gets it.
func TestHolderCutOffIsLostByItsDeadline(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	px := faultproxy.Start(t, agent.Addr)
	a := newClient(t, px.Addr, nil, lock.WithTTL(2*time.Second))
	l, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	px.Cut()
	defer px.Heal()
	var lostAt time.Time
	select {
	case <-l.Done():
		lostAt = time.Now()
	case <-time.After(10 * time.Second):
		t.Fatal("a holder cut off from the agent was never told it lost the lock")
	}
	if late := lostAt.Sub(l.Deadline()); late > 50*time.Millisecond {
		t.Errorf("Done closed %v after the deadline", late)
	}
	b := newClient(t, agent.Addr, nil, lock.WithTTL(2*time.Second))
	bl, err := b.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Release(ctx)
	if acquired := time.Now(); !acquired.After(lostAt) {
		t.Fatalf("the successor acquired at %v, before the cut-off holder knew it lost the lock at %v", acquired, lostAt)
	}
	if bl.Fence() <= l.Fence() {
		t.Errorf("fence %d after %d", bl.Fence(), l.Fence())
	}
}

// A lock granted on a reused session, long after the session's last
// renewal, is still kept its TTL after the acquire: the reuse renews the
// session with the lock.
func TestSessionReuseKeepsTheTTL(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	const ttl = 2 * time.Second
	b, cli := newBackend(t, agent.Addr)
	defer b.Close()
	tok := func(s string) string { return strings.Repeat(s, 32) }
	if _, err := b.Acquire(ctx, "first", tok("a"), ttl); err != nil {
		t.Fatal(err)
	}
	first := sessionOf(t, cli, "first")
	if err := b.Release(ctx, "first", tok("a")); err != nil {
		t.Fatal(err)
	}
	// Idle for 1.5 TTLs: without a renewal, Consul (which expires a
	// session at twice its TTL after its last renewal) would free a lock
	// taken on it now half a TTL later.
	time.Sleep(ttl * 3 / 2) // wait out most of the session's life
	sent := time.Now()
	if _, err := b.Acquire(ctx, "second", tok("b"), ttl); err != nil {
		t.Fatal(err)
	}
	if s := sessionOf(t, cli, "second"); s != first {
		t.Fatalf("the second lock has session %s, not the released lock's %s: the test checks nothing", s, first)
	}
	time.Sleep(time.Until(sent.Add(ttl - 100*time.Millisecond))) // up to just before the TTL
	h, err := b.Inspect(ctx, "second")
	if err != nil || !h.Held || h.Token != tok("b") {
		t.Fatalf("%v after the acquire, the lock on a reused session is %+v, %v; want held", time.Since(sent), h, err)
	}
	b.Release(ctx, "second", tok("b"))
}

// Releasing or losing one lock never frees another of the same backend.
func TestReleasingOneLockFreesNoOther(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	c := newClient(t, agent.Addr, nil, lock.WithTTL(5*time.Second))
	outside, _ := client(t, agent.Addr)
	k1, err := c.TryAcquire(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	k2, err := c.TryAcquire(ctx, "two")
	if err != nil {
		t.Fatal(err)
	}
	if sessionOf(t, outside, "one") == sessionOf(t, outside, "two") {
		t.Fatal("two locks share a session")
	}
	if err := k1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	k3, err := c.TryAcquire(ctx, "three") // on the session "one" had
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outside.Session().Destroy(sessionOf(t, outside, "three"), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k3.Done():
	case <-time.After(time.Second):
		t.Fatal("the lock whose session was destroyed is not lost")
	}
	in := c.Backend().(backend.Inspector)
	if h, err := in.Inspect(ctx, "two"); err != nil || !h.Held || h.Token != k2.Token() {
		t.Fatalf("after releasing one lock and losing another, a third is %+v, %v; want still held", h, err)
	}
	if err := k2.Renew(ctx); err != nil {
		t.Fatalf("Renew of the lock that was neither released nor lost: %v", err)
	}
	k2.Release(ctx)
}

// TTLs below the servers' minimum are refused, naming it.
func TestMinTTL(t *testing.T) {
	cli, _ := client(t, "127.0.0.1:1")
	b, err := consul.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	c, err := lock.New(b, lock.WithTTL(5*time.Second))
	if !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "10s") {
		t.Fatalf("a 5s TTL with the default minimum: %v; want ErrInvalidTTL naming 10s", err)
	}
	if c != nil {
		c.Close()
	}
	b.Close()
	if _, err := consul.New(cli, consul.WithLockDelay(-time.Second)); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("negative lock-delay: %v; want ErrInvalid", err)
	}
}

func TestOpenURL(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		url  string
		want string // "" for success
	}{
		{"consul://127.0.0.1:8500", ""},
		{"consuls://127.0.0.1:8501?prefix=app/locks/&minttl=1s&lockdelay=0s&token=x", ""},
		{"consul://127.0.0.1:8500?colour=red", `unknown query parameter "colour"`},
		{"consul://127.0.0.1:8500?minttl=soon", "minttl=\"soon\""},
		{"consul://127.0.0.1:8500/some/path", `path "/some/path"`},
		{"consul:///", "no host"},
	} {
		c, err := lock.Open(ctx, tc.url)
		if tc.want == "" {
			if err != nil {
				t.Errorf("Open(%q): %v", tc.url, err)
			} else {
				c.Close()
			}
			continue
		}
		if err == nil || !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want ErrInvalid saying %q", tc.url, err, tc.want)
		}
		if c != nil {
			c.Close()
		}
	}
}

// The flash sale, the same code as on every backend, with only the URL
// changed.
func TestFlashSale(t *testing.T) {
	agent := consultest.Start(t)
	flashsale.CheckURL(t, "consul://"+agent.Addr+"?minttl=1s")
}

// renewCounter counts the session renewals a client sends.
type renewCounter struct {
	rt http.RoundTripper
	n  atomic.Int64
}

func (c *renewCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasPrefix(r.URL.Path, "/v1/session/renew/") {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// A session created or renewed lately carries the next lock as it is, with
// no renewal: Consul keeps a session at least its TTL from its latest
// renewal, so the session's TTL must cover the lock's TTL from the
// acquire's send, counted from that renewal's send. The test reads the
// session's TTL back from Consul (its expiry cannot be timed: Consul waits
// up to twice the TTL). Were sessions as long as the lock's TTL, this test
// fails.
func TestSessionReusedLatelyCarriesTheLock(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	const ttl = 2 * time.Second
	cfg := api.DefaultConfig()
	cfg.Address = agent.Addr
	counter := &renewCounter{rt: cfg.Transport}
	cfg.HttpClient = &http.Client{Transport: counter}
	cli, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := consul.New(cli, consul.WithMinTTL(consultest.MinTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	tok := func(s string) string { return strings.Repeat(s, 32) }
	created := time.Now() // the session's creation is sent after this
	if _, err := b.Acquire(ctx, "first", tok("a"), ttl); err != nil {
		t.Fatal(err)
	}
	first := sessionOf(t, cli, "first")
	if err := b.Release(ctx, "first", tok("a")); err != nil {
		t.Fatal(err)
	}
	// As late as the session still carries a lock as it is (an eighth of
	// the TTL after its renewal), less a margin.
	time.Sleep(time.Until(created.Add(ttl/8 - 60*time.Millisecond)))
	counter.n.Store(0)
	sent := time.Now()
	if _, err := b.Acquire(ctx, "second", tok("b"), ttl); err != nil {
		t.Fatal(err)
	}
	if s := sessionOf(t, cli, "second"); s != first || counter.n.Load() != 0 {
		t.Fatalf("the second lock has session %s (the released lock's: %s) after %d renewals; want that one and none: the test checks nothing", s, first, counter.n.Load())
	}
	info, _, err := cli.Session().Info(first, nil)
	if err != nil || info == nil {
		t.Fatalf("session info: %+v, %v", info, err)
	}
	sttl, err := time.ParseDuration(info.TTL)
	if err != nil {
		t.Fatalf("session TTL %q: %v", info.TTL, err)
	}
	if need := ttl + sent.Sub(created); sttl < need {
		t.Fatalf("the session's TTL is %v; a lock acquired %v after its creation without a renewal needs %v (its TTL from the acquire)", sttl, sent.Sub(created).Round(time.Millisecond), need.Round(time.Millisecond))
	}
	time.Sleep(time.Until(sent.Add(ttl - 100*time.Millisecond))) // up to just before the TTL
	h, err := b.Inspect(ctx, "second")
	if err != nil || !h.Held || h.Token != tok("b") {
		t.Fatalf("%v after the acquire, the lock on a reused session is %+v, %v; want held", time.Since(sent), h, err)
	}
	b.Release(ctx, "second", tok("b"))
}
