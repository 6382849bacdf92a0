package lock

import (
	"time"

	"github.com/distlock/lock/backend"
)

// validity is the one owner of a lease's deadline and of its TTL: every
// change of them passes through the methods below, and nothing else writes
// them. It is guarded by the lease's mutex. The lease asks it whether it has
// expired (expired) and how long it has left (remaining); it never works
// that out from the deadline itself.
//
// The invariant, kept here and nowhere else: the deadline is never later
// than the earliest moment at which the store may free the lock held for
// this lease's token, minus the drift allowance, as measured on this
// client's clock from requests this client sent.
//
// Why the methods keep it. Every request that sets the store's expiry for
// the token (an acquire, a renew, a transfer to the token) sets it to its
// own arrival time plus its TTL. Whatever order requests arrive in, and
// even if a request whose reply was lost arrives late, the expiry in force
// is set by the request that arrived last; it arrived after every request
// that was confirmed had arrived, so after every such request was sent.
// Hence the expiry is at least
//
//	(latest send of a confirmed request) + (shortest TTL of any request sent)
//
// which is what the deadline is, minus drift. A request with a shorter
// TTL than any before lowers the bound the moment it is sent (sending),
// before its reply, because it may already have arrived. A lock handed
// over ahead of the store (see Lease.transferToNext) is also bounded by the
// previous holder's deadline until the transfer is confirmed: until then
// the store holds the lock for the previous token, and the transfer, once
// it lands, holds it for this token from its arrival.
//
// The TTL is kept twice, under two names, on purpose: ttl is what the
// lease asks the store for (its renewals, a handover's transfer, and
// Lease.TTL), and shortestSent is the bound above, the shortest TTL of any
// request sent for the token, whoever sent it (the acquire that asked for
// cfg's TTL before the lease existed, say). They are equal once a request
// has been sent, because the lease only ever asks for ttl, which starts at
// the TTL the acquisition asked for and shrinks when the store grants less;
// the deadline still counts from shortestSent alone, so that the bound
// does not rest on what the lease's code asks for. Lease.Extend changes
// ttl both ways: a shorter TTL lowers shortestSent as it is sent, and a
// longer one raises it only once confirmed, and only when no request sent
// before it can still arrive (raise says why that keeps the invariant).
type validity struct {
	ttl          time.Duration // the TTL the lease asks for; shortened when the store grants less, set by Extend
	drift        time.Duration // the drift allowance, fixed when the lease is made (an Extend may raise it)
	shortestSent time.Duration // the bound: shortest TTL of any request that may still set the expiry; 0: none yet
	confirmed    time.Time     // send time of the latest confirmed request; zero: none yet
	inherited    time.Time     // the previous holder's deadline while a handover is unconfirmed
	deadline     time.Time     // derived from the fields above by update; read it, never write it
}

// newValidity returns the validity of a lease of cfg's TTL, or of granted
// if the store said it keeps the lock a shorter time (0: as asked), before
// any request for its token counts: it has no deadline yet (it has
// expired).
func newValidity(cfg *config, granted time.Duration) validity {
	ttl := cfg.ttl
	if granted > 0 && granted < ttl {
		ttl = granted
	}
	return validity{ttl: ttl, drift: cfg.driftFor(ttl)}
}

// grantValidity returns the validity of a lock that the store granted, as
// g says, to a request sent at sent that asked for cfg's TTL: an acquire,
// a handover to a queued waiter, or a transfer to a waiting goroutine.
func grantValidity(cfg *config, sent time.Time, g backend.Grant) validity {
	v := newValidity(cfg, g.TTL)
	v.sending(cfg.ttl)
	v.confirm(sent, g.TTL)
	return v
}

// handedValidity returns the validity of a lock handed over ahead of the
// store, whose transfer will ask for cfg's TTL (see inherit).
func handedValidity(cfg *config, prev, start time.Time) validity {
	v := newValidity(cfg, 0)
	v.inherit(prev, start)
	return v
}

// bound is the TTL the deadline counts: the lesser of the lease's TTL and
// the bound shortestSent.
func (v *validity) bound() time.Duration {
	if v.shortestSent > 0 && v.shortestSent < v.ttl {
		return v.shortestSent
	}
	return v.ttl
}

// expired reports whether the deadline has come at now.
func (v *validity) expired(now time.Time) bool {
	return !v.deadline.After(now)
}

// remaining returns the time from now to the deadline; <= 0 once expired.
func (v *validity) remaining(now time.Time) time.Duration {
	return v.deadline.Sub(now)
}

// sending records a request, about to be sent, that sets the store's
// expiry for the token to its arrival plus ttl.
func (v *validity) sending(ttl time.Duration) {
	if v.shortestSent == 0 || ttl < v.shortestSent {
		v.shortestSent = ttl
		v.update()
	}
}

// send records a request of the lease, about to be sent, and returns the
// TTL it asks for: the lease's.
func (v *validity) send() time.Duration {
	v.sending(v.ttl)
	return v.ttl
}

// confirm records that a request sent at sent was granted; a store that
// reports a shorter TTL than was asked for (granted > 0) is trusted with
// the shorter one, which the lease asks for from then on.
func (v *validity) confirm(sent time.Time, granted time.Duration) {
	if granted > 0 {
		if granted < v.ttl {
			v.ttl = granted
		}
		v.sending(granted)
	}
	if sent.After(v.confirmed) {
		v.confirmed = sent
	}
	v.inherited = time.Time{} // the store now holds the lock for this token
	v.update()
}

// extending records a request of Lease.Extend, about to be sent, that
// asks for ttl, which the lease asks for from then on, with drift the
// drift allowance of ttl if it is larger. A shorter ttl lowers the bound
// at once, as any request does (sending); a longer one raises it only
// once confirmed (raise).
func (v *validity) extending(ttl, drift time.Duration) {
	v.ttl = ttl
	v.drift = max(v.drift, drift)
	v.sending(ttl)
}

// raise lifts the bound to ttl, the longer TTL of an Extend sent at sent
// that was confirmed, and reports whether the deadline moved. Why this
// keeps the invariant: sole says that no request sent for the token
// before the Extend could still arrive (all were answered, none with an
// unknown outcome). So every request that can still set the store's
// expiry was sent at or after sent and asked for ttl or for what the lease
// asked later, v.ttl, which only a store's shorter grant or a later
// Extend changes: the expiry is at least (latest confirmed send) + the
// lesser of the two. Without sole the bound stays: an earlier request with
// the shorter TTL may still arrive and set the expiry with it.
func (v *validity) raise(sent time.Time, ttl time.Duration, sole bool) bool {
	if !sole || v.confirmed.Before(sent) {
		return false
	}
	b := min(ttl, v.ttl)
	if b <= v.shortestSent {
		return false
	}
	v.shortestSent = b
	v.update()
	return true
}

// inherit bounds a lease handed over ahead of the store by the previous
// holder's deadline, until a request of its own is confirmed. start is a
// time before the transfer, which asks for the lease's TTL, is sent: the
// transfer lands after it.
func (v *validity) inherit(prev, start time.Time) {
	v.sending(v.ttl)
	v.inherited = prev
	v.confirmed = start
	v.update()
}

// update derives the deadline. It only ever moves it later through confirm;
// sending and inherit can move it earlier.
func (v *validity) update() {
	if v.confirmed.IsZero() {
		return
	}
	d := v.confirmed.Add(v.shortestSent - v.drift)
	if !v.inherited.IsZero() && v.inherited.Before(d) {
		d = v.inherited
	}
	v.deadline = d
}
