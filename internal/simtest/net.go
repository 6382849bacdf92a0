package simtest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
)

// Backend is what a simulated connection offers package lock: the contract
// and every optional interface that *memory.Backend implements (it
// implements neither backend.Queuer nor backend.LossNotifier, so neither is
// offered).
type Backend interface {
	backend.Backend
	backend.Notifier
	backend.Describer
	backend.Inspector
	backend.Transferer
}

// ErrTimeout is what a simulated client library returns when no reply came
// within its request timeout: the request was lost, its reply was lost, or
// it is still on its way. The outcome is unknown to the caller.
var ErrTimeout = errors.New("simtest: no reply within the request timeout (outcome unknown)")

// network is the memory model: the memory store, and what the
// connections to it share: the run's fault log, and whether per-request
// faults are on.
type network struct {
	store *memory.Store
	ttl   time.Duration
	log   func(format string, args ...any)
	wrap  func(Backend) Backend
	conns []*Conn
	mu    sync.Mutex
	on    bool           // per-request faults are drawn
	sent  map[string]int // requests sent, by operation
}

// NewMemory is the memory model: the memory store behind a simulated
// command-level network (see Conn). wrap, if not nil, wraps each
// connection before package lock gets it: for negative controls, which
// break the backend contract on purpose.
func NewMemory(wrap func(Backend) Backend) NewModel {
	return func(env Env) Model {
		store := memory.NewStore()
		// Requests overtake each other on the simulated network: the
		// store must keep released tokens dead, as a networked one
		// does (see memory.Store.KeepDeadTokens and package netstore).
		store.KeepDeadTokens(memory.DeadTokenTTL)
		return &network{store: store, ttl: env.TTL, log: env.Log, wrap: wrap}
	}
}

var _ Model = (*network)(nil)

// Client implements Model.
func (n *network) Client(i int, r *rand.Rand, timeout time.Duration) (backend.Backend, error) {
	c := &Conn{n: n, id: i, mc: n.store.NewBackend(), timeout: timeout, seed: r.Uint64()}
	n.conns = append(n.conns, c)
	var b Backend = c
	if n.wrap != nil {
		b = n.wrap(b)
	}
	return b, nil
}

// Nodes implements Model: one store.
func (n *network) Nodes() int { return 1 }

// Partition implements Model.
func (n *network) Partition(client int, d time.Duration) { n.conns[client].partition(d) }

// Pause implements Model.
func (n *network) Pause(int) { n.store.Pause() }

// Resume implements Model.
func (n *network) Resume(int) { n.store.Resume() }

// Restart implements Model: the store keeps its data.
func (n *network) Restart(int) { n.store.Restart(memory.KeepData) }

// Settled implements Model.
func (n *network) Settled() []string {
	var out []string
	if held := n.store.Len(); held != 0 {
		out = append(out, fmt.Sprintf("%d locks held", held))
	}
	if w := n.store.Watchers(); w != 0 {
		out = append(out, fmt.Sprintf("%d watches open", w))
	}
	return out
}

// Leftovers implements Model.
func (n *network) Leftovers(keys []string) []string {
	var out []string
	inspect := n.store.NewBackend()
	defer inspect.Close()
	for _, k := range keys {
		hd, err := inspect.Inspect(context.Background(), k)
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("inspect %q: %v", k, err))
		case hd.Held:
			out = append(out, fmt.Sprintf("%q held (fence %d, %v left)", k, hd.Fence, hd.Remaining))
		}
	}
	if w := n.store.Watchers(); w != 0 {
		out = append(out, fmt.Sprintf("%d watches open", w))
	}
	return out
}

// Requests implements Model.
func (n *network) Requests() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.sent)
}

// Close implements Model.
func (n *network) Close() {}

func (n *network) faultsOn() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.on
}

func (n *network) SetFaults(on bool) {
	n.mu.Lock()
	n.on = on
	n.mu.Unlock()
}

// Conn is one client's simulated connection to the store: every request
// travels to the store and its reply back with a delay, and, while faults
// are on, may be lost on the way there, lost on the way back after the
// store acted, applied twice, or delayed past the caller's context. Delays
// are drawn per request, so requests overtake each other. A partition cuts
// the connection for a while: requests and replies that would cross it then
// are lost. Everything runs on the virtual clock of the synctest bubble the
// run lives in.
type Conn struct {
	n       *network
	id      int
	mc      *memory.Backend
	timeout time.Duration // the simulated client library's request timeout

	mu        sync.Mutex
	seed      uint64                // this connection's, drawn from the run's seed
	streams   map[string]*rand.Rand // a stream of draws per operation and key
	partUntil time.Time             // cut off until then
}

// stream returns the draws of op on key. One stream per operation and key,
// not one per connection: this client's requests for one key are mostly
// sent one after another (its per-client queue lets one goroutine at a
// time ask the store for a key), while requests for different keys race,
// and a replay would otherwise hand their fates out in another order.
// c.mu must be held.
func (c *Conn) stream(op, key string) *rand.Rand {
	name := op + "\x00" + key
	r := c.streams[name]
	if r == nil {
		h := fnv.New64a()
		h.Write([]byte(name))
		r = rand.New(rand.NewPCG(c.seed, h.Sum64()))
		if c.streams == nil {
			c.streams = map[string]*rand.Rand{}
		}
		c.streams[name] = r
	}
	return r
}

var _ Backend = (*Conn)(nil)

// plan is the fate of one request, drawn when it is sent.
type plan struct {
	out, back time.Duration // travel times to the store and back
	lostReq   bool          // never reaches the store
	lostReply bool          // the store acts; the reply never arrives
	dup       time.Duration // > 0: reaches the store a second time, this much later
	dupReply  bool          // the caller gets the second copy's reply
}

// Latency draws a travel time: mostly under 2ms, one in twenty up to
// 20ms longer, so that requests (and connections) overtake each other.
// Every model's network draws its latencies so.
func Latency(r *rand.Rand) time.Duration {
	d := time.Duration(r.Int64N(int64(2 * time.Millisecond)))
	if r.IntN(20) == 0 {
		d += time.Duration(r.Int64N(int64(20 * time.Millisecond)))
	}
	return d
}

// draw decides the fate of a request; it also logs faults worth replaying.
func (c *Conn) draw(op, key string) plan {
	c.n.mu.Lock()
	if c.n.sent == nil {
		c.n.sent = map[string]int{}
	}
	c.n.sent[op]++
	c.n.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.stream(op, key)
	p := plan{out: Latency(r), back: Latency(r)}
	x := r.IntN(1000) // drawn whether or not faults are on
	if !c.n.faultsOn() {
		return p
	}
	ttl := c.n.ttl
	var what string
	switch {
	case x < 15:
		p.lostReq = true
		what = "request lost"
	case x < 30:
		p.lostReply = true
		what = "reply lost after the store acted"
	case x < 45:
		p.dup = time.Duration(1 + r.Int64N(int64(ttl/4)))
		p.dupReply = r.IntN(2) == 0
		what = fmt.Sprintf("request applied twice, %v apart (caller sees the %s reply)", p.dup, map[bool]string{false: "first", true: "second"}[p.dupReply])
	case x < 55:
		p.out += ttl/4 + time.Duration(r.Int64N(int64(2*ttl)))
		what = fmt.Sprintf("request delayed %v", p.out)
	case x < 65:
		p.back += ttl/4 + time.Duration(r.Int64N(int64(2*ttl)))
		what = fmt.Sprintf("reply delayed %v after the store acted", p.back)
	default:
		return p
	}
	c.n.log("client %d %s %q: %s", c.id, op, key, what)
	return p
}

// wakeDelay draws the travel time of a wake-up: a latency, and while
// faults are on, one in twenty a quarter of the TTL to a TTL longer.
func (c *Conn) wakeDelay(key string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.stream("wake-up", key)
	d := Latency(r)
	if x := r.IntN(20); x == 0 && c.n.faultsOn() {
		d += c.n.ttl/4 + time.Duration(r.Int64N(int64(c.n.ttl)))
		c.n.log("client %d wake-up %q: delayed %v", c.id, key, d)
	}
	return d
}

func (c *Conn) cutOffUntil() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.partUntil
}

func (c *Conn) cutOff() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Before(c.partUntil)
}

// partition cuts the connection off for d from now.
func (c *Conn) partition(d time.Duration) {
	c.mu.Lock()
	c.partUntil = time.Now().Add(d)
	c.mu.Unlock()
}

// call sends one request: f is what the store does when it arrives.
func call[T any](c *Conn, ctx context.Context, op, key string, f func(context.Context) (T, error)) (T, error) {
	type reply struct {
		v   T
		err error
	}
	p := c.draw(op, key)
	replies := make(chan reply, 1)
	go func() {
		time.Sleep(p.out)
		if p.lostReq || c.cutOff() {
			return
		}
		// The store acts whatever became of the caller: its context
		// does not travel with the request.
		v, err := f(context.Background())
		if p.dup > 0 {
			time.Sleep(p.dup)
			v2, err2 := f(context.Background())
			if p.dupReply {
				v, err = v2, err2
			}
		}
		time.Sleep(p.back)
		if p.lostReply || c.cutOff() {
			return
		}
		replies <- reply{v, err}
	}()
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	var zero T
	select {
	case r := <-replies:
		return r.v, r.err
	case <-ctx.Done():
		return zero, fmt.Errorf("simtest: %s %q: %w", op, key, ctx.Err())
	case <-timer.C:
		return zero, fmt.Errorf("simtest: %s %q: %w", op, key, ErrTimeout)
	}
}

// Acquire implements backend.Backend.
func (c *Conn) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	return call(c, ctx, "acquire", key, func(ctx context.Context) (backend.Grant, error) {
		return c.mc.Acquire(ctx, key, token, ttl)
	})
}

// Renew implements backend.Backend.
func (c *Conn) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	return call(c, ctx, "renew", key, func(ctx context.Context) (backend.Grant, error) {
		return c.mc.Renew(ctx, key, token, ttl)
	})
}

// Release implements backend.Backend.
func (c *Conn) Release(ctx context.Context, key, token string) error {
	_, err := call(c, ctx, "release", key, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, c.mc.Release(ctx, key, token)
	})
	return err
}

// Transfer implements backend.Transferer.
func (c *Conn) Transfer(ctx context.Context, key, from, to string, ttl time.Duration, opt backend.TransferOptions) (backend.Transferred, error) {
	op := "transfer"
	if opt.Fence > 0 {
		op = "transfer (handover ahead of the store)"
	}
	return call(c, ctx, op, key, func(ctx context.Context) (backend.Transferred, error) {
		return c.mc.Transfer(ctx, key, from, to, ttl, opt)
	})
}

// Watch implements backend.Notifier. Setting a watch up takes no faults;
// a client cut off gets an error (package lock then backs off instead).
// Wake-ups travel like replies: with a latency, and while faults are on
// sometimes much later; one that would arrive while the client is cut off
// arrives when the partition ends (a reconnecting client wakes its
// watches). None is lost: the Notifier contract promises progress.
func (c *Conn) Watch(ctx context.Context, key string) (backend.Watch, error) {
	if c.cutOff() {
		return nil, fmt.Errorf("simtest: watch %q: %w", key, ErrTimeout)
	}
	inner, err := c.mc.Watch(ctx, key)
	if err != nil {
		return nil, err
	}
	w := &watch{inner: inner, ch: make(chan struct{}, 1), stop: make(chan struct{})}
	go w.forward(c, key)
	return w, nil
}

// watch forwards a store watch's wake-ups across the simulated network.
type watch struct {
	inner backend.Watch
	ch    chan struct{}
	stop  chan struct{}
	once  sync.Once
}

func (w *watch) C() <-chan struct{} { return w.ch }

func (w *watch) Close(took bool) error {
	w.once.Do(func() { close(w.stop) })
	return w.inner.Close(took)
}

func (w *watch) forward(c *Conn, key string) {
	for {
		select {
		case <-w.stop:
			return
		case <-w.inner.C():
		}
		d := c.wakeDelay(key)
		if until := c.cutOffUntil(); time.Now().Add(d).Before(until) {
			d = time.Until(until)
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-w.stop:
			t.Stop()
			return
		}
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
}

// Inspect implements backend.Inspector, for the checkers: no faults.
func (c *Conn) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	return c.mc.Inspect(ctx, key)
}

// Capabilities implements backend.Describer: the memory store's, but not
// in this process, so that package lock takes its paths for networked
// stores (its per-client queue, transfers, cleanups of unknown outcomes).
func (c *Conn) Capabilities() backend.Capabilities {
	caps := c.mc.Capabilities()
	caps.InProcess = false
	return caps
}

// Close implements backend.Backend.
func (c *Conn) Close() error { return c.mc.Close() }
