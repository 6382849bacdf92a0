package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
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
	c         *Client
	key       string
	token     string
	fence     uint64
	ttl       time.Duration
	clock     clock.Clock
	maxHold   time.Duration
	acquired  time.Time // when the acquire request was sent
	autoRenew bool
	leftTurn  atomic.Bool // the client's turn for the key was passed on

	mu       sync.Mutex
	state    leaseState
	err      error    // why the lease ended; nil while held
	v        validity // the deadline's one owner
	renewAt  time.Time
	renewing bool
	capped   bool  // the watchdog stopped at the maximum hold time
	lastErr  error // the last failed renewal
	sched    *scheduler
	due      time.Time // guarded by sched.mu
	index    int       // in the scheduler's heap, -1 when not in it; guarded by sched.mu
	done     chan struct{}
	hooks    []func(error)
	ended    []func(error)      // hooks of an end, run by unlock after the mutex is released
	cancel   context.CancelFunc // of an automatic renewal in flight
	next     uint64             // a fence reserved for the next holder; 0: none

	// handover is closed when the lock, handed over ahead of the store,
	// has reached this lease on the store (or failed to); nil for a lease
	// the store granted before it was created. Set before the lease is
	// shared.
	handover chan struct{}
}

func (c *Client) newLease(key, token string, cfg *config, sent time.Time, g backend.Grant) *Lease {
	sched := c.sched
	if cfg.clockID != c.cfg.clockID {
		sched = newScheduler(cfg.clock) // this call chose its own clock
	}
	ttl := cfg.ttl
	if g.TTL > 0 && g.TTL < ttl {
		ttl = g.TTL
	}
	l := &Lease{
		c:         c,
		key:       key,
		token:     token,
		fence:     g.Fence,
		ttl:       ttl,
		clock:     cfg.clock,
		maxHold:   cfg.maxHold,
		acquired:  sent,
		autoRenew: cfg.autoRenew,
		sched:     sched,
		index:     -1,
		v:         validity{drift: cfg.driftFor(ttl)},
	}
	if !sent.IsZero() {
		// No other goroutine sees l before the scheduler does: its mutex
		// publishes the fields set here.
		l.v.sending(cfg.ttl)
		l.extendLocked(sent, g.TTL)
		l.armLocked()
	}
	return l
}

// newHandedLease returns the lease of a lock handed over ahead of the store,
// with a reserved fence, not renewed until completeHandover has settled it.
// Until then it is valid until the earlier of prev (the previous holder's
// deadline: the store keeps the lock for the previous token until then at
// least) and now plus its own TTL less drift (the transfer, sent after now,
// keeps it for this token from its arrival): see validity.
func (c *Client) newHandedLease(key, token string, cfg *config, fence uint64, prev time.Time) *Lease {
	l := c.newLease(key, token, cfg, time.Time{}, backend.Grant{Fence: fence})
	l.mu.Lock()
	defer l.unlock()
	l.handover = make(chan struct{})
	l.acquired = cfg.clock.Now() // for the maximum hold time
	l.v.inherit(prev, l.acquired, l.ttl)
	l.renewAt = l.v.deadline
	l.armLocked()
	return l
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
// its lease ran out.
func (l *Lease) Fence() uint64 { return l.fence }

// TTL returns the lease's time to live.
func (l *Lease) TTL() time.Duration { return l.ttl }

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

// Confirmed waits until the store holds the lock for this lease's token and
// returns nil, or returns the lease's error (lost, released) or ctx's. Only
// a lease handed over ahead of the store (see Acquire) waits: until the
// transfer it started lands, the store still holds the lock for the
// previous holder's token. Call it before a write that the store itself
// makes conditional on the lease's token (the backends' in-store guards,
// such as the Redis backend's SetIfHeld): such a write would be refused
// until then.
func (l *Lease) Confirmed(ctx context.Context) error {
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
	return l.renew(ctx)
}

// Release frees the lock. It returns nil when the lock was held until the
// release; an error wrapping ErrLost when the lease had been lost (the store
// is asked to free the key anyway, token-checked, so it cannot touch a
// successor's lock); or the store's error. When that error leaves the
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
	if err := l.awaitHandover(ctx); err != nil {
		// The store may not know this owner yet: release once it does.
		l.releaseInBackground()
		return wrap("release", l.key, err)
	}
	l.mu.Lock()
	l.checkDeadlineLocked()
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
	l.unlock()

	if lostErr == nil {
		if done, err := l.transferToNext(ctx); done {
			return err
		}
	}
	err := l.c.b.Release(ctx, l.key, l.token)
	l.passTurn()
	switch {
	case lostErr != nil:
		return wrap("release", l.key, lostErr)
	case err == nil:
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
		l.c.cleanup(ctx, l.key, l.token, l.ttl, false)
		return wrap("release", l.key, err)
	}
}

// awaitHandover waits until a lock handed over ahead of the store has
// reached this lease on the store, or failed to.
func (l *Lease) awaitHandover(ctx context.Context) error {
	if l.handover == nil {
		return nil
	}
	select {
	case <-l.handover:
		return nil
	default:
	}
	select {
	case <-l.handover:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// handoverMargin: a lease hands its lock over ahead of the store only while
// at least this share of its TTL is left, so that the handover reaches the
// store well within the validity the next holder starts with.
const handoverMargin = 4 // TTL/4

// transferToNext hands the lock to the next goroutine of this client waiting
// for the key, when the backend can and no other process waits. It reports
// whether the release is done, and its error.
//
// When a fence was reserved for the next holder (by the transfer that
// brought the lock to l), the next holder starts at once, ahead of the
// store, and the transfer goes out in the background. Why that keeps the
// promise, whatever happens to the transfer:
//   - Exclusion. Until the transfer lands, the store holds the lock for l's
//     token, at least until l's deadline plus drift (l's own invariant).
//     Once it lands, it holds it for the next token from its arrival plus
//     the next holder's TTL, and the transfer is sent after now. So the
//     next holder is valid until the earlier of l's deadline and now plus
//     its TTL less drift (validity.inherit): within the store's expiry in
//     either case, even if the transfer is lost, late, or cut off.
//   - Fences. The reserved fence is above every fence granted so far and
//     below every fence granted later (Transferer contract), and l held
//     the lock when it was reserved.
//   - Failure. If the transfer finds the lock gone, the next holder is lost
//     at once. If its outcome is unknown, the next holder is lost at once,
//     before anyone is told anything else, and both tokens are released
//     (killed, on stores that order requests loosely: a late transfer to a
//     released token is refused).
//
// Otherwise the transfer is one request, and the next holder starts when
// it returns, with its deadline counted from the send; a transfer of
// unknown outcome releases the waiter's token (the waiter asks the store
// with fresh tokens) and l's release goes on as usual.
func (l *Lease) transferToNext(ctx context.Context) (bool, error) {
	c := l.c
	if c.transfer == nil || c.caps.InProcess {
		return false, nil
	}
	w := c.local.next(l.key)
	if w == nil {
		return false, nil
	}
	l.mu.Lock()
	reserved, deadline := l.next, l.v.deadline
	l.unlock()
	sameClock := l.sched == c.sched && w.cfg.clockID == c.cfg.clockID
	if left := l.clock.Until(deadline); reserved > 0 && sameClock && left >= l.ttl/handoverMargin && left >= w.cfg.ttl/handoverMargin {
		next := c.newHandedLease(l.key, w.token, w.cfg, reserved, deadline)
		l.leftTurn.Store(true) // the turn goes with the lock
		// Start the transfer before waking the next holder: the
		// goroutine woken last runs first, and that should be the
		// holder. The transfer settles the lease only once it is
		// delivered.
		delivered := make(chan bool, 1)
		complete := func() { next.completeHandover(l.token, delivered) }
		started := c.background(complete)
		delivered <- c.local.deliver(l.key, w, next)
		if !started {
			complete() // the client is closing
		}
		return true, nil
	}
	sent := w.cfg.clock.Now()
	t, err := c.transfer.Transfer(ctx, l.key, l.token, w.token, w.cfg.ttl, backend.TransferOptions{Reserve: true})
	if err == nil {
		if berr := c.brokenGrant("a transfer", t.Fence, t.TTL, w.cfg.ttl); berr != nil {
			// Not a lease: free what the store may hold for w's token
			// (w asks the store with fresh tokens), and report it with
			// l's release, which the store may now refuse.
			c.cleanup(ctx, l.key, w.token, w.cfg.ttl, false)
			err := l.c.b.Release(ctx, l.key, l.token)
			l.passTurn()
			return true, wrap("release", l.key, errors.Join(berr, err))
		}
	}
	switch {
	case err == nil:
		next := c.newLease(l.key, w.token, w.cfg, sent, backend.Grant{Fence: t.Fence, TTL: t.TTL})
		next.mu.Lock()
		next.next = t.Next
		next.unlock()
		l.leftTurn.Store(true) // the turn goes with the lock
		if !c.local.deliver(l.key, w, next) {
			next.releaseInBackground() // the waiter gave up meanwhile
		}
		return true, nil
	case errors.Is(err, ErrNotHeld):
		lost := fmt.Errorf("%w: the store no longer held it at release: %w", ErrLost, err)
		l.mu.Lock()
		l.err = lost
		l.unlock()
		l.passTurn()
		return true, wrap("release", l.key, lost)
	case !errors.Is(err, backend.ErrTransferRefused):
		// Unknown outcome: the store may hold the lock for w's token,
		// which nobody will use (w asks the store with fresh tokens once
		// it has the turn): free it, then release plainly.
		c.cleanup(ctx, l.key, w.token, w.cfg.ttl, false)
	}
	return false, nil // refused, or failed: release plainly
}

// completeHandover sends the transfer of a lock handed over ahead of the
// store, from the previous holder's token to l's, and settles l with the
// outcome once delivered says whether a waiting goroutine took l; when none
// did, it releases l. It runs in the background.
func (l *Lease) completeHandover(from string, delivered <-chan bool) {
	l.mu.Lock()
	deadline := l.v.deadline
	l.unlock()
	ctx, cancel := context.WithCancel(context.Background())
	if clock.IsReal(l.clock) {
		ctx, cancel = context.WithDeadline(context.Background(), deadline)
	}
	defer cancel()
	sent := l.clock.Now()
	t, err := l.c.transfer.Transfer(ctx, l.key, from, l.token, l.ttl, backend.TransferOptions{Fence: l.fence, Reserve: true})
	took := <-delivered
	l.settleHandover(ctx, from, sent, t, err)
	close(l.handover)
	l.mu.Lock()
	if l.state == stateHeld {
		l.armLocked() // the watchdog may renew from now on
	}
	l.unlock()
	if !took { // the waiter gave up meanwhile
		rctx, rcancel := context.WithTimeout(context.Background(), max(l.ttl, time.Second))
		defer rcancel()
		l.Release(rctx)
	}
}

// settleHandover applies the outcome of a handover's transfer to l.
func (l *Lease) settleHandover(ctx context.Context, from string, sent time.Time, t backend.Transferred, err error) {
	l.mu.Lock()
	defer l.unlock()
	l.checkDeadlineLocked()
	if err == nil {
		if berr := l.c.brokenGrant("a transfer", t.Fence, t.TTL, l.ttl); berr == nil && t.Fence != l.fence {
			err = fmt.Errorf("%w: %T reported a transfer with fence %d, not the fence %d reserved for it", ErrBackendContract, l.c.b, t.Fence, l.fence)
		} else if berr != nil {
			err = berr // handled as a transfer of unknown outcome
		}
	}
	switch {
	case err == nil && l.state == stateHeld:
		l.next = t.Next
		l.extendLocked(sent, t.TTL)
		l.armLocked()
	case err == nil:
		// l ended (lost at its deadline) while the transfer was out.
		l.c.cleanup(ctx, l.key, l.token, l.ttl, false)
	case errors.Is(err, ErrNotHeld):
		if l.state == stateHeld {
			l.endLocked(stateLost, fmt.Errorf("%w: the store no longer held the lock when it was handed over: %w", ErrLost, err))
		}
	default:
		// Unknown outcome: the store holds the lock for from or for l.
		// Tell l's holder first, then free both.
		if l.state == stateHeld {
			l.endLocked(stateLost, fmt.Errorf("%w: handing the lock over failed: %w", ErrLost, err))
		}
		l.c.cleanup(ctx, l.key, from, l.ttl, false)
		l.c.cleanup(ctx, l.key, l.token, l.ttl, false)
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

func (l *Lease) renew(ctx context.Context) error {
	if err := l.awaitHandover(ctx); err != nil {
		return wrap("renew", l.key, err)
	}
	l.mu.Lock()
	l.checkDeadlineLocked()
	if l.state != stateHeld {
		err := l.err
		l.unlock()
		return wrap("renew", l.key, err)
	}
	ttl := l.ttl
	l.v.sending(ttl)
	sent := l.clock.Now()
	l.unlock()

	g, err := l.c.b.Renew(ctx, l.key, l.token, ttl)

	l.mu.Lock()
	defer l.unlock()
	l.checkDeadlineLocked()
	if l.state != stateHeld {
		if err == nil && l.state == stateLost {
			// The store extended a lock this client already gave up:
			// free it rather than block the key for another TTL.
			l.c.cleanup(ctx, l.key, l.token, l.ttl, false)
		}
		return wrap("renew", l.key, l.err)
	}
	if err != nil {
		if errors.Is(err, ErrNotHeld) {
			l.endLocked(stateLost, fmt.Errorf("%w: the store no longer holds it for this owner: %w", ErrLost, err))
			return wrap("renew", l.key, l.err)
		}
		l.lastErr = err
		return wrap("renew", l.key, err)
	}
	l.lastErr = nil
	l.extendLocked(sent, g.TTL)
	return nil
}

// extendLocked moves the deadline and the next automatic renewal after a
// successful request sent at sent, granted for granted (0: as asked).
func (l *Lease) extendLocked(sent time.Time, granted time.Duration) {
	if granted > 0 && granted < l.ttl {
		l.ttl = granted // the store shortened the TTL: trust the shorter one
	}
	l.v.confirm(sent, granted)
	l.renewAt = sent.Add(l.ttl / 3)
}

// armLocked schedules the next tick: the automatic renewal or the deadline,
// whichever comes first.
func (l *Lease) armLocked() {
	next := l.v.deadline
	if l.mayRenewLocked() && l.renewAt.Before(next) {
		next = l.renewAt
	}
	l.sched.schedule(l, next)
}

// mayRenewLocked reports whether the watchdog may start a renewal now (when
// renewAt has come): otherwise only the deadline is scheduled.
func (l *Lease) mayRenewLocked() bool {
	return l.autoRenew && !l.renewing && !l.capped && !l.c.closed.Load() && !l.handingOver()
}

// tick runs when the lease is due in its scheduler, on the scheduler's
// goroutine: it checks the deadline and decides whether an automatic
// renewal is due, and never waits for the network, so that however many
// leases fall due together (after a process pause, say) each one's lost
// signal comes on time. It reports whether the caller should run
// watchdogRenew, which it has then marked as running. A tick with nothing due
// (the deadline moved) schedules the lease again.
func (l *Lease) tick() bool {
	l.mu.Lock()
	defer l.unlock()
	if l.state != stateHeld || l.checkDeadlineLocked() {
		return false
	}
	now := l.clock.Now()
	if !l.mayRenewLocked() || now.Before(l.renewAt) {
		l.armLocked() // woke early, or nothing to do before the deadline
		return false
	}
	if l.maxHold > 0 && now.Add(l.ttl).After(l.acquired.Add(l.maxHold)) {
		l.capped = true
		l.armLocked()
		return false
	}
	l.renewing = true
	l.armLocked() // guard the deadline while the renewal runs
	return true
}

// watchdogRenew runs the automatic renewal that tick marked as running.
func (l *Lease) watchdogRenew() {
	l.mu.Lock()
	if l.state != stateHeld {
		l.renewing = false
		l.unlock()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	if clock.IsReal(l.clock) {
		// Past the deadline the renewal is useless: let the backend give
		// up then too.
		ctx, cancel = context.WithDeadline(context.Background(), l.v.deadline)
	}
	l.cancel = cancel
	l.unlock()

	err := l.renew(ctx)
	cancel()

	l.mu.Lock()
	defer l.unlock()
	l.renewing = false
	l.cancel = nil
	if l.state != stateHeld {
		return
	}
	if err != nil {
		// Retry soon, while the lease is still valid.
		now := l.clock.Now()
		wait := min(l.ttl/3, l.v.deadline.Sub(now)/3)
		l.renewAt = now.Add(max(wait, time.Millisecond))
	}
	l.armLocked()
}

// handingOver reports whether the lock is still on its way to l on the
// store; completeHandover then settles and schedules l.
func (l *Lease) handingOver() bool {
	if l.handover == nil {
		return false
	}
	select {
	case <-l.handover:
		return false
	default:
		return true
	}
}

// checkDeadlineLocked ends the lease as lost if its deadline has passed, and
// reports whether it did.
func (l *Lease) checkDeadlineLocked() bool {
	if l.state != stateHeld || l.clock.Until(l.v.deadline) > 0 {
		return false
	}
	var err error
	switch {
	case l.capped:
		err = fmt.Errorf("%w: maximum hold time %v reached", ErrLost, l.maxHold)
	case l.lastErr != nil:
		err = fmt.Errorf("%w: validity deadline passed without a successful renewal (last renewal error: %w)", ErrLost, l.lastErr)
	case l.autoRenew:
		err = fmt.Errorf("%w: validity deadline passed before a renewal completed", ErrLost)
	default:
		err = fmt.Errorf("%w: validity deadline passed (automatic renewal is off)", ErrLost)
	}
	l.endLocked(stateLost, err)
	return true
}

// passTurn hands the client's turn for the key to its next waiting
// goroutine, once: after the release reached the store, or on loss.
func (l *Lease) passTurn() {
	if !l.c.caps.InProcess && l.leftTurn.CompareAndSwap(false, true) {
		l.c.local.pass(l.key)
	}
}

// endLocked ends the lease, with l.mu held. Its end hooks run in unlock,
// once the mutex is released.
func (l *Lease) endLocked(st leaseState, err error) {
	l.state = st
	l.err = err
	if st == stateLost {
		l.passTurn()
	}
	l.sched.cancel(l)
	if l.cancel != nil {
		l.cancel()
	}
	if l.done == nil {
		l.done = closedChan
	} else if l.done != closedChan {
		close(l.done)
	}
	l.ended = append(l.ended, l.hooks...) // run by unlock
	l.hooks = nil
}
