package lock

import (
	"time"
)

// validity is the one owner of a lease's deadline: every change of it
// passes through the three methods below, and nothing else writes it.
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
// which is what deadline returns, minus drift. A request with a shorter
// TTL than any before lowers the bound the moment it is sent (sending),
// before its reply, because it may already have arrived. A lock handed
// over ahead of the store (see Lease.transferToNext) is also bounded by the
// previous holder's deadline until the transfer is confirmed: until then
// the store holds the lock for the previous token, and the transfer, once
// it lands, holds it for this token from its arrival.
type validity struct {
	drift     time.Duration
	minTTL    time.Duration // shortest TTL of any request sent for the token; 0: none yet
	confirmed time.Time     // send time of the latest confirmed request; zero: none yet
	inherited time.Time     // the previous holder's deadline while a handover is unconfirmed
	deadline  time.Time     // derived from the fields above by update
}

// sending records a request, about to be sent, that sets the store's
// expiry for the token to its arrival plus ttl.
func (v *validity) sending(ttl time.Duration) {
	if v.minTTL == 0 || ttl < v.minTTL {
		v.minTTL = ttl
		v.update()
	}
}

// confirm records that a request sent at sent, for ttl, was granted; a
// store that reports a shorter TTL than was asked for (granted > 0) is
// trusted with the shorter one.
func (v *validity) confirm(sent time.Time, granted time.Duration) {
	if granted > 0 {
		v.sending(granted)
	}
	if sent.After(v.confirmed) {
		v.confirmed = sent
	}
	v.inherited = time.Time{} // the store now holds the lock for this token
	v.update()
}

// inherit bounds a lease handed over ahead of the store by the previous
// holder's deadline, until a request of its own is confirmed. start is a
// time before the transfer is sent: the transfer lands after it.
func (v *validity) inherit(prev, start time.Time, ttl time.Duration) {
	v.sending(ttl)
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
	d := v.confirmed.Add(v.minTTL - v.drift)
	if !v.inherited.IsZero() && v.inherited.Before(d) {
		d = v.inherited
	}
	v.deadline = d
}
