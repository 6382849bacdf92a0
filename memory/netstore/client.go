package netstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
)

// Option configures a Backend.
type Option func(*options)

type options struct {
	conns       int
	maxTTL      time.Duration
	dialTimeout time.Duration
	dial        func(ctx context.Context, addr string) (net.Conn, error)
}

// DefaultConns is the size of a Backend's pool of connections for requests.
const DefaultConns = 4

// WithConns sets the number of connections a Backend sends requests on, in
// turn (default DefaultConns). Watches use one more.
func WithConns(n int) Option { return func(o *options) { o.conns = n } }

// WithMaxTTL declares the maximum TTL of the server's store
// (memory.WithMaxTTL; default memory.DefaultMaxTTL), from memory.MinTTL to
// lock.MaxTTL (New refuses others). It changes nothing on the server,
// which refuses longer TTLs itself (ErrInvalid): Capabilities reports it,
// so that package lock refuses them before sending anything.
func WithMaxTTL(d time.Duration) Option { return func(o *options) { o.maxTTL = d } }

// WithDialTimeout bounds each connection attempt (default 5s); a call's
// context bounds it too.
func WithDialTimeout(d time.Duration) Option { return func(o *options) { o.dialTimeout = d } }

// WithDialer makes a Backend connect with dial instead of over TCP: to a
// server behind a proxy of the caller's, on a Unix socket, or over
// in-memory connections (net.Pipe; what lets a test run client and server
// under testing/synctest). dial gets the address New was given, and a
// context that ends at the dial timeout (WithDialTimeout) or earlier.
func WithDialer(dial func(ctx context.Context, addr string) (net.Conn, error)) Option {
	return func(o *options) { o.dial = dial }
}

// Backend is a client of a Server. It implements backend.Backend,
// backend.Notifier, backend.Describer, backend.Inspector and
// backend.Transferer. It is safe for concurrent use.
type Backend struct {
	addr        string
	caps        backend.Capabilities
	dialer      func(ctx context.Context, addr string) (net.Conn, error)
	dialTimeout time.Duration
	pool        []poolSlot
	turn        atomic.Uint32
	ctx         context.Context // ends at Close: bounds the redials of watches
	cancel      context.CancelFunc

	mu     sync.Mutex // guards the fields below and notify's
	conns  map[*conn]struct{}
	closed bool
	notify notifier
	wg     sync.WaitGroup // connection goroutines and redials
}

type poolSlot struct {
	mu sync.Mutex
	c  *conn
}

var (
	_ backend.Backend    = (*Backend)(nil)
	_ backend.Notifier   = (*Backend)(nil)
	_ backend.Describer  = (*Backend)(nil)
	_ backend.Inspector  = (*Backend)(nil)
	_ backend.Transferer = (*Backend)(nil)
)

// New returns a client of the server at addr. It connects once, to report
// an unreachable server at once; connections lost later are made again on
// demand.
func New(addr string, opts ...Option) (*Backend, error) {
	o := options{conns: DefaultConns, dialTimeout: 5 * time.Second, maxTTL: memory.DefaultMaxTTL}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.conns < 1 || o.dialTimeout <= 0 {
		return nil, fmt.Errorf("%w: netstore: %d connections, dial timeout %v: want at least 1 and a positive timeout", backend.ErrInvalid, o.conns, o.dialTimeout)
	}
	if o.maxTTL < memory.MinTTL || o.maxTTL > lock.MaxTTL {
		return nil, fmt.Errorf("%w: netstore: maximum TTL %v (WithMaxTTL) must be at least %v and at most %v (lock.MaxTTL)", backend.ErrInvalid, o.maxTTL, memory.MinTTL, lock.MaxTTL)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if o.dial == nil {
		var d net.Dialer
		o.dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	b := &Backend{addr: addr, caps: storeCaps, dialer: o.dial, dialTimeout: o.dialTimeout, pool: make([]poolSlot, o.conns),
		ctx: ctx, cancel: cancel, conns: map[*conn]struct{}{}}
	b.caps.MaxTTL = o.maxTTL
	b.notify = notifier{b: b, dialing: make(chan struct{}, 1), watches: map[uint64]*watch{}}
	if _, err := b.slotConn(ctx, &b.pool[0]); err != nil {
		b.Close()
		return nil, fmt.Errorf("netstore: %w", err)
	}
	return b, nil
}

// storeCaps are the store's guarantees, as seen from another process.
var storeCaps = func() backend.Capabilities {
	c := memory.New().Capabilities()
	c.InProcess = false
	c.Labels = false // the protocol carries no holder labels
	return c
}()

// Capabilities implements backend.Describer: the store's, but not in the
// process, with the maximum TTL WithMaxTTL declares. DurableFence holds as
// long as the server's *memory.Store lives (see the package doc); FIFO
// does not (a woken waiter races newcomers).
func (b *Backend) Capabilities() backend.Capabilities { return b.caps }

// Close closes the connections. Calls in flight fail; locks held stay until
// they expire. Calls after Close return ErrClosed.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	conns := make([]*conn, 0, len(b.conns))
	for c := range b.conns {
		conns = append(conns, c)
	}
	b.mu.Unlock()
	b.cancel()
	for _, c := range conns {
		c.kill(backend.ErrClosed)
	}
	b.wg.Wait()
	return nil
}

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// dial opens a connection and starts its goroutines.
func (b *Backend) dial(ctx context.Context, onPush func(uint64), onDead func(*conn, error)) (*conn, error) {
	dctx, cancel := context.WithTimeout(ctx, b.dialTimeout)
	nc, err := b.dialer(dctx, b.addr)
	cancel()
	if err != nil {
		return nil, err
	}
	c := newConn(nc, onPush, func(c *conn, err error) {
		b.mu.Lock()
		delete(b.conns, c)
		b.mu.Unlock()
		if onDead != nil {
			onDead(c, err)
		}
	})
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		nc.Close()
		return nil, backend.ErrClosed
	}
	b.conns[c] = struct{}{}
	b.wg.Add(2)
	b.mu.Unlock()
	go func() { defer b.wg.Done(); c.readLoop() }()
	go func() { defer b.wg.Done(); c.writeLoop() }()
	return c, nil
}

// slotConn returns the slot's connection, connecting again if it died.
func (b *Backend) slotConn(ctx context.Context, s *poolSlot) (*conn, error) {
	s.mu.Lock()
	c := s.c
	s.mu.Unlock()
	if c != nil && c.alive() {
		return c, nil
	}
	c, err := b.dial(ctx, nil, nil)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil && s.c.alive() { // another call connected it meanwhile
		c.kill(errors.New("not needed"))
		return s.c, nil
	}
	s.c = c
	return c, nil
}

// roundTrip sends a request on the pool's next connection and returns the
// reply's body. Requests of one Backend thus travel on several connections
// and may reach the server out of order, as on any pooled client.
func (b *Backend) roundTrip(ctx context.Context, op string, req []byte) ([]byte, error) {
	if b.isClosed() {
		return nil, fmt.Errorf("netstore: %s: %w", op, backend.ErrClosed)
	}
	for attempt := 1; ; attempt++ {
		c, err := b.slotConn(ctx, &b.pool[int(b.turn.Add(1))%len(b.pool)])
		if err != nil {
			return nil, b.fail(ctx, op, err)
		}
		cl := newCall(req)
		if !c.enqueue(cl) {
			cl.finish(nil, errNotSent) // it just died
		} else {
			select {
			case <-cl.done:
			case <-ctx.Done():
				if cl.abandon() {
					return nil, b.fail(ctx, op, errors.New("not sent")) // and it never goes out
				}
				return nil, b.fail(ctx, op, errors.New("no reply")) // may have taken effect
			}
		}
		switch {
		case errors.Is(cl.err, errNotSent) && attempt < 3:
			continue // never sent: safe to send on another connection
		case cl.err != nil:
			return nil, b.fail(ctx, op, cl.err)
		}
		return cl.body, nil
	}
}

// fail wraps a failed call's error; a call whose context ended reports
// ctx.Err(), a call after Close ErrClosed.
func (b *Backend) fail(ctx context.Context, op string, err error) error {
	switch cerr := ctx.Err(); {
	case cerr != nil && !errors.Is(err, cerr):
		return fmt.Errorf("netstore: %s: %w (%v)", op, cerr, err)
	case b.isClosed() && !errors.Is(err, backend.ErrClosed):
		return fmt.Errorf("netstore: %s: %w (%v)", op, backend.ErrClosed, err)
	}
	return fmt.Errorf("netstore: %s: %w", op, err)
}

// serverError is an error the server reported. It wraps the contract's
// sentinel it stands for, if any; without one the outcome is unknown.
type serverError struct {
	op, msg  string
	sentinel error
}

func (e *serverError) Error() string { return "netstore: " + e.op + ": " + e.msg }
func (e *serverError) Unwrap() error { return e.sentinel }

// result decodes a reply's kind: a parser of the results for kindOK, or
// the error the reply stands for.
func result(op string, body []byte) (*parser, error) {
	p := &parser{b: body[1:]}
	switch body[0] {
	case kindOK:
		return p, nil
	case kindLocked:
		remaining := p.duration()
		if p.end() == nil {
			return nil, backend.Locked(remaining)
		}
	case kindNotHeld:
		return nil, backend.ErrNotHeld
	case kindRefused:
		return nil, backend.ErrTransferRefused
	case kindInvalid, kindError:
		msg := p.string()
		if p.end() == nil {
			e := &serverError{op: op, msg: msg}
			if body[0] == kindInvalid {
				e.sentinel = backend.ErrInvalid
			}
			return nil, e
		}
	}
	return nil, malformed(op)
}

func malformed(op string) error {
	return fmt.Errorf("netstore: %s: %w reply", op, errFrame)
}

// Acquire implements backend.Backend.
func (b *Backend) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	return b.grant(ctx, "acquire", opAcquire, key, token, ttl)
}

// Renew implements backend.Backend.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	return b.grant(ctx, "renew", opRenew, key, token, ttl)
}

func (b *Backend) grant(ctx context.Context, op string, code byte, key, token string, ttl time.Duration) (backend.Grant, error) {
	body, err := b.roundTrip(ctx, op, done(putDuration(putString(putString(frame(code), key), token), ttl)))
	if err != nil {
		return backend.Grant{}, err
	}
	p, err := result(op, body)
	if err != nil {
		return backend.Grant{}, err
	}
	g := backend.Grant{Fence: p.uint(), TTL: p.duration()}
	if p.end() != nil {
		return backend.Grant{}, malformed(op)
	}
	return g, nil
}

// Release implements backend.Backend.
func (b *Backend) Release(ctx context.Context, key, token string) error {
	body, err := b.roundTrip(ctx, "release", done(putString(putString(frame(opRelease), key), token)))
	if err != nil {
		return err
	}
	p, err := result("release", body)
	if err != nil {
		return err
	}
	if p.end() != nil {
		return malformed("release")
	}
	return nil
}

// Transfer implements backend.Transferer: the store refuses a plain
// transfer of a lock that an acquire from another owner found held.
func (b *Backend) Transfer(ctx context.Context, key, from, to string, ttl time.Duration, opt backend.TransferOptions) (backend.Transferred, error) {
	f := putDuration(putString(putString(putString(frame(opTransfer), key), from), to), ttl)
	body, err := b.roundTrip(ctx, "transfer", done(putBool(putUint(f, opt.Fence), opt.Reserve)))
	if err != nil {
		return backend.Transferred{}, err
	}
	p, err := result("transfer", body)
	if err != nil {
		return backend.Transferred{}, err
	}
	t := backend.Transferred{Fence: p.uint(), TTL: p.duration(), Next: p.uint()}
	if p.end() != nil {
		return backend.Transferred{}, malformed("transfer")
	}
	return t, nil
}

// Inspect implements backend.Inspector.
func (b *Backend) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	body, err := b.roundTrip(ctx, "inspect", done(putString(frame(opInspect), key)))
	if err != nil {
		return backend.Holder{}, err
	}
	p, err := result("inspect", body)
	if err != nil {
		return backend.Holder{}, err
	}
	h := backend.Holder{Held: p.bool(), Token: p.string(), Fence: p.uint(), Remaining: p.duration()}
	if p.end() != nil {
		return backend.Holder{}, malformed("inspect")
	}
	return h, nil
}
