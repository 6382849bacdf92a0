// Package waitq is the waiters' queue of a store that hands a released lock
// to its oldest waiter (backend.Queuer), written once over a few store
// primitives. A backend supplies the primitives (Store): its scripts or
// transactions, and the watch or notification plumbing that tells a place
// what the store did. The queue supplies the rest: the place's state, the
// wake-ups, the record's refresh, the handover's deadline rule, the one
// retry when the store lost what carries the record, and the bounded leave.
//
// # What a backend's primitives must guarantee
//
// A waiter's place is a record in the store: it names the token of the
// waiter's latest refused attempt, and its life is tied to a carrier the
// waiter keeps alive (the record itself with an expiry, a lease, a
// session): the store deletes it at the latest a TTL after the latest
// refresh of the carrier it received.
//
//   - Attempt is atomic in the store: it takes the key for the token when
//     the key is free and no live record comes before the waiter's (and
//     deletes the waiter's record in the same step), or else writes the
//     waiter's record with the token, at the back of the queue unless the
//     record still lives. Every acquire of the key that does not queue
//     takes a free key only when no live record is queued.
//   - A release hands the lock to the oldest live record in the step that
//     checks the releasing token: the lock then holds the record's token,
//     with an expiry no earlier than the record's carrier's (it lives at
//     least the TTL after the carrier's latest refresh the store received),
//     and a new fence. A record whose carrier is gone, or whose token was
//     released, is never handed the lock.
//   - Attempt with Attempt.Prev set takes over a lock the store handed to
//     the waiter's previous token, for the new token, as a new grant.
//   - Leave removes the record, and with handed, frees a lock handed to the
//     waiter, including one handed after Leave was sent: nothing of the
//     waiter is left once it is done.
//
// # Why the queue keeps the promise
//
//   - Exclusion is the store's: a handover replaces the releasing token in
//     the step that checks it, and every other acquire finds the key held.
//     The queue adds no store request of its own that could take a key.
//   - The deadline of a handover. The waiter did not send the handover, so
//     it counts its deadline from the send time of the latest refresh of the
//     record's carrier that the store confirmed (Handover.Since): the store
//     keeps the lock at least the TTL after it received that request, which
//     came after it was sent. Refreshes of unknown outcome only make the
//     store's expiry later, so they are never counted, and a place that
//     lost its carrier forgets that time: the next carrier counts from its
//     own. A handover that comes before any confirmed refresh is kept aside
//     until the attempt that wrote the record returns: that attempt's
//     confirmed write is such a refresh. That holds only while the handed
//     lock lives with the carrier (a lease, a session) after the handover.
//     A store whose handover gives the lock
//     the record's remaining expiry once, and drops the record (Redis: the
//     record is its own carrier), must confirm every handover it learns of
//     instead (Confirmed): a renewal of the handed lock for its
//     token, whose send time is the deadline's start. A refresh the place
//     counts may have refreshed a later record: one written again, after the
//     handover, by an attempt whose reply was lost (the place still knows the
//     earlier token as the record's), or by a duplicate of the attempt that
//     queued the token. Counted from such a refresh, a late message's lock
//     would be valid past its expiry, while another holder has the key.
//   - One TTL per place. The record's carrier lives the TTL of the request
//     that last refreshed it, so a handover is counted with the place's one
//     TTL; an attempt with another TTL is refused (backend.ErrInvalid)
//     rather than counted with the wrong one.
//   - Vanished records. A record that vanished without a handover (its
//     carrier expired: the process stalled past its TTL) is never handed
//     the lock (the store's guarantee); the place is woken and its next
//     attempt queues again, at the back.
//   - Leaving. A waiter that gives up runs Leave, which takes its record
//     and any lock handed to it. Close waits for it at most LeaveWait, so
//     that a caller that gave up returns promptly even from a store that
//     does not answer; the rest runs in the background for at most
//     LeaveTimeout. A lock handed to the waiter in that window blocks the
//     key until Leave lands, or until the carrier expires: at most a TTL
//     after its last refresh, since the place stopped refreshing it. A
//     waiter whose process dies leaves the same bound.
//   - Liveness. The record is refreshed every third of the TTL while the
//     place waits, so it lives while its process does; a place first in
//     the queue is woken when the holder's lock expires (RetryIn), since an
//     expiry hands nothing over.
package waitq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/distlock/lock/backend"
)

// LeaveWait bounds how long Close waits for a Leave: a waiter that gave
// up returns after at most this long, and its Leave goes on in the
// background.
const LeaveWait = 500 * time.Millisecond

// LeaveTimeout bounds a Leave in all: a store that does not answer in
// that time gets nothing more, and the record's carrier expires on its
// own.
const LeaveTimeout = 3 * time.Second

// ErrGone is what a Store returns from Attempt when the carrier of the
// waiter's record (its lease, its session) is gone and the attempt changed
// nothing. The queue forgets the place's record and tries once more with
// Attempt.Fresh set.
var ErrGone = errors.New("waitq: the store no longer has the waiter's record carrier")

// Store is the store side of one waiter's place, written by a backend.
// The queue calls Attempt, Refresh and Leave from one goroutine at a time
// each, never with its own lock held, so a Store may call the Place's
// hooks from anywhere.
type Store interface {
	// Attempt is one take-or-enqueue, atomic in the store (see the
	// package doc). It returns a grant (Fence > 0) when it took the key;
	// otherwise, having queued the place, an error for which
	// errors.Is(err, backend.ErrLocked) holds, with the Result. Any other
	// error is the backend's, with Result.Queued saying whether the
	// record may exist; ErrGone when its carrier was gone and nothing
	// changed.
	Attempt(ctx context.Context, a Attempt) (Result, error)
	// Refresh keeps the record's carrier alive for ttl from now. It
	// returns ErrGone when the carrier is gone; any other error means the
	// outcome is unknown.
	Refresh(ctx context.Context, ttl time.Duration) (Refreshed, error)
	// Leave removes what the waiter has in the store after it gave up:
	// its record, and, when handed, a lock the store handed to it (see
	// the package doc), and frees the place's carrier. It is called once
	// for every place that closes without the lock, even one that never
	// queued (a Store that holds nothing for it returns at once), from a
	// goroutine of the queue's, after Stop; ctx bounds it.
	Leave(ctx context.Context, l Leaving) error
	// Stop ends the place's watches and timers in the backend; it is
	// called once, as the place closes, before any Leave. took reports
	// that the caller took the lock: the handover when handed is not nil,
	// else an Attempt's grant.
	Stop(took bool, handed *backend.Handover)
}

// Attempt is one attempt of a waiter (see Store.Attempt).
type Attempt struct {
	Token string
	TTL   time.Duration
	// Prev is the token of the place's latest queued attempt, "" when
	// none: a lock the store handed to it and that the caller did not
	// take is taken over for Token.
	Prev string
	// Queued reports that the place's record may exist.
	Queued bool
	// Handed is a handover reported to the place that the caller did not
	// take, or nil.
	Handed *backend.Handover
	// Refreshed is the send time of the latest confirmed refresh of the
	// place's carrier, zero when none.
	Refreshed time.Time
	// Fresh is set on the try after one that returned ErrGone: the
	// carrier must be a new one, not one kept from before. (A store whose
	// record is its own carrier never returns ErrGone, and can ignore
	// Fresh.)
	Fresh bool
}

// Result is what an Attempt did besides its grant or error.
type Result struct {
	Grant backend.Grant
	// Queued: with a refusal (backend.ErrLocked), the attempt put or
	// kept the place's record, with the attempt's token; false when it
	// was refused without queueing, which leaves the place as it was.
	// With any other error, the record may exist.
	Queued bool
	// Refreshed is the send time of a request of this attempt, confirmed
	// by the store, after which the record's carrier lives at least the
	// TTL; zero when none.
	Refreshed time.Time
	// RetryIn, when positive, wakes the waiter after that long: the
	// holder's remaining time when the place is first in the queue, or a
	// store's pause (a lock-delay) after which the key may be free. The
	// queue wakes it at RetryIn exactly: add the store's expiry
	// resolution.
	RetryIn time.Duration
}

// Refreshed is what a Refresh found.
type Refreshed struct {
	// Gone reports that the record no longer exists: the place is lost,
	// and its next attempt queues again.
	Gone bool
	// RetryIn as in Result.
	RetryIn time.Duration
}

// Leaving is what a place that gives up may have left in the store.
type Leaving struct {
	// Token is the token of the place's record ("" when it never queued).
	Token string
	// Queued reports that the record may exist.
	Queued bool
	// Handed is the handover reported to the place, or nil; the store may
	// also have handed the lock without the place hearing of it yet.
	Handed *backend.Handover
}

// Group is a backend's set of places: Close waits for their background
// leaves.
type Group struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// NewGroup returns an empty Group.
func NewGroup() *Group { return &Group{} }

// Close waits for the leaves still running, each bounded by LeaveTimeout,
// and for the work started by Go:
// a backend that closes leaves nothing of a waiter that gave up behind.
// A place that leaves after Close began runs its Leave before its own
// Close returns, bounded by LeaveWait. Call it before closing the store's
// client.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.wg.Wait()
}

// Go runs f in a goroutine that Close waits for, and reports whether it
// did: not once the group is closing. A backend runs its own background
// work for its places this way (a confirmation of a handover), bounded as
// a leave is.
func (g *Group) Go(f func()) bool {
	if !g.add() {
		return false
	}
	go func() {
		defer g.wg.Done()
		f()
	}()
	return true
}

// add counts a leave about to start in the background; false once the
// group is closing.
func (g *Group) add() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	return true
}

// New returns a place in a key's queue over s. It sends nothing; the
// place's Acquire does. The backend's side keeps the place to call its
// hooks.
func (g *Group) New(s Store) *Place {
	return &Place{g: g, s: s, ch: make(chan struct{}, 1)}
}

// Place is one waiter's place in a key's queue; it implements
// backend.Queue.
type Place struct {
	g  *Group
	s  Store
	ch chan struct{}

	mu        sync.Mutex
	closed    bool
	ttl       time.Duration
	cur       string    // the token in the record
	pending   string    // the token of an attempt on its way
	unknown   string    // the first attempt's token, when its outcome was unknown (see apply): for Leave only
	queued    bool      // the record may exist
	refreshed time.Time // send time of the carrier's latest confirmed refresh
	handed    *backend.Handover
	early     *backend.Handover // handed before any confirmed refresh
	refresh   *time.Timer
	retry     *time.Timer
}

var _ backend.Queue = (*Place)(nil)

// C implements backend.Watch.
func (p *Place) C() <-chan struct{} { return p.ch }

// Wake wakes the waiter: the key may be free with the place first, or the
// backend lost track of it (a watch broke).
func (p *Place) Wake() {
	select {
	case p.ch <- struct{}{}:
	default:
	}
}

// TTL returns the place's TTL, 0 before its first attempt.
func (p *Place) TTL() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ttl
}

// Refreshed returns the send time of the latest confirmed refresh of the
// place's carrier, zero when none.
func (p *Place) Refreshed() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refreshed
}

// Handed implements backend.Queue.
func (p *Place) Handed() (backend.Handover, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.handed == nil || p.closed {
		return backend.Handover{}, false
	}
	return *p.handed, true
}

// Handoff is the backend's report that the store handed the lock to the
// place's token with grant g. It reports whether the place took note: not
// when the place closed or was handed a lock already, nor for a token
// other than the record's (the latest attempt that queued the place) or
// the attempt's on its way. Since is the carrier's latest confirmed
// refresh (see the package doc).
//
// Why only those two tokens: the handed lock's expiry is the record's, so
// the carrier's latest refresh bounds it only while that record is the
// place's current one. A report of a handover to an earlier token, late
// (a message that waited in a connection), may concern a record that
// expired before the place queued again and refreshed its new one: counted
// from the new refresh, its deadline would pass the store's expiry. Such a
// lock expires with the record it came from, unrefreshed.
func (p *Place) Handoff(token string, g backend.Grant) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.expectsLocked(token) {
		return false
	}
	h := &backend.Handover{Token: token, Grant: g}
	if p.refreshed.IsZero() {
		p.early = h // counted once the attempt that wrote the record returns
		return true
	}
	p.handLocked(h)
	return true
}

// Confirmed is Handoff for a handover the backend confirmed in the store
// itself: a request sent at since found the lock held by token and keeps it
// at least g.TTL from its arrival (a renewal of the handed lock). The
// deadline counts from since, whatever the place's refreshes did, so it
// suits a store whose handed lock does not live with the record's carrier
// (see the package doc). The tokens it takes are Handoff's.
func (p *Place) Confirmed(token string, g backend.Grant, since time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.expectsLocked(token) {
		return false
	}
	p.handAtLocked(&backend.Handover{Token: token, Grant: g}, since)
	return true
}

// Expects reports whether the place would take note of a handover to token
// now (see Handoff): a backend asks before it spends a request confirming
// one.
func (p *Place) Expects(token string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.expectsLocked(token)
}

func (p *Place) expectsLocked(token string) bool {
	return !p.closed && p.handed == nil && token != "" && (token == p.cur || token == p.pending)
}

// handLocked records h, handed with the carrier refreshed at p.refreshed.
func (p *Place) handLocked(h *backend.Handover) { p.handAtLocked(h, p.refreshed) }

// handAtLocked records h, whose deadline counts from since.
func (p *Place) handAtLocked(h *backend.Handover, since time.Time) {
	h.Since = since
	p.handed, p.early = h, nil
	p.queued = false // the handover took the record
	p.stopLocked()
	p.Wake()
}

// Vanished is the backend's report that the place's record vanished
// without a handover (its carrier may live on): the next attempt queues
// again, at the back.
func (p *Place) Vanished() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.handed != nil {
		return
	}
	p.queued = false
	p.Wake()
}

// Lost is the backend's report that the place's carrier is gone: its
// record, and a lock handed to it, went with it.
func (p *Place) Lost() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetLocked()
	p.Wake() // the waiter queues again
}

// forgetLocked forgets the place's record and carrier: a lock handed to
// the record's token went with the carrier, so a late report of it is
// refused (see Handoff), and no attempt takes it over.
func (p *Place) forgetLocked() {
	p.cur, p.queued, p.refreshed, p.handed, p.early = "", false, time.Time{}, nil, nil
	p.stopLocked()
}

// Acquire implements backend.Queue.
func (p *Place) Acquire(ctx context.Context, token string, ttl time.Duration) (backend.Grant, error) {
	for try := 0; ; try++ {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return backend.Grant{}, backend.ErrClosed
		}
		if p.ttl != 0 && p.ttl != ttl {
			first := p.ttl
			p.mu.Unlock()
			return backend.Grant{}, fmt.Errorf("%w: a waiter's attempts must use one TTL: its first asked for %v, this one %v", backend.ErrInvalid, first, ttl)
		}
		p.ttl, p.pending = ttl, token
		a := Attempt{Token: token, TTL: ttl, Prev: p.cur, Queued: p.queued, Handed: p.handed, Refreshed: p.refreshed, Fresh: try > 0}
		p.mu.Unlock()
		res, err := p.s.Attempt(ctx, a)
		if errors.Is(err, ErrGone) {
			p.mu.Lock()
			p.pending = ""
			p.forgetLocked() // the caller learns it from this call
			p.mu.Unlock()
			if try == 0 {
				continue
			}
			return backend.Grant{}, fmt.Errorf("the store dropped the waiter's record carrier at once (removed from outside?); nothing was changed: %w", err)
		}
		return p.apply(token, res, err)
	}
}

// apply records what an attempt of token did.
func (p *Place) apply(token string, res Result, err error) (backend.Grant, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending = ""
	if res.Refreshed.After(p.refreshed) {
		p.refreshed = res.Refreshed
	}
	locked := errors.Is(err, backend.ErrLocked)
	switch {
	case err == nil:
		p.queued, p.handed, p.early = false, nil, nil
		p.stopLocked()
		return res.Grant, nil
	case !locked:
		p.queued = res.Queued
		if res.Queued && p.cur == "" {
			// The outcome is unknown: the attempt may have put the
			// record, with its token, and the place had no token of
			// its own before. Leave must know it, or a record put by
			// an attempt whose reply never came stays for its TTL,
			// first in the queue, with no waiter behind it. Only
			// Leave: the token is not the record's (p.cur), whose
			// carrier's refresh p.refreshed confirms. A handover to
			// it, reported late, must still be refused (see
			// Handoff): counted from a later attempt's refresh, its
			// deadline would pass the store's expiry.
			p.unknown = token
		}
		return backend.Grant{}, err
	case !res.Queued:
		// Refused without queueing (a store's pause): the place is as
		// it was.
		p.early = nil
		p.armLocked(res.RetryIn)
		return backend.Grant{}, err
	}
	p.cur = token
	switch {
	case p.handed == nil:
		p.queued = true
	case p.handed.Token != token:
		// Queued anew: a lock handed to an earlier token and not
		// taken is history (this attempt would have taken it over).
		p.handed, p.queued = nil, true
	default:
		// Handed to this attempt's token before its reply came: the
		// handover took the record.
		p.queued = false
	}
	if p.early != nil {
		if p.refreshed.IsZero() {
			p.early = nil // no confirmed refresh to count from
		} else {
			p.handLocked(p.early)
			return backend.Grant{}, err
		}
	}
	p.armLocked(res.RetryIn)
	p.scheduleLocked()
	return backend.Grant{}, err
}

// armLocked wakes the waiter after d, when d is positive, instead of any
// wake-up armed before.
func (p *Place) armLocked(d time.Duration) {
	if d <= 0 {
		return
	}
	if p.retry != nil {
		p.retry.Stop()
	}
	p.retry = time.AfterFunc(d, p.Wake)
}

// scheduleLocked refreshes the record a third of its TTL after the
// carrier's latest confirmed refresh, while the place waits.
func (p *Place) scheduleLocked() { p.scheduleAfterLocked(0) }

// scheduleAfterLocked is scheduleLocked, at least atLeast from now.
func (p *Place) scheduleAfterLocked(atLeast time.Duration) {
	if p.closed || p.refresh != nil || !p.queued || p.handed != nil {
		return
	}
	ttl := p.ttl
	p.refresh = time.AfterFunc(max(ttl/3-time.Since(p.refreshed), atLeast), func() { p.refreshNow(ttl) })
}

// refreshNow is one refresh of the record (see scheduleLocked).
func (p *Place) refreshNow(ttl time.Duration) {
	p.mu.Lock()
	p.refresh = nil
	if p.closed || !p.queued || p.handed != nil {
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), ttl/3)
	defer cancel()
	sent := time.Now()
	r, err := p.s.Refresh(ctx, ttl)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.handed != nil {
		return
	}
	switch {
	case errors.Is(err, ErrGone):
		p.forgetLocked()
		p.Wake() // the waiter queues again
		return
	case err != nil:
		// Unknown: the earlier refresh still bounds the expiry. Try
		// again, but not at once: a store that fails fast would spin.
		p.scheduleAfterLocked(ttl / 10)
		return
	case r.Gone:
		// The record expired: the place is lost; the next attempt
		// queues again, at the back.
		p.queued = false
		p.Wake()
		return
	default:
		if sent.After(p.refreshed) {
			p.refreshed = sent
		}
		p.armLocked(r.RetryIn)
	}
	p.scheduleLocked()
}

// stopLocked stops the place's timers.
func (p *Place) stopLocked() {
	if p.refresh != nil {
		p.refresh.Stop()
		p.refresh = nil
	}
	if p.retry != nil {
		p.retry.Stop()
		p.retry = nil
	}
}

// Close implements backend.Watch: the waiter leaves the queue. took
// reports whether the caller took the lock (an attempt's grant, or what
// Handed reported). A waiter that leaves without it runs the store's
// Leave (see the package doc); Close waits for it at most LeaveWait.
func (p *Place) Close(took bool) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.stopLocked()
	l := Leaving{Token: p.cur, Queued: p.queued, Handed: p.handed}
	if l.Token == "" {
		l.Token = p.unknown // an attempt of unknown outcome may have put the record
	}
	if l.Handed == nil {
		l.Handed = p.early // the store may have handed it the lock
	}
	var handed *backend.Handover
	if took {
		handed = p.handed // what Handed reported, if the caller took that
	}
	p.mu.Unlock()
	p.s.Stop(took, handed)
	if took {
		return nil
	}
	if !p.g.add() {
		// The backend is closing: leave now, within the wait.
		ctx, cancel := context.WithTimeout(context.Background(), LeaveWait)
		defer cancel()
		_ = p.s.Leave(ctx, l)
		return nil
	}
	done := make(chan struct{})
	go func() {
		defer p.g.wg.Done()
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), LeaveTimeout)
		defer cancel()
		_ = p.s.Leave(ctx, l)
	}()
	t := time.NewTimer(LeaveWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	return nil
}
