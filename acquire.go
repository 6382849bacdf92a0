package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/distlock/lock/backend"
)

// TryAcquire makes one attempt to take key. It returns ErrLocked at once when
// another owner holds it, including another goroutine of this Client (then
// without asking the store). On a multi-node store (Redlock) an attempt
// that got no lock while nobody holds the key (backend.ErrContended: a
// split vote, where concurrent attempts left nobody a majority, or a
// majority that came later than the TTL) is retried after a random delay;
// once a TTL has passed since the first attempt, or after 64 attempts, it
// returns the last attempt's error, for which errors.Is(err, ErrContended)
// holds.
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

// errLocalHolder: another goroutine of this client holds or is taking the key.
var errLocalHolder = fmt.Errorf("%w (by this client)", ErrLocked)

// Split votes and quorums later than the TTL (backend.ErrContended) are
// retried after a random delay of up to splitDelay times the number of
// splits so far (at most 8); TryAcquire gives up after maxSplitRetries, or
// once more than the TTL has passed since it sent the first attempt:
// attempts that are slow (a quorum later than the TTL took more than a TTL)
// would otherwise hold it up to maxSplitRetries times as long.
const (
	splitDelay      = time.Millisecond
	maxSplitRetries = 64
)

func (c *Client) acquire(ctx context.Context, op, key string, wait bool, opts []Option) (lease *Lease, err error) {
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
		if local.observerID != c.cfg.observerID {
			return nil, invalid(ErrInvalidOption, "%s %q: WithObserver and WithLogger are Client options (give them to lock.New)", op, key)
		}
		if local.epoch != c.cfg.epoch || local.epochSet != c.cfg.epochSet {
			return nil, invalid(ErrInvalidOption, "%s %q: WithFenceEpoch is a Client option (give it to lock.New): every lease of a Client takes its fences under one epoch", op, key)
		}
		if err := c.checkTTL(&local); err != nil {
			return nil, err
		}
		cfg = &local
	}
	if cfg.maxHold > 0 && cfg.maxHold < cfg.ttl {
		return nil, invalid(ErrInvalidOption, "%s %q: WithMaxHold(%v) is shorter than the TTL %v; use 0 (no cap) or at least the TTL", op, key, cfg.maxHold, cfg.ttl)
	}
	if c.observing() {
		return c.acquireObserved(ctx, op, key, wait, cfg)
	}
	return c.acquireWith(ctx, op, key, wait, cfg, time.Time{})
}

// acquireObserved is acquireWith, reported to the client's observer. A
// TryAcquire's first attempt follows its start at once: the start serves
// as that attempt's send time (an earlier send time only makes the
// deadline earlier), so that observing reads the clock no more often.
func (c *Client) acquireObserved(ctx context.Context, op, key string, wait bool, cfg *config) (*Lease, error) {
	start := cfg.clock.Now()
	var early time.Time
	if wait {
		c.observe(ctx, Event{Kind: EventAcquireStart, Key: key, Start: start, Wait: true})
	} else {
		early = start
	}
	l, err := c.acquireWith(ctx, op, key, wait, cfg, early)
	e := Event{Kind: EventAcquire, Key: key, Start: start, Wait: wait, Err: err}
	if l != nil {
		e.Fence = l.Fence()
	}
	c.observe(ctx, e)
	return l, err
}

// acquireWith is acquire with its options applied; early, when not zero,
// is the send time of the first attempt.
func (c *Client) acquireWith(ctx context.Context, op, key string, wait bool, cfg *config, early time.Time) (lease *Lease, err error) {
	if cfg.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.wait)
		defer cancel()
	}
	if err := ctx.Err(); err != nil {
		return nil, wrap(op, key, err)
	}
	ctx = c.labelled(ctx, cfg) // the grants carry the holder's description

	// Take this client's turn for the key first: goroutines of one client
	// queue here instead of all asking the store. A store in this process
	// queues them itself: t stays nil, no turn.
	var t *turn
	if !c.caps.InProcess {
		if wait {
			var l *Lease
			var tokenErr error
			t, l, err = c.local.waitTurn(ctx, key, cfg, func() (string, error) {
				token, err := c.tokenFor(cfg)
				tokenErr = err
				return token, err
			})
			if err != nil {
				if tokenErr != nil {
					return nil, wrap(op, key, tokenErr)
				}
				return nil, wrap(op, key, gaveUp(err, errLocalHolder))
			}
			if l != nil {
				return l, nil // the previous holder transferred the lock, and the turn, to us
			}
		} else if t = c.local.tryTurn(key); t == nil {
			return nil, wrap(op, key, errLocalHolder)
		}
	}
	var watch backend.Watch
	// A store that queues waiters and hands them the lock (backend.Queuer)
	// gets this call's attempts through its place in the queue.
	var queue backend.Queue
	var refused map[string]bool // tokens of attempts the store queued
	if qr, ok := c.notifier.(backend.Queuer); ok && wait && t != nil {
		if q, err := qr.Queue(key); err == nil {
			queue, watch, refused = q, q, map[string]bool{}
		}
	}
	defer func() {
		if watch != nil {
			watch.Close(lease != nil)
		}
		// The lease did not come: next in line. A lease or a cleanup
		// that the turn was handed on to (t.handOn) passes it when it
		// ends; this pass then does nothing.
		t.pass()
	}()
	backoff := cfg.minBackoff
	splits := 0
	var firstSent time.Time // of the first attempt that met ErrContended
	for {
		if queue != nil {
			l, err := c.handed(ctx, queue, key, cfg, refused, t)
			if err != nil {
				return nil, wrap(op, key, err)
			}
			if l != nil {
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
		token, err := c.tokenFor(cfg)
		if err != nil {
			return nil, wrap(op, key, err)
		}
		sent := early
		if sent.IsZero() {
			sent = cfg.clock.Now()
		}
		early = time.Time{}
		var g backend.Grant
		if queue != nil {
			g, err = queue.Acquire(ctx, token, cfg.ttl)
		} else {
			g, err = c.b.Acquire(ctx, key, token, cfg.ttl)
		}
		if err == nil {
			if berr := c.brokenGrant("a grant", g.Fence, g.TTL, cfg.ttl); berr != nil {
				// Not a lease: free whatever the store holds for the
				// token, as after an acquire of unknown outcome.
				c.cleanup(ctx, key, token, cfg.ttl, t.handOn())
				return nil, wrap(op, key, berr)
			}
			l := c.newLease(key, token, cfg, sent, g, t.handOn())
			c.watchLoss(l)
			return l, nil
		}
		if errors.Is(err, ErrContended) {
			// A split vote, or a quorum too late to hold the lock:
			// nobody holds the key. Retry after a random delay, so
			// that one contender gets ahead of the others.
			if splits == 0 {
				firstSent = sent
			}
			splits++
			if !wait {
				if splits >= maxSplitRetries {
					return nil, wrap(op, key, err)
				}
				if spent := cfg.clock.Now().Sub(firstSent); spent > cfg.ttl {
					return nil, wrap(op, key, fmt.Errorf("%w (gave up: %d attempt(s) took %v, longer than the %v TTL)", err, splits, spent.Round(time.Millisecond), cfg.ttl))
				}
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
				c.cleanup(ctx, key, token, cfg.ttl, t.handOn())
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
