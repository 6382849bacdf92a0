package lock

import (
	"context"
	"time"
)

// Observer receives what a Client and its leases do, for metrics, traces
// and logs (WithObserver). Package lock calls Observe synchronously, on the
// goroutine that did the work and never with a lock of its own held, so an
// observer must be quick and safe for concurrent use, and must not call
// back into the Client. A Client without an observer pays nothing for
// this.
//
// Observer is one method over an Event, so that events can gain fields and
// kinds without breaking implementations: an observer should ignore kinds
// it does not know.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventAcquireStart: an acquisition that waits for the key began
	// (Acquire, Do). Every one ends with an EventAcquire (Wait set): the
	// two bracket the callers waiting for a key. One that does not wait
	// (TryAcquire, TryDo) reports its EventAcquire only.
	EventAcquireStart EventKind = iota + 1
	// EventAcquire: an acquisition ended, with a lease (Err nil) or not;
	// Start is when it began, so the wait included.
	EventAcquire
	// EventRenew: a renewal ended, automatic (Auto) or called; Err is
	// nil when the store extended the lease.
	EventRenew
	// EventRelease: a release ended; Held is how long the lease was
	// held. Err is nil when the lock was held until the release (a lease
	// lost before it reports EventLost, and its release Err wraps
	// ErrLost).
	EventRelease
	// EventLost: a lease ended lost, Err saying why (its deadline passed
	// without a renewal, the store no longer held it, its maximum hold
	// time); Held is how long it was valid.
	EventLost
	// EventHandover: a release handed the lock to a goroutine of the same
	// Client waiting for the key, ahead of the store.
	EventHandover
	// EventCleanup: a release sent in the background after an acquire, a
	// release or a handover whose outcome was unknown, so that the key is
	// not left blocked; Err is the last answer.
	EventCleanup
)

var eventNames = [...]string{
	EventAcquireStart: "acquire-start",
	EventAcquire:      "acquire",
	EventRenew:        "renew",
	EventRelease:      "release",
	EventLost:         "lost",
	EventHandover:     "handover",
	EventCleanup:      "cleanup",
}

// String returns the kind's name, such as "acquire" or "lost".
func (k EventKind) String() string {
	if int(k) < len(eventNames) && eventNames[k] != "" {
		return eventNames[k]
	}
	return "unknown"
}

// Event is one thing a Client did. Fields that do not apply to a kind are
// zero.
type Event struct {
	Kind EventKind
	// Key is the lock's key. It may carry data of the application (a
	// user or an order id): an observer that exports it decides whether
	// to hash it.
	Key string
	// Start is when the operation began, on the Client's clock (for
	// EventLost, when the lease ended). Observe is called as the
	// operation ends, so time.Since(e.Start) is how long it took: events
	// carry only the times the Client reads anyway, and an observer that
	// wants durations reads the clock itself.
	Start time.Time
	// Held is how long the lease was held, for EventRelease (until the
	// release began) and EventLost.
	Held time.Duration
	// Fence is the lease's fence (with its epoch), once it has one.
	Fence uint64
	// Wait is true for an acquisition that waits for the key (Acquire,
	// Do); Auto is true for an automatic renewal.
	Wait, Auto bool
	// Err is the outcome: nil for success, else an error for errors.Is
	// (ErrLocked, ErrLost, ErrNotHeld, a context's error, the store's).
	Err error
}

// WithObserver makes a Client report its events to o (see Observer); a
// Client option only. nil, the default, reports nothing.
func WithObserver(o Observer) Option {
	return func(c *config) { c.observer, c.observerID = o, c.observerID+1 }
}

// observe reports e to the client's observer (WithObserver, WithLogger),
// if it has one. ctx is never nil.
func (c *Client) observe(ctx context.Context, e Event) {
	if o := c.obs; o != nil {
		o.Observe(ctx, e)
	}
}

// observing reports whether the client has an observer: callers skip the
// work of building events without one.
func (c *Client) observing() bool { return c.obs != nil }

// observerOf returns the observer of a client configured with cfg: its
// WithObserver, its WithLogger's, both, or nil.
func observerOf(cfg *config) Observer {
	o := cfg.observer
	if cfg.logger != nil {
		lo := logObserver{cfg.logger}
		if o == nil {
			return lo
		}
		return both{o, lo}
	}
	return o
}

// both reports each event to two observers.
type both [2]Observer

func (b both) Observe(ctx context.Context, e Event) {
	b[0].Observe(ctx, e)
	b[1].Observe(ctx, e)
}

// observeEnd reports the end of an operation of l of kind that began at
// start on the lease's clock, with err as its outcome. A release or a
// loss also reports how long the lease was held, until start.
func (l *Lease) observeEnd(ctx context.Context, kind EventKind, start time.Time, auto bool, err error) {
	e := Event{Kind: kind, Key: l.key, Start: start, Fence: l.Fence(), Auto: auto, Err: err}
	if kind == EventRelease || kind == EventLost {
		e.Held = start.Sub(l.acquired)
	}
	l.c.observe(ctx, e)
}
