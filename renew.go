package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
)

// watchdog is a lease's automatic renewal state, guarded by the lease's
// mutex. The lease's scheduler (scheduler.go) calls tick when the next
// renewal or the deadline is due, whichever comes first; tick decides,
// and watchdogRenew renews. Its settings (Lease.autoRenew, Lease.maxHold)
// are fixed when the lease is made.
type watchdog struct {
	renewAt  time.Time          // when the next automatic renewal is due
	renewing bool               // an automatic renewal is in flight
	cancel   context.CancelFunc // of the automatic renewal in flight
	capped   bool               // stopped at the maximum hold time
	lastErr  error              // the last failed renewal, automatic or not; nil after a success
}

// renew is Renew, and the watchdog's renewal: one renew request, whose
// outcome moves the deadline or ends the lease.
func (l *Lease) renew(ctx context.Context, auto bool) error {
	if err := l.awaitHandover(ctx); err != nil {
		return wrap("renew", l.key, err)
	}
	ttl, sent, err := l.renewStart()
	if err != nil {
		return err
	}
	g, err := l.c.b.Renew(ctx, l.key, l.token, ttl)
	err = l.renewEnd(ctx, sent, g, err)
	if l.c.observing() {
		l.observeEnd(ctx, EventRenew, sent, auto, err)
	}
	return err
}

// renewStart is the start of a renewal: the TTL to ask for and the send
// time the deadline will count from, or the error of a lease no longer
// held.
func (l *Lease) renewStart() (ttl time.Duration, sent time.Time, err error) {
	l.mu.Lock()
	defer l.unlock()
	l.checkDeadlineLocked()
	if l.state != stateHeld {
		return 0, time.Time{}, wrap("renew", l.key, l.err)
	}
	l.sentLocked()
	return l.v.send(), l.sched.clock.Now(), nil
}

// sentLocked counts a renewal about to be sent (see outstanding).
func (l *Lease) sentLocked() {
	if l.outstanding == 255 {
		l.flags |= flagDoubtful // no longer counted: assume the worst
		return
	}
	l.outstanding++
}

// answeredLocked counts the answer to a renewal: err is its error, nil
// when granted. An answer of unknown outcome leaves the request free to
// arrive later (flagDoubtful).
func (l *Lease) answeredLocked(err error) {
	if l.outstanding > 0 {
		l.outstanding--
	}
	if unknownOutcome(err) {
		l.flags |= flagDoubtful
	}
}

// renewEnd applies the store's answer to a renewal sent at sent: the
// deadline moves, or the lease ends lost.
func (l *Lease) renewEnd(ctx context.Context, sent time.Time, g backend.Grant, err error) error {
	l.mu.Lock()
	defer l.unlock()
	l.answeredLocked(err)
	l.checkDeadlineLocked()
	if l.state != stateHeld {
		if err == nil && l.state == stateLost {
			// The store extended a lock this client already gave up:
			// free it rather than block the key for another TTL.
			l.c.cleanup(ctx, l.key, l.token, l.v.ttl, nil)
		}
		return wrap("renew", l.key, l.err)
	}
	if err != nil {
		if errors.Is(err, ErrNotHeld) {
			l.endLocked(stateLost, fmt.Errorf("%w: the store no longer holds it for this owner: %w", ErrLost, err))
			return wrap("renew", l.key, l.err)
		}
		l.wd.lastErr = err
		return wrap("renew", l.key, err)
	}
	l.wd.lastErr = nil
	l.extendLocked(sent, g.TTL)
	return nil
}

// extendLocked moves the deadline and the next automatic renewal after a
// successful request sent at sent, granted for granted (0: as asked; a
// shorter TTL shortens the lease's, see validity.confirm).
func (l *Lease) extendLocked(sent time.Time, granted time.Duration) {
	l.v.confirm(sent, granted)
	l.planRenewalLocked(sent)
}

// planRenewalLocked sets the next automatic renewal a third of the TTL
// after sent, the send time of the request that set the deadline: of the
// TTL the deadline counts (validity.bound), which an Extend whose longer
// TTL did not count yet leaves below the TTL the renewals ask for.
func (l *Lease) planRenewalLocked(sent time.Time) {
	l.wd.renewAt = sent.Add(l.v.bound() / 3)
}

// armLocked schedules the next tick: the automatic renewal or the deadline,
// whichever comes first.
func (l *Lease) armLocked() {
	next := l.v.deadline
	if l.mayRenewLocked() && l.wd.renewAt.Before(next) {
		next = l.wd.renewAt
	}
	l.sched.schedule(l, next)
}

// mayRenewLocked reports whether the watchdog may start a renewal now (when
// renewAt has come): otherwise only the deadline is scheduled.
func (l *Lease) mayRenewLocked() bool {
	return l.autoRenew && !l.wd.renewing && !l.wd.capped && !l.c.closed.Load() && !l.handingOver()
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
	now := l.sched.clock.Now()
	if !l.mayRenewLocked() || now.Before(l.wd.renewAt) {
		l.armLocked() // woke early, or nothing to do before the deadline
		return false
	}
	if l.maxHold > 0 && now.Add(l.v.ttl).After(l.acquired.Add(l.maxHold)) {
		l.wd.capped = true
		l.armLocked()
		return false
	}
	l.wd.renewing = true
	l.armLocked() // guard the deadline while the renewal runs
	return true
}

// watchdogRenew runs the automatic renewal that tick marked as running.
// Its caller has counted it as background work of the Client (track); it
// sends nothing once the Client is closing, and Close cancels it in flight.
func (l *Lease) watchdogRenew() {
	l.mu.Lock()
	if l.state != stateHeld || l.c.closed.Load() {
		l.wd.renewing = false
		l.unlock()
		return
	}
	ctx, cancel := context.WithCancel(l.c.renewCtx)
	if clock.IsReal(l.sched.clock) {
		// Past the deadline the renewal is useless: let the backend give
		// up then too.
		ctx, cancel = context.WithDeadline(l.c.renewCtx, l.v.deadline)
	}
	l.wd.cancel = cancel
	l.unlock()

	err := l.renew(ctx, true)
	cancel()
	l.watchdogEnd(err)
}

// watchdogEnd ends an automatic renewal that returned err: the next one is
// planned, soon when this one failed.
func (l *Lease) watchdogEnd(err error) {
	l.mu.Lock()
	defer l.unlock()
	l.wd.renewing = false
	l.wd.cancel = nil
	if l.state != stateHeld {
		return
	}
	if err != nil {
		// Retry soon, while the lease is still valid.
		now := l.sched.clock.Now()
		wait := min(l.v.ttl/3, l.v.remaining(now)/3)
		l.wd.renewAt = now.Add(max(wait, time.Millisecond))
	}
	l.armLocked()
}
