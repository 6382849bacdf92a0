package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/distlock/lock/clock"
)

// renew is Renew, and the watchdog's renewal: one renew request, whose
// outcome moves the deadline or ends the lease.
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
