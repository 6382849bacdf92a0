package lock

import (
	"context"
	"time"
)

// Extend renews the lease with a new TTL, ttl, which its later renewals
// (automatic ones included) ask for too: as Renew does, but for ttl from
// now instead of the lease's TTL. ttl is checked as every TTL is (above
// the drift allowance, within the backend's minimum and maximum:
// ErrInvalidTTL, and nothing is sent). Like Renew, it returns an error
// wrapping ErrLost, sending nothing, for a lease already lost, and
// ErrReleased after Release; when the store says the lock is no longer
// this owner's, the lease becomes lost.
//
// A shorter TTL counts at once, from the send of the latest renewal the
// store confirmed (the store may apply it as soon as the request
// arrives): the deadline moves earlier as the request leaves, and a lease
// last confirmed more than the new TTL ago ends lost. Renew first to
// shorten the TTL of a lease without that risk. On a
// backend whose locks keep the TTL they were acquired with
// (Capabilities.FixedTTL: etcd, Consul, Redis with sessions) Extend
// refuses another TTL (ErrInvalidTTL) and sends nothing. A store that
// refuses it all the same (an error wrapping ErrInvalid) leaves the lease
// renewing with its TTL of before. A longer
// one moves the deadline only once the store confirmed it, and only when
// no earlier request for the lease can still reach the store (its
// renewals were all answered, none with an unknown outcome, and the lock
// was not handed over ahead of the store): such a request would set the
// store's expiry with the shorter TTL. Otherwise the store keeps the lock
// longer but the deadline keeps counting the shorter TTL, and Extend
// returns nil all the same. A store that grants less than ttl leaves the
// lease renewed for what it granted, and Extend returns an error wrapping
// ErrInvalidTTL that says so.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ctx == nil {
		return invalid(ErrInvalid, "extend %q: nil context", l.key)
	}
	cfg := l.c.cfg
	cfg.ttl = ttl
	if ttl <= 0 || ttl > MaxTTL {
		return invalid(ErrInvalidTTL, "extend %q: TTL %v; want more than 0 and at most %v", l.key, ttl, MaxTTL)
	}
	if err := l.c.checkTTL(&cfg); err != nil {
		return wrap("extend", l.key, err)
	}
	if l.c.caps.FixedTTL && ttl != l.TTL() {
		return invalid(ErrInvalidTTL, "extend %q to %v: this backend keeps a lock's TTL (%v here) for its whole life (Capabilities.FixedTTL); Renew it, or take a new lease with the TTL", l.key, ttl, l.TTL())
	}
	if err := l.awaitHandover(ctx); err != nil {
		return wrap("extend", l.key, err)
	}
	l.mu.Lock()
	l.checkDeadlineLocked()
	if l.state != stateHeld {
		err := l.err
		l.unlock()
		return wrap("extend", l.key, err)
	}
	// sole: nothing sent for the token before this request can arrive
	// after it (see validity.raise).
	sole := l.outstanding == 0 && l.flags&flagDoubtful == 0
	l.sentLocked()
	prev := l.v.ttl
	l.v.extending(ttl, cfg.driftFor(ttl)) // a shorter TTL counts now
	l.armLocked()
	sent := l.sched.clock.Now()
	l.unlock()

	g, err := l.c.b.Renew(ctx, l.key, l.token, ttl)
	err = l.renewEnd(ctx, sent, g, err) // as any renewal's answer
	if l.c.observing() {
		l.observeEnd(ctx, EventRenew, sent, false, err)
	}
	if err != nil {
		// The lease's renewals ask for its TTL of before: a store that
		// refused ttl (a backend whose leases keep the TTL they were
		// acquired with) would refuse them all. Asking for less than the
		// store may now hold is always safe.
		l.mu.Lock()
		if !unknownOutcome(err) && l.v.ttl == ttl {
			l.v.ttl = prev
		}
		l.unlock()
		return err
	}
	l.mu.Lock()
	defer l.unlock()
	if g.TTL > 0 && g.TTL < ttl {
		return invalid(ErrInvalidTTL, "extend %q: the store granted %v of the %v asked for: its lease or session keeps a TTL of its own; the lease was renewed for %v", l.key, g.TTL, ttl, g.TTL)
	}
	if l.state == stateHeld && l.v.raise(sent, ttl, sole) {
		l.armLocked()
	}
	return nil
}
