package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
)

// Handovers: a lock that reaches a waiter without the waiter's own acquire.
// Two kinds, in this file:
//   - the store's (backend.Queuer): the store hands a released lock to the
//     head of its queue of waiters; handed takes it in;
//   - this Client's (backend.Transferer): a lease that is released hands
//     its lock to the next goroutine of the Client waiting for the key
//     (transferToNext), with one transfer request, or ahead of the store
//     (newHandedLease, completeHandover). The Client's turn for the key
//     goes with the lock.

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
// and the error returned. A lease it returns holds the turn t, handed on to
// it; otherwise the call keeps t.
func (c *Client) handed(ctx context.Context, q backend.Queue, key string, cfg *config, refused map[string]bool, t *turn) (*Lease, error) {
	h, ok := q.Handed()
	if !ok || !refused[h.Token] {
		return nil, nil
	}
	if err := c.brokenGrant("a handover", h.Fence, h.TTL, cfg.ttl); err != nil {
		delete(refused, h.Token)
		c.cleanup(ctx, key, h.Token, cfg.ttl, nil) // the caller keeps the turn, and passes it
		return nil, err
	}
	now := cfg.clock.Now()
	sent := now.Add(-time.Since(h.Since))
	if v := grantValidity(cfg, sent, h.Grant); v.expired(now) {
		// Handed over with no validity left: no lease, and the call
		// keeps the client's turn: it goes on.
		delete(refused, h.Token)
		return nil, nil
	}
	l := c.newLease(key, h.Token, cfg, sent, h.Grant, t.handOn())
	c.watchLoss(l)
	return l, nil
}

// newHandedLease returns the lease of a lock handed over ahead of the store,
// with a reserved fence, not renewed until completeHandover has settled it.
// Until then it is valid until the earlier of prev (the previous holder's
// deadline: the store keeps the lock for the previous token until then at
// least) and now plus its own TTL less drift (the transfer, sent after now,
// keeps it for this token from its arrival): see validity.
// The lease holds the turn t, which came with the lock.
func (c *Client) newHandedLease(key, token string, cfg *config, fence uint64, prev time.Time, t *turn) *Lease {
	start := cfg.clock.Now() // also the start of the maximum hold time
	l := c.lease(key, token, cfg, fence, start, handedValidity(cfg, prev, start), t)
	l.handover = make(chan struct{})
	l.flags |= flagDoubtful // its transfer's outcome is settled apart (completeHandover)
	// No other goroutine sees l before the scheduler does: its mutex
	// publishes the fields set here. Only the deadline is scheduled until
	// completeHandover has settled the lease.
	l.wd.renewAt = l.v.deadline
	l.armLocked()
	return l
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
// whether the release is done, and its error; when it is not done, moved
// reports that a transfer of unknown outcome went out, which may have moved
// the lock to the waiter's token (see Release).
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
func (l *Lease) transferToNext(ctx context.Context) (done, moved bool, err error) {
	c := l.c
	if c.transfer == nil || c.caps.InProcess {
		return false, false, nil
	}
	w := c.local.next(l.key)
	if w == nil {
		return false, false, nil
	}
	l.mu.Lock()
	reserved, deadline, ttl := l.next, l.v.deadline, l.v.ttl
	left := l.v.remaining(l.sched.clock.Now())
	l.unlock()
	sameClock := l.sched == c.sched && w.cfg.clockID == c.cfg.clockID
	// A reserved fence that does not fit under the fence epoch takes the
	// plain path, whose transfer the contract check refuses.
	if reserved > 0 && c.cfg.fits(reserved) && sameClock && left >= ttl/handoverMargin && left >= w.cfg.ttl/handoverMargin {
		next := c.newHandedLease(l.key, w.token, w.cfg, reserved, deadline, l.turn.handOn()) // the turn goes with the lock
		// Start the transfer before waking the next holder: the
		// goroutine woken last runs first, and that should be the
		// holder. The transfer settles the lease only once it is
		// delivered.
		delivered := make(chan bool, 1)
		complete := func() { next.completeHandover(l.token, w.cfg, delivered) }
		started := c.background(complete)
		delivered <- c.local.deliver(l.key, w, next)
		if !started {
			complete() // the client is closing
		}
		l.observeHandover(ctx)
		return true, false, nil
	}
	sent := w.cfg.clock.Now()
	t, err := c.transfer.Transfer(c.labelled(ctx, w.cfg), l.key, l.token, w.token, w.cfg.ttl, backend.TransferOptions{Reserve: true})
	if err == nil {
		if berr := c.brokenGrant("a transfer", t.Fence, t.TTL, w.cfg.ttl); berr != nil {
			// Not a lease: free what the store may hold for w's token
			// (w asks the store with fresh tokens), and report it with
			// l's release, which the store may now refuse.
			c.cleanup(ctx, l.key, w.token, w.cfg.ttl, nil)
			err := l.c.b.Release(ctx, l.key, l.token)
			l.turn.pass()
			return true, false, wrap("release", l.key, errors.Join(berr, err))
		}
	}
	switch {
	case err == nil:
		next := c.newLease(l.key, w.token, w.cfg, sent, backend.Grant{Fence: t.Fence, TTL: t.TTL}, l.turn.handOn()) // the turn goes with the lock
		next.mu.Lock()
		next.next = t.Next
		next.unlock()
		if !c.local.deliver(l.key, w, next) {
			next.releaseInBackground() // the waiter gave up meanwhile
		} else {
			l.observeHandover(ctx)
		}
		return true, false, nil
	case errors.Is(err, ErrNotHeld):
		lost := fmt.Errorf("%w: the store no longer held it at release: %w", ErrLost, err)
		l.mu.Lock()
		l.err = lost
		l.unlock()
		l.turn.pass()
		return true, false, wrap("release", l.key, lost)
	case !errors.Is(err, backend.ErrTransferRefused):
		// Unknown outcome: the store may hold the lock for w's token,
		// which nobody will use (w asks the store with fresh tokens once
		// it has the turn): free it, then release plainly.
		c.cleanup(ctx, l.key, w.token, w.cfg.ttl, nil)
		return false, true, nil
	}
	return false, false, nil // refused: release plainly
}

// completeHandover sends the transfer of a lock handed over ahead of the
// store, from the previous holder's token to l's, and settles l with the
// outcome once delivered says whether a waiting goroutine took l; when none
// did, it releases l. It runs in the background.
func (l *Lease) completeHandover(from string, cfg *config, delivered <-chan bool) {
	l.mu.Lock()
	deadline, ttl := l.v.deadline, l.v.ttl // inherit recorded the transfer's TTL as sent
	l.unlock()
	ctx, cancel := context.WithCancel(context.Background())
	if clock.IsReal(l.sched.clock) {
		ctx, cancel = context.WithDeadline(context.Background(), deadline)
	}
	defer cancel()
	sent := l.sched.clock.Now()
	t, err := l.c.transfer.Transfer(l.c.labelled(ctx, cfg), l.key, from, l.token, ttl, backend.TransferOptions{Fence: l.fence, Reserve: true})
	took := <-delivered
	l.settleHandover(ctx, from, sent, t, err)
	close(l.handover)
	l.mu.Lock()
	if l.state == stateHeld {
		l.armLocked() // the watchdog may renew from now on
	}
	l.unlock()
	if !took { // the waiter gave up meanwhile
		rctx, rcancel := context.WithTimeout(context.Background(), max(ttl, time.Second))
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
		if berr := l.c.brokenGrant("a transfer", t.Fence, t.TTL, l.v.ttl); berr == nil && t.Fence != l.fence {
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
		l.c.cleanup(ctx, l.key, l.token, l.v.ttl, nil)
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
		l.c.cleanup(ctx, l.key, from, l.v.ttl, nil)
		l.c.cleanup(ctx, l.key, l.token, l.v.ttl, nil)
	}
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

// observeHandover reports that l's release handed the lock to a waiting
// goroutine of its client.
func (l *Lease) observeHandover(ctx context.Context) {
	if l.c.observing() {
		l.observeEnd(ctx, EventHandover, l.sched.clock.Now(), false, nil)
	}
}
