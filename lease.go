package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/distlock/lock/backend"
)

type leaseState uint8

const (
	stateHeld leaseState = iota
	stateReleased
	stateLost
)

// closedChan is the Done channel of leases that ended before anyone asked.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Lease is one held lock. Its methods are safe for concurrent use.
//
// A Lease is valid until its Deadline, which renewals move forward. When the
// deadline passes without a successful renewal, or the store reports that
// the lock is no longer this owner's, the lease is lost: Done is closed and
// Err returns an error wrapping ErrLost. Stop touching the protected resource
// then.
type Lease struct {
	// A lease's parts live in files of their own: its deadline and TTL in
	// validity.go, its watchdog in renew.go, the handover of its lock to
	// the next goroutine of the Client in handover.go, and the Client's
	// turn for the key, which it holds, in local.go. Its fields are
	// grouped by what guards them.

	// Set before the lease is shared, then only read.
	c        *Client
	key      string
	token    string
	fence    uint64
	sched    *scheduler // runs the lease's ticks on the lease's clock: its deadline and its watchdog
	acquired time.Time  // when the acquisition began; WithMaxHold counts from there
	// The watchdog's settings (renew.go); autoRenew is packed below.
	maxHold time.Duration // 0: no cap
	// turn is the Client's turn for the key, which the lease holds until
	// it ends or hands it on with the lock; nil on an in-process store.
	// The turn itself passes once, by its own atomic flag, whichever
	// goroutine passes it (see turn).
	turn *turn
	// handover is closed when the lock, handed over ahead of the store,
	// has reached this lease on the store (or failed to); nil for a lease
	// the store granted before it was created (handover.go).
	handover chan struct{}

	// Guarded by mu: the lease's state and everything that changes with it.
	mu    sync.Mutex
	err   error         // why the lease ended; nil while held
	v     validity      // the deadline and the TTL, and their one owner
	wd    watchdog      // the automatic renewal (renew.go)
	next  uint64        // a fence reserved for the next holder; 0: none (handover.go)
	done  chan struct{} // made by Done; closed when the lease ends
	hooks []func(error) // called once when the lease ends (onEnd)
	ended []func(error) // hooks of an end, run by unlock after the mutex is released

	// Guarded by sched.mu (scheduler.go).
	due   time.Time // when the scheduler runs tick next
	index int32     // in the scheduler's heap; -1 when not in it

	// Small fields packed together, so that a Lease takes 384 bytes, not
	// 416: a process holding 300,000 leases keeps each in Go's 384-byte
	// size class (TestLeaseSize). Each keeps the guard of its group above.
	state     leaseState // guarded by mu
	autoRenew bool       // set before the lease is shared; the watchdog's setting
	flags     leaseFlags // guarded by mu
	// outstanding counts the lease's renewals sent and not yet answered,
	// up to 255 (then flagDoubtful is set for good); guarded by mu. With
	// flagDoubtful it tells Extend whether a request sent before it can
	// still arrive (extend.go).
	outstanding uint8
}

// leaseFlags are a lease's flags, guarded by its mutex.
type leaseFlags uint8

const (
	// flagReleasing: Release was called (an observer hears of the first).
	flagReleasing leaseFlags = 1 << iota
	// flagDoubtful: a request for the token may still arrive at any
	// time: a renewal's outcome was unknown, or the lease was handed over
	// ahead of the store.
	flagDoubtful
)

// newLease returns the lease of a lock that the store granted, as g says,
// to token for a request sent at sent that asked for cfg's TTL; the lease
// holds the turn t and its watchdog is scheduled.
func (c *Client) newLease(key, token string, cfg *config, sent time.Time, g backend.Grant, t *turn) *Lease {
	l := c.lease(key, token, cfg, g.Fence, sent, grantValidity(cfg, sent, g), t)
	// No other goroutine sees l before the scheduler does: its mutex
	// publishes the fields set here.
	l.planRenewalLocked(sent)
	l.armLocked()
	return l
}

// lease returns a lease of key for token with fence, valid as v says,
// that holds the turn t; acquired is when its acquisition began. Nothing
// schedules it yet.
func (c *Client) lease(key, token string, cfg *config, fence uint64, acquired time.Time, v validity, t *turn) *Lease {
	sched := c.sched
	if cfg.clockID != c.cfg.clockID {
		sched = newScheduler(cfg.clock) // this call chose its own clock
	}
	return &Lease{
		c:         c,
		key:       key,
		token:     token,
		fence:     fence,
		acquired:  acquired,
		autoRenew: cfg.autoRenew,
		maxHold:   cfg.maxHold,
		sched:     sched,
		turn:      t,
		v:         v,
		index:     -1,
	}
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

// Key returns the locked key.
func (l *Lease) Key() string { return l.key }

// Token returns the owner token: 32 hex digits, 128 random bits, unique to
// this acquisition. The store checks it on every renew and release.
func (l *Lease) Token() string { return l.token }

// Fence returns the fencing token: > 0 and strictly increasing over successive
// holders of the key. Send it with every write to the protected resource and
// have the resource reject a fence lower than the highest it has accepted;
// that keeps a paused or partitioned former holder from doing damage after
// its lease ran out. Under a fence epoch (WithFenceEpoch) the epoch sits in
// its top bits, above the store's fence.
func (l *Lease) Fence() uint64 { return l.c.cfg.fence(l.fence) }

// StoreFence returns the fence as the store granted it, without the fence
// epoch (WithFenceEpoch); it equals Fence when the Client has no epoch.
// Give resources Fence. StoreFence is for guards that check the lease in
// the store itself, against the store's own value (a revision, an index).
func (l *Lease) StoreFence() uint64 { return l.fence }

// TTL returns the lease's time to live: the TTL it asks the store for when
// it renews, shorter than the one asked for at acquisition only if the
// store said it keeps the lock a shorter time.
func (l *Lease) TTL() time.Duration {
	l.mu.Lock()
	defer l.unlock()
	return l.v.ttl
}

// Deadline returns when the lease stops being valid unless renewed: the send
// time of the last successful acquire or renew request, plus the TTL, minus
// the drift allowance, on the client's clock. A lease handed over ahead of
// the store (see Client.Acquire) is valid, until the handover lands, until
// the earlier of the previous holder's deadline and its own TTL less drift
// from before the handover was sent. It is never later than the store's
// expiry of the lock for this lease's token, as measured from requests
// this client sent (see validity).
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.unlock()
	return l.v.deadline
}

// Done returns a channel that is closed when the lease ends: lost or
// released. Err tells which.
func (l *Lease) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.unlock()
	l.checkDeadlineLocked()
	if l.done == nil {
		if l.state != stateHeld {
			l.done = closedChan
		} else {
			l.done = make(chan struct{})
		}
	}
	return l.done
}

// Err returns nil while the lease is held, an error wrapping ErrLost once it
// is lost, and ErrReleased after a release.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.unlock()
	l.checkDeadlineLocked()
	return l.err
}

// WaitConfirmed waits until the store holds the lock for this lease's token and
// returns nil, or returns the lease's error (lost, released) or ctx's. Only
// a lease handed over ahead of the store (see Acquire) waits: until the
// transfer it started lands, the store still holds the lock for the
// previous holder's token. Call it before a write that the store itself
// makes conditional on the lease's token (the backends' in-store guards,
// such as the Redis backend's SetIfHeld): such a write would be refused
// until then.
func (l *Lease) WaitConfirmed(ctx context.Context) error {
	if ctx == nil {
		return invalid(ErrInvalid, "confirm %q: nil context", l.key)
	}
	if err := l.awaitHandover(ctx); err != nil {
		return wrap("confirm", l.key, err)
	}
	return l.Err()
}

// Renew extends the lease by its TTL from now. It returns an error wrapping
// ErrLost, and sends nothing to the store, when the lease is already lost;
// ErrReleased after Release. When the store says the lock is no longer this
// owner's, the lease becomes lost. Any other error leaves the lease valid
// until its current deadline.
func (l *Lease) Renew(ctx context.Context) error {
	if ctx == nil {
		return invalid(ErrInvalid, "renew %q: nil context", l.key)
	}
	return l.renew(ctx, false)
}

// Release frees the lock. It returns nil when the lock was held until the
// release, and nil for a lease that had already ended as lost when Release
// was called (its deadline passed, or its loss was found): Done and Err
// report that loss, and Err keeps it, so that a deferred Release needs no
// filter. The store is asked to free the key anyway, token-checked, so it
// cannot touch a successor's lock. Release returns an error wrapping
// ErrLost when the release itself finds that the store no longer held the
// lock (a loss nothing had reported yet), or the store's error. Do and
// TryDo report a loss either way. When the store's error leaves the
// outcome unknown (a lost reply, a ctx that ended while the request was
// out), the release is sent again in the background, up to twice more
// within the shorter of the TTL and 3s, and Client.Close waits for it;
// failing that, the lock expires after its TTL. Releasing twice returns nil.
//
// When another goroutine of the same Client waits for the key, Release may
// hand the lock to it ahead of the store (see Acquire) and return nil at
// once; should the store turn out to have lost the lock meanwhile, that
// goroutine's lease is the one that ends as lost.
func (l *Lease) Release(ctx context.Context) error {
	if ctx == nil {
		return invalid(ErrInvalid, "release %q: nil context", l.key)
	}
	if !l.c.observing() {
		return l.release(ctx, nil)
	}
	var n releaseNote
	err := l.release(ctx, &n)
	if n.first {
		seen := err
		if err == nil && n.lost != nil {
			seen = n.lost // lost before the release (EventLost reported it)
		}
		l.observeEnd(ctx, EventRelease, n.start, false, seen)
	}
	return err
}

// releaseNote is what an observed Release learns from release: whether it
// was the lease's first release, and the loss that ended the lease before
// it, if one did.
type releaseNote struct {
	first bool
	start time.Time // when it began, as its deadline check read it
	lost  error
}

// release is Release; it fills n, when not nil.
func (l *Lease) release(ctx context.Context, n *releaseNote) error {
	if err := l.awaitHandover(ctx); err != nil {
		// The store may not know this owner yet: release once it does.
		l.releaseInBackground()
		return wrap("release", l.key, err)
	}
	l.mu.Lock()
	now := l.sched.clock.Now()
	l.checkDeadlineAtLocked(now)
	if n != nil {
		n.first, n.start = l.flags&flagReleasing == 0, now
	}
	l.flags |= flagReleasing
	switch l.state {
	case stateReleased:
		l.unlock()
		return nil
	case stateHeld:
		l.endLocked(stateReleased, ErrReleased)
	}
	lostErr := l.err
	if lostErr == ErrReleased {
		lostErr = nil
	}
	if n != nil {
		n.lost = lostErr
	}
	l.unlock()

	var moved bool
	var err error
	if lostErr == nil {
		var done bool
		if done, moved, err = l.transferToNext(ctx); done {
			return err
		}
	}
	err = l.c.b.Release(ctx, l.key, l.token)
	l.turn.pass()
	switch {
	case lostErr != nil:
		// Lost before this call: Done and Err reported it, and Err
		// keeps it. The release was only the store's cleanup.
		return nil
	case err == nil:
		return nil
	case moved && errors.Is(err, ErrNotHeld):
		// A transfer of unknown outcome went out before this release
		// (see transferToNext): it moved the lock to the waiter's
		// token, whose cleanup frees it (or the lock expired while the
		// transfer was out, after Release was called). That is no
		// loss: l was valid when Release was called, and nothing is
		// left for l's token.
		return nil
	case errors.Is(err, ErrNotHeld):
		lost := fmt.Errorf("%w: the store no longer held it at release: %w", ErrLost, err)
		l.mu.Lock()
		l.err = lost
		l.unlock()
		return wrap("release", l.key, lost)
	default:
		// Unknown outcome (the reply was lost, or ctx ended while the
		// request was out): the store may still hold the lock. Send the
		// release again in the background rather than leave the key
		// blocked for the rest of its TTL (see releaseUntilKnown).
		l.c.cleanup(ctx, l.key, l.token, l.TTL(), nil)
		return wrap("release", l.key, err)
	}
}

// releaseInBackground releases a lease nobody will use, bounded by its TTL.
func (l *Lease) releaseInBackground() {
	if !l.c.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), max(l.TTL(), time.Second))
		defer cancel()
		l.Release(ctx)
	}) {
		l.turn.pass() // the client is closing: the lock expires
	}
}

// onEnd registers f to be called once, with the lease's error, when it
// ends; at once if it has ended. f runs without l's mutex held.
func (l *Lease) onEnd(f func(error)) {
	l.mu.Lock()
	if l.state == stateHeld {
		l.hooks = append(l.hooks, f)
		l.unlock()
		return
	}
	err := l.err
	l.unlock()
	f(err)
}

// unlock releases l's mutex and then runs the end hooks that endLocked
// took while it was held. Every unlock of l.mu goes through here, so the
// goroutine that ended the lease runs them right after its critical
// section.
//
// Why running them outside the mutex is safe: endLocked has already made
// the end visible (state, err, Done closed, the scheduler and a renewal in
// flight cancelled) and moved the hooks out of l.hooks under the mutex, and
// onEnd appends only while the lease is held, so each hook runs exactly
// once, after the end, as before. A hook that needs the lease's mutex (a
// backend's stop function that waits for its loss callback, which takes
// it, or one that reads l.Err) would deadlock under it; outside, it just
// finds the lease ended.
func (l *Lease) unlock() {
	hooks, err := l.ended, l.err
	l.ended = nil
	l.mu.Unlock()
	for _, f := range hooks {
		f(err)
	}
}

// checkDeadlineLocked ends the lease as lost if its deadline has passed, and
// reports whether it did.
func (l *Lease) checkDeadlineLocked() bool {
	return l.checkDeadlineAtLocked(l.sched.clock.Now())
}

// checkDeadlineAtLocked is checkDeadlineLocked at now, read from the
// lease's clock.
func (l *Lease) checkDeadlineAtLocked(now time.Time) bool {
	if l.state != stateHeld || !l.v.expired(now) {
		return false
	}
	var err error
	switch {
	case l.wd.capped:
		err = fmt.Errorf("%w: maximum hold time %v reached", ErrLost, l.maxHold)
	case l.wd.lastErr != nil:
		err = fmt.Errorf("%w: validity deadline passed without a successful renewal (last renewal error: %w)", ErrLost, l.wd.lastErr)
	case l.autoRenew:
		err = fmt.Errorf("%w: validity deadline passed before a renewal completed", ErrLost)
	default:
		err = fmt.Errorf("%w: validity deadline passed (automatic renewal is off)", ErrLost)
	}
	l.endLocked(stateLost, err)
	if prefixed(l.token) {
		// The lock may live on with its session on the store, which
		// the leases of this client still renew (backend.TokenPrefixer):
		// free it.
		l.c.cleanup(context.Background(), l.key, l.token, l.v.ttl, nil)
	}
	return true
}

// endLocked ends the lease, with l.mu held. Its end hooks run in unlock,
// once the mutex is released. A lost lease gives up the client's turn for
// the key at once; a released one, once the store has been told (Release).
func (l *Lease) endLocked(st leaseState, err error) {
	l.state = st
	l.err = err
	if st == stateLost {
		l.turn.pass()
	}
	l.sched.cancel(l)
	if l.wd.cancel != nil {
		l.wd.cancel()
	}
	if l.done == nil {
		l.done = closedChan
	} else if l.done != closedChan {
		close(l.done)
	}
	l.ended = append(l.ended, l.hooks...) // run by unlock
	l.hooks = nil
	if st == stateLost && l.c.observing() {
		end := l.sched.clock.Now() // a loss is rare: a read of the clock is fine
		if dl := l.v.deadline; dl.Before(end) && dl.After(l.acquired) {
			end = dl // lost at its deadline, found a little later
		}
		l.ended = append(l.ended, func(err error) { l.observeEnd(context.Background(), EventLost, end, false, err) })
	}
}
