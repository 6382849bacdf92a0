// Package lock provides distributed locks with one portable API over several
// stores: Redis, etcd, Consul and an in-process memory store.
//
// A Client wraps one backend. TryAcquire makes one attempt and fails fast with
// ErrLocked; Acquire waits until the lock is held or its context ends; Do runs
// a function under the lock with a context that ends the moment the lock is
// lost. A Lease is one held lock.
//
//	locks, err := lock.New(memory.New())
//	...
//	err = locks.Do(ctx, "invoice:7", func(ctx context.Context, l *lock.Lease) error {
//		return chargeOnce(ctx, l.Fence())
//	})
//
// # Promises
//
//   - Mutual exclusion by lease: at most one Lease for a key is valid at any
//     moment, given client and store clocks whose rates differ by less than
//     the drift allowance.
//   - Every acquisition gets a fresh owner token of 128 random bits; the store
//     checks it on renew and release, so a stale holder can never extend or
//     delete its successor's lock.
//   - Lease.Fence is > 0 and strictly increasing over successive holders of a
//     key. A lease alone cannot guarantee exclusion when a holder pauses (GC,
//     swap, a stopped VM) for longer than its TTL: pass the fence to the
//     protected resource and have it reject fences lower than the highest it
//     has seen.
//   - Validity is a client-side deadline measured on the monotonic clock from
//     when the acquire or renew request was sent: sent + TTL - drift. At the
//     deadline the lease is lost even if the store cannot be reached: Done is
//     closed and Err reports ErrLost, before the store can grant the key to
//     anyone else.
//   - The watchdog renews every lease about every TTL/3 unless turned off
//     (WithAutoRenew), retries failed renewals while the lease is valid,
//     never re-acquires a lost lock, and can be capped (WithMaxHold).
//   - Acquire waits on the backend's wake-up when it offers one (a release
//     notification), otherwise backs off with jitter; it never sleeps longer
//     than the holder's remaining TTL where the store reports it. When its
//     context ends it returns the context's error and leaves nothing behind.
//   - Bad input (empty or oversized key, TTL <= 0 or below the backend's
//     minimum, out-of-range options, a closed or nil Client) returns an error
//     wrapping ErrInvalid or ErrClosed and changes nothing.
//
// # URLs
//
// Open builds a Client from a URL whose scheme a backend package registered
// in its init function; import the backend for its side effect:
//
//	import _ "github.com/distlock/lock/memory"
//	locks, err := lock.Open(ctx, "mem://orders?ttl=30s")
//
// Every scheme accepts these query parameters: ttl, drift, maxhold (Go
// durations) and autorenew (true or false).
//
// # Errors
//
// Check errors with errors.Is against the sentinels (ErrLocked, ErrNotHeld,
// ErrLost, ErrReleased, ErrClosed, ErrInvalid and its kinds). Messages start
// with "lock:" and name the operation and key. The backend's own error is
// reachable with errors.As.
package lock

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/distlock/lock/backend"
)

// Client takes locks on one backend. It is safe for concurrent use.
type Client struct {
	b        backend.Backend
	notifier backend.Notifier
	transfer backend.Transferer
	loss     backend.LossNotifier
	caps     backend.Capabilities
	cfg      config
	sched    *scheduler // runs the timers of leases on cfg.clock
	// renewSlots holds one token per automatic renewal running, at most
	// maxConcurrentTicks (see scheduler.fire).
	renewSlots chan struct{}
	local      localQueue // this client's goroutines waiting for the same key
	closed     atomic.Bool

	bgMu     sync.Mutex
	bgClosed bool           // no more cleanups start
	bg       sync.WaitGroup // best-effort cleanups still running
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
	c.sched = newScheduler(c.cfg.clock)
	c.renewSlots = make(chan struct{}, maxConcurrentTicks)
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
func (c *Client) Close() error {
	if c == nil || !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	c.bgMu.Lock()
	c.bgClosed = true
	c.bgMu.Unlock()
	c.bg.Wait()
	return c.b.Close()
}

// TryAcquire makes one attempt to take key. It returns ErrLocked at once when
// another owner holds it, including another goroutine of this Client (then
// without asking the store). On a multi-node store (Redlock) a split vote,
// where concurrent attempts left nobody a majority, is retried after a
// random delay; after many splits it returns ErrContended.
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...Option) (*Lease, error) {
	return c.acquire(ctx, "try-acquire", key, false, opts)
}

// Acquire takes key, waiting while another owner holds it, until it is held or
// ctx ends. When ctx ends it returns an error wrapping ctx.Err() and leaves
// nothing behind on the store.
//
// Goroutines of one Client waiting for the same key queue in the process, in
// arrival order, and only the first asks the store; on a backend that can
// transfer a lock (backend.Transferer) a release hands the lock straight to
// the next of them. From the second handoff of a run on, the next goroutine
// starts the moment the holder releases, ahead of the store: while the
// transfer travels, its lease is valid until the earlier of the previous
// holder's deadline and its own TTL (less drift) from the release, with a
// fence the store reserved for it; when the transfer lands the lease
// carries on as after a renewal, and if it fails the lease is lost.
// Waiters in other processes contend through the store.
func (c *Client) Acquire(ctx context.Context, key string, opts ...Option) (*Lease, error) {
	return c.acquire(ctx, "acquire", key, true, opts)
}

// Waiting returns how many goroutines of this Client wait in its queue for
// key while another of its goroutines has the key's turn (see Acquire). It
// is 0 on a backend whose store runs in this process, which queues waiters
// itself.
func (c *Client) Waiting(key string) int {
	if c == nil {
		return 0
	}
	return c.local.waiting(key)
}

// Do acquires key (waiting as Acquire does), runs fn, and releases the lock.
// The context passed to fn is cancelled the moment the lease is lost, with
// context.Cause reporting the loss. Do returns fn's error joined with ErrLost
// when the lease was lost before the release: the critical section may then
// have overlapped another holder's.
func (c *Client) Do(ctx context.Context, key string, fn func(ctx context.Context, l *Lease) error, opts ...Option) error {
	if fn == nil {
		return invalid(ErrInvalid, "Do %q: nil function", key)
	}
	l, err := c.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l.onEnd(func(cause error) { cancel(cause) })
	release := func() error {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttl)
		defer rcancel()
		return l.Release(rctx)
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
		return invalid(ErrInvalidTTL, "TTL %v is above this backend's maximum of %v", ttl, c.caps.MaxTTL)
	}
	if d := cfg.driftFor(ttl); d >= ttl {
		return invalid(ErrInvalidTTL, "TTL %v leaves no validity after the drift allowance of %v; use a TTL above %v or a smaller WithDrift", ttl, d, d)
	}
	return nil
}

// entropy hands out crypto/rand bytes read in blocks: one system call per 64
// tokens instead of one per token. Every byte is used once.
type entropy struct {
	buf [1024]byte
	off int
}

var entropyPool = sync.Pool{New: func() any { return &entropy{off: len(entropy{}.buf)} }}

// errLocalHolder: another goroutine of this client holds or is taking the key.
var errLocalHolder = fmt.Errorf("%w (by this client)", ErrLocked)

// Split votes (backend.ErrContended) are retried after a random delay of up
// to splitDelay times the number of splits so far (at most 8); TryAcquire
// gives up after maxSplitRetries.
const (
	splitDelay      = time.Millisecond
	maxSplitRetries = 64
)

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

func (c *Client) acquire(ctx context.Context, op, key string, wait bool, opts []Option) (*Lease, error) {
	if err := c.check(op, key, ctx); err != nil {
		return nil, err
	}
	if err := checkKey(op, key); err != nil {
		return nil, err
	}
	cfg := &c.cfg
	if len(opts) > 0 {
		local := c.cfg
		for _, o := range opts {
			if o != nil {
				o(&local)
			}
		}
		if local.err != nil {
			return nil, local.err
		}
		if err := c.checkTTL(&local); err != nil {
			return nil, err
		}
		cfg = &local
	}
	if cfg.maxHold > 0 && cfg.maxHold < cfg.ttl {
		return nil, invalid(ErrInvalidOption, "%s %q: WithMaxHold(%v) is shorter than the TTL %v; use 0 (no cap) or at least the TTL", op, key, cfg.maxHold, cfg.ttl)
	}
	if err := ctx.Err(); err != nil {
		return nil, wrap(op, key, err)
	}

	// Take this client's turn for the key first: goroutines of one client
	// queue here instead of all asking the store.
	queued := !c.caps.InProcess
	if queued && wait {
		l, err := c.local.turn(ctx, key, cfg)
		if err != nil {
			return nil, wrap(op, key, gaveUp(err, errLocalHolder))
		}
		if l != nil {
			return l, nil // the previous holder transferred the lock to us
		}
	} else if queued && !c.local.tryTurn(key) {
		return nil, wrap(op, key, errLocalHolder)
	}
	var watch backend.Watch
	// A store that queues waiters and hands them the lock (backend.Queuer)
	// gets this call's attempts through its place in the queue.
	var queue backend.Queue
	var refused map[string]bool // tokens of attempts the store queued
	if qr, ok := c.notifier.(backend.Queuer); ok && wait && queued {
		if q, err := qr.Queue(key); err == nil {
			queue, watch, refused = q, q, map[string]bool{}
		}
	}
	took := false
	turnPassed := false // a cleanup passes the turn (see cleanup)
	defer func() {
		if watch != nil {
			watch.Close(took)
		}
		if queued && !took && !turnPassed {
			c.local.pass(key) // the lease did not come: next in line
		}
	}()
	backoff := cfg.minBackoff
	splits := 0
	for {
		if queue != nil {
			l, err := c.handed(ctx, queue, key, cfg, refused)
			if err != nil {
				return nil, wrap(op, key, err)
			}
			if l != nil {
				took = true
				return l, nil
			}
		}
		// Every attempt has a token of its own, never used before, so
		// that an attempt counts only what it was granted itself: a
		// lock left by an earlier attempt whose undo was lost or is
		// still on its way (Redlock), or one that a transfer of unknown
		// outcome gave to this goroutine's queue token, is never taken
		// for this attempt's grant, whose deadline is counted from this
		// send.
		token := newToken()
		sent := cfg.clock.Now()
		var g backend.Grant
		var err error
		if queue != nil {
			g, err = queue.Acquire(ctx, token, cfg.ttl)
		} else {
			g, err = c.b.Acquire(ctx, key, token, cfg.ttl)
		}
		if err == nil {
			if berr := c.brokenGrant("a grant", g.Fence, g.TTL, cfg.ttl); berr != nil {
				// Not a lease: free whatever the store holds for the
				// token, as after an acquire of unknown outcome.
				turnPassed = c.cleanup(ctx, key, token, cfg.ttl, queued)
				return nil, wrap(op, key, berr)
			}
			took = true
			l := c.newLease(key, token, cfg, sent, g)
			c.watchLoss(l)
			return l, nil
		}
		if errors.Is(err, ErrContended) {
			// A split vote: nobody holds the key. Retry after a random
			// delay, so that one contender gets ahead of the others.
			splits++
			if !wait && splits >= maxSplitRetries {
				return nil, wrap(op, key, err)
			}
			if err := c.sleep(ctx, cfg, rand.N(splitDelay*time.Duration(min(splits, 8))), nil); err != nil {
				return nil, wrap(op, key, err)
			}
			continue
		}
		var locked *backend.LockedError
		isLocked := errors.As(err, &locked) || errors.Is(err, ErrLocked)
		if !isLocked {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrClosed) {
				// The outcome is unknown: the store may have granted
				// the lock. Free it in the background so nothing is
				// left behind; this client's turn for the key passes
				// when that ends (see cleanup).
				turnPassed = c.cleanup(ctx, key, token, cfg.ttl, queued)
			}
			if cerr := ctxErr(ctx); cerr != nil && !errors.Is(err, cerr) {
				err = errors.Join(cerr, err)
			}
			return nil, wrap(op, key, err)
		}
		if !wait {
			return nil, wrap(op, key, err)
		}
		if refused != nil {
			refused[token] = true
		}
		var remaining time.Duration
		if locked != nil {
			remaining = locked.Remaining
		}
		if watch == nil && c.notifier != nil {
			if w, werr := c.notifier.Watch(ctx, key); werr == nil {
				watch = w
				continue // the key may have been freed before the watch began
			}
		}
		var delay time.Duration
		if watch != nil {
			// Wake-ups cover releases; the timer covers expiry.
			delay = cfg.maxBackoff
			if remaining > 0 {
				delay = remaining + time.Millisecond
			}
			if queue != nil {
				// The store queues the waiter and wakes it when it
				// hands the lock over, or when the key is free with
				// the waiter at the head, expiry included: the timer
				// is only a safety net, and each attempt costs a
				// request.
				delay = max(delay, cfg.ttl)
			}
		} else {
			delay = backoff/2 + rand.N(backoff/2+1)
			if remaining > 0 && remaining+time.Millisecond < delay {
				delay = remaining + time.Millisecond
			}
			backoff = min(backoff*2, cfg.maxBackoff)
		}
		if serr := c.sleep(ctx, cfg, delay, watch); serr != nil {
			return nil, wrap(op, key, gaveUp(serr, err))
		}
	}
}

// handed returns the lease of a lock the store handed to this call's place
// in the queue, or nil. The deadline counts from the send time the store
// reports (Handover.Since): a request of this client's, after which the
// store keeps the lock at least the grant's TTL; it is converted to the
// call's clock by its age, read after the clock, so that it can only come
// out earlier. Only a token whose attempt the store refused (and so
// queued) is taken; a lock handed with no validity left is not, and the
// call's next attempt takes it over as a new grant (see Queue.Acquire) or,
// should the store have lost it meanwhile, queues. A handover that breaks
// the backend contract (brokenGrant) is not taken: its token is released
// and the error returned.
func (c *Client) handed(ctx context.Context, q backend.Queue, key string, cfg *config, refused map[string]bool) (*Lease, error) {
	h, ok := q.Handed()
	if !ok || !refused[h.Token] {
		return nil, nil
	}
	if err := c.brokenGrant("a handover", h.Fence, h.TTL, cfg.ttl); err != nil {
		delete(refused, h.Token)
		c.cleanup(ctx, key, h.Token, cfg.ttl, false) // the caller keeps the turn, and passes it
		return nil, err
	}
	now := cfg.clock.Now()
	sent := now.Add(-time.Since(h.Since))
	l := c.newLease(key, h.Token, cfg, sent, h.Grant)
	if !l.Deadline().After(now) {
		l.leftTurn.Store(true) // the call keeps the client's turn: it goes on
		l.mu.Lock()
		l.endLocked(stateLost, fmt.Errorf("%w: handed over with no validity left", ErrLost))
		l.unlock()
		delete(refused, h.Token)
		return nil, nil
	}
	c.watchLoss(l)
	return l, nil
}

// watchLoss ends l as soon as the store says that its lock is gone, on a
// backend that can tell (backend.LossNotifier). Ending a lease early never
// breaks a promise; the backend only reports what the store says.
func (c *Client) watchLoss(l *Lease) {
	if c.loss == nil {
		return
	}
	stop := c.loss.NotifyLoss(l.key, l.token, l.fence, func(err error) {
		l.mu.Lock()
		defer l.unlock()
		if l.state == stateHeld {
			// The store's word, as a renewal's ErrNotHeld would be.
			l.endLocked(stateLost, fmt.Errorf("%w: the store says the lock is gone (%w): %w", ErrLost, ErrNotHeld, err))
		}
	})
	l.onEnd(func(error) { stop() })
}

// gaveUp is the error of an Acquire whose context ended while it waited for
// a key that locked (an ErrLocked) said was held: it wraps both, so that
// errors.Is(err, ErrLocked) tells the caller that the key was held when it
// gave up (not that the store failed), and errors.Is(err,
// context.DeadlineExceeded) why it gave up.
func gaveUp(ctxErr, locked error) error {
	return fmt.Errorf("%w while waiting for a held key (%w)", ctxErr, locked)
}

// ctxErr is ctx.Err(), or context.DeadlineExceeded once ctx's deadline has
// passed even if its timer has not fired yet: a store client that uses the
// deadline for its socket (go-redis with ContextTimeoutEnabled) can time out
// first, and the caller must still learn that its deadline ended the call.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// sleep waits for d on the configured clock, a wake-up from w, or the end of
// ctx, whichever comes first.
func (c *Client) sleep(ctx context.Context, cfg *config, d time.Duration, w backend.Watch) error {
	fired := make(chan struct{})
	t := cfg.clock.AfterFunc(d, func() { close(fired) })
	defer t.Stop()
	var wake <-chan struct{}
	if w != nil {
		wake = w.C()
	}
	select {
	case <-fired:
	case <-wake:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// cleanup releases key for token in the background after an acquire whose
// outcome is unknown; it gives up after the shorter of ttl (the lock has
// expired by then anyway) and cleanupLimit (a store that does not answer
// that long will not answer this either; the lock then expires on its own).
// Close waits for it.
//
// With turn, the cleanup also holds this client's turn for the key, and
// passes it on when the release has ended; cleanup then reports true (the
// caller must not pass the turn itself). Why: the next goroutine of this
// client could not get the lock before the release anyway if the attempt
// was granted, and an Acquire cancelled again and again (short deadlines on
// a slow store) would otherwise start a new attempt per cancellation while
// the earlier ones' requests and releases are still out, piling up work on
// a store that is already too slow to answer, until releases time out and
// locks are left behind for a whole TTL. Holding the turn keeps one attempt
// or one cleanup per key and client on the wire. It delays only this
// client's own goroutines, by at most the cleanup's bound, and decides
// nothing about who holds the lock, so it keeps every promise.
func (c *Client) cleanup(ctx context.Context, key, token string, ttl time.Duration, turn bool) bool {
	return c.background(func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(ttl, cleanupLimit))
		defer cancel()
		c.releaseUntilKnown(rctx, key, token)
		if turn {
			c.local.pass(key)
		}
	}) && turn
}

// cleanupLimit bounds a cleanup release, and so how long Close waits for one.
const cleanupLimit = 3 * time.Second

// cleanupResends bounds how many times a cleanup release is sent again.
const cleanupResends = 2

// unknownOutcome reports whether err leaves a request's outcome unknown: it
// is neither success nor the store's answer (ErrNotHeld, ErrInvalid), and
// the request was not refused by a closed backend.
func unknownOutcome(err error) bool {
	return err != nil && !errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrClosed)
}

// releaseUntilKnown sends a cleanup release, and sends it again, after a
// short pause and at most cleanupResends times, while its outcome is unknown:
// an error that is neither the store's answer (nil, ErrNotHeld, ErrInvalid)
// nor the end of ctx, such as a connection broken by the fault that made the
// acquire's or handover's outcome unknown in the first place. Sent once,
// such a release left the key held for a whole TTL.
//
// Why sending it again keeps every promise: a token is for one attempt, so
// its release can free only the lock that attempt may have taken, never a
// later owner's; and a release that reaches the store twice, or after the
// token lost the key, changes nothing on the lock (the backend contract:
// it answers nil or ErrNotHeld). The bound keeps a store that is down from
// being asked again and again. The conformance case ReleaseSentAgain holds
// a copy back behind a partition until another client holds the key, on
// every backend's real server, and checks that the copy leaves that lock
// alone.
func (c *Client) releaseUntilKnown(ctx context.Context, key, token string) {
	pause := 50 * time.Millisecond
	for sent := 0; ; sent++ {
		err := c.b.Release(ctx, key, token)
		if !unknownOutcome(err) || sent == cleanupResends {
			return
		}
		if c.sleep(ctx, &c.cfg, pause, nil) != nil {
			return
		}
		pause *= 4
	}
}

// background runs f in a goroutine that Close waits for. Once the client is
// closing it runs nothing and reports false.
func (c *Client) background(f func()) bool {
	c.bgMu.Lock()
	defer c.bgMu.Unlock()
	if c.bgClosed {
		return false
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		f()
	}()
	return true
}
