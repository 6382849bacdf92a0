package lock

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/distlock/lock/backend"
)

// Client takes locks on one backend. It is safe for concurrent use.
type Client struct {
	b        backend.Backend
	notifier backend.Notifier
	transfer backend.Transferer
	loss     backend.LossNotifier
	prefixer backend.TokenPrefixer
	caps     backend.Capabilities
	cfg      config
	obs      Observer   // WithObserver and WithLogger's; nil: none
	sched    *scheduler // runs the timers of leases on cfg.clock
	// renewSlots holds one token per automatic renewal running, at most
	// maxConcurrentTicks (see scheduler.fire).
	renewSlots chan struct{}
	local      localQueue // this client's goroutines waiting for the same key
	closed     atomic.Bool
	// renewCtx is the parent of every automatic renewal's context;
	// Close cancels it (endRenewals) to end the renewals in flight.
	renewCtx    context.Context
	endRenewals context.CancelFunc

	bgMu     sync.Mutex
	bgClosed bool           // no more background work starts
	bg       sync.WaitGroup // cleanups and automatic renewals still running
}

// New returns a Client over b with the given default options. The Client owns
// b: Client.Close closes it. It fails with ErrInvalid when b is nil and with
// ErrInvalidOption or ErrInvalidTTL when an option is out of range.
func New(b backend.Backend, opts ...Option) (*Client, error) {
	if b == nil {
		return nil, invalid(ErrInvalid, "New: nil backend; pass one from a backend package, such as memory.New()")
	}
	c := &Client{b: b, cfg: defaultConfig()}
	if n, ok := b.(backend.Notifier); ok {
		c.notifier = n
	}
	if p, ok := b.(backend.TokenPrefixer); ok {
		c.prefixer = p
	}
	if d, ok := b.(backend.Describer); ok {
		c.caps = d.Capabilities()
	}
	if t, ok := b.(backend.Transferer); ok {
		c.transfer = t
	}
	if n, ok := b.(backend.LossNotifier); ok {
		c.loss = n
	}
	for _, o := range opts {
		if o != nil {
			o(&c.cfg)
		}
	}
	if c.cfg.err != nil {
		return nil, c.cfg.err
	}
	if err := c.checkTTL(&c.cfg); err != nil {
		return nil, err
	}
	if !c.cfg.holderSet {
		c.cfg.holder = defaultHolder()
	}
	c.obs = observerOf(&c.cfg)
	c.sched = newScheduler(c.cfg.clock)
	c.renewSlots = make(chan struct{}, maxConcurrentTicks)
	c.renewCtx, c.endRenewals = context.WithCancel(context.Background())
	return c, nil
}

// Capabilities reports what the backend declares about itself; the zero value
// when it declares nothing.
func (c *Client) Capabilities() backend.Capabilities { return c.caps }

// Backend returns the backend the Client wraps, for optional interfaces such
// as backend.Inspector.
func (c *Client) Backend() backend.Backend { return c.b }

// Close stops the client: later calls return ErrClosed, watchdogs stop
// renewing (held leases are lost at their deadlines), and the backend is
// closed. Release leases before closing to free their keys at once. Close is
// idempotent.
//
// Before it closes the backend, Close ends the automatic renewals in flight
// (their contexts are cancelled; a lease keeps the deadline it had) and
// waits for them, and for the background cleanups (each bounded, see
// cleanup), so that nothing of the Client runs against the closed backend
// or outlives Close.
func (c *Client) Close() error {
	if c == nil || !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	c.bgMu.Lock()
	c.bgClosed = true
	c.bgMu.Unlock()
	c.endRenewals()
	c.bg.Wait()
	return c.b.Close()
}

// background runs f in a goroutine that Close waits for. Once the client is
// closing it runs nothing and reports false.
func (c *Client) background(f func()) bool {
	if !c.track() {
		return false
	}
	go func() {
		defer c.bg.Done()
		f()
	}()
	return true
}

// track counts one piece of background work, which calls c.bg.Done when
// it ends, for Close to wait for. Once the client is closing it counts
// nothing and reports false: the work must not start.
func (c *Client) track() bool {
	c.bgMu.Lock()
	defer c.bgMu.Unlock()
	if c.bgClosed {
		return false
	}
	c.bg.Add(1)
	return true
}

// Do acquires key (waiting as Acquire does), runs fn, and releases the lock.
//
// Which context ends what: ctx bounds the wait for the key (as for
// Acquire; WithWait bounds it further without touching the section) and is
// the parent of fn's context, which is also cancelled the moment the lease
// is lost, with context.Cause reporting the loss. The release runs after
// fn returns (or panics), under its own bound of the lease's TTL, even if
// ctx has ended.
//
// Do returns the acquire's error without running fn; otherwise fn's error
// joined with the release's, and with the lease's loss (an error wrapping
// ErrLost) when the lease was lost before the release: the critical
// section may then have overlapped another holder's.
func (c *Client) Do(ctx context.Context, key string, fn func(ctx context.Context, l *Lease) error, opts ...Option) error {
	return c.do(ctx, "do", key, true, fn, opts)
}

// TryDo is Do without waiting: it takes key if it is free (as TryAcquire
// does), runs fn, and releases the lock, with Do's contexts and errors.
// When the key is held it returns an error wrapping ErrLocked without
// running fn.
func (c *Client) TryDo(ctx context.Context, key string, fn func(ctx context.Context, l *Lease) error, opts ...Option) error {
	return c.do(ctx, "try-do", key, false, fn, opts)
}

func (c *Client) do(ctx context.Context, op, key string, wait bool, fn func(ctx context.Context, l *Lease) error, opts []Option) error {
	if fn == nil {
		return invalid(ErrInvalid, "%s %q: nil function", op, key)
	}
	aop := "try-acquire"
	if wait {
		aop = "acquire"
	}
	l, err := c.acquire(ctx, aop, key, wait, opts)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l.onEnd(func(cause error) { cancel(cause) })
	release := func() error {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.TTL())
		defer rcancel()
		err := l.Release(rctx)
		if lost := l.Err(); err == nil && errors.Is(lost, ErrLost) {
			return wrap("release", key, lost) // lost before the release
		}
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			release() // do not keep renewing a lock whose holder panicked
			panic(p)
		}
	}()
	fnErr := fn(fctx, l)
	return errors.Join(fnErr, release())
}

func (c *Client) check(op, key string, ctx context.Context) error {
	if c == nil {
		return invalid(ErrInvalid, "%s %q: nil Client; create one with New or Open", op, key)
	}
	if ctx == nil {
		return invalid(ErrInvalid, "%s %q: nil context; pass context.Background() or a derived one", op, key)
	}
	if c.closed.Load() {
		return wrap(op, key, ErrClosed)
	}
	return nil
}

// CheckKey returns nil when key is a valid lock key (1 to MaxKeyLen bytes
// of valid UTF-8), and otherwise an error wrapping ErrInvalidKey that says
// what is wrong. Acquire and TryAcquire check keys the same way; tools call
// it to validate a key before sending anything.
func CheckKey(key string) error {
	if p := keyProblem(key); p != "" {
		return invalid(ErrInvalidKey, "%s", p)
	}
	return nil
}

func checkKey(op, key string) error {
	if p := keyProblem(key); p != "" {
		return invalid(ErrInvalidKey, "%s: %s", op, p)
	}
	return nil
}

// keyProblem says what is wrong with key, or "" when nothing is.
func keyProblem(key string) string {
	switch {
	case key == "":
		return fmt.Sprintf("empty key; a key is 1 to %d bytes of UTF-8", MaxKeyLen)
	case len(key) > MaxKeyLen:
		return fmt.Sprintf("key of %d bytes; a key is 1 to %d bytes of UTF-8", len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Sprintf("key %q is not valid UTF-8; a key is 1 to %d bytes of UTF-8", key, MaxKeyLen)
	}
	return ""
}

func (c *Client) checkTTL(cfg *config) error {
	ttl := cfg.ttl
	if c.caps.MinTTL > 0 && ttl < c.caps.MinTTL {
		return invalid(ErrInvalidTTL, "TTL %v is below this backend's minimum of %v", ttl, c.caps.MinTTL)
	}
	if c.caps.MaxTTL > 0 && ttl > c.caps.MaxTTL {
		return invalid(ErrInvalidTTL, "TTL %v is above this backend's maximum of %v; use a shorter TTL (auto-renew keeps a lease longer), or raise the maximum (this module's backends: WithMaxTTL, or the URL parameter maxttl)", ttl, c.caps.MaxTTL)
	}
	if d := cfg.driftFor(ttl); d >= ttl {
		return invalid(ErrInvalidTTL, "TTL %v leaves no validity after the drift allowance of %v; use a TTL above %v or a smaller WithDrift", ttl, d, d)
	}
	return nil
}

// tokenFor returns a new token for an acquisition attempt, or for a
// goroutine waiting for a transfer, of a lease with cfg: 32 bytes, the
// backend's prefix (backend.TokenPrefixer) followed by random hexadecimal
// digits, for a lease that renews itself; random digits alone otherwise.
func (c *Client) tokenFor(cfg *config) (string, error) {
	t := newToken()
	if c.prefixer == nil || !cfg.autoRenew {
		return t, nil
	}
	p, err := c.prefixer.TokenPrefix(cfg.ttl)
	if err != nil {
		return "", err
	}
	if len(p) > backend.MaxTokenPrefix || p != "" && !prefixed(p) {
		return "", fmt.Errorf("%w: the backend's token prefix %q is not one of at most %d bytes that starts with a byte other than a hexadecimal digit (backend.TokenPrefixer)", backend.ErrInvalid, p, backend.MaxTokenPrefix)
	}
	return p + t[len(p):], nil
}

// prefixed reports whether token starts with a backend's prefix (see
// tokenFor): a token without one is hexadecimal.
func prefixed(token string) bool {
	return token != "" && strings.IndexByte("0123456789abcdef", token[0]) < 0
}

// entropy hands out crypto/rand bytes read in blocks: one system call per 64
// tokens instead of one per token. Every byte is used once.
type entropy struct {
	buf [1024]byte
	off int
}

var entropyPool = sync.Pool{New: func() any { return &entropy{off: len(entropy{}.buf)} }}

// newToken returns 128 random bits from crypto/rand as 32 hex digits.
func newToken() string {
	e := entropyPool.Get().(*entropy)
	if e.off+16 > len(e.buf) {
		crand.Read(e.buf[:]) // never fails since Go 1.24; it crashes the program instead
		e.off = 0
	}
	var out [32]byte
	hex.Encode(out[:], e.buf[e.off:e.off+16])
	clear(e.buf[e.off : e.off+16])
	e.off += 16
	entropyPool.Put(e)
	return string(out[:])
}
