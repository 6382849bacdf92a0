package lock

import (
	"context"
	"errors"
	"time"
)

// cleanup releases key for token in the background after an acquire whose
// outcome is unknown; it gives up after the shorter of ttl (the lock has
// expired by then anyway) and cleanupLimit (a store that does not answer
// that long will not answer this either; the lock then expires on its own).
// Close waits for it.
//
// Given a turn t (non-nil), the cleanup holds this client's turn for the
// key, and passes it when the release has ended; at once if the client is
// closing and the cleanup does not run. Why: the next goroutine of this
// client could not get the lock before the release anyway if the attempt
// was granted, and an Acquire cancelled again and again (short deadlines on
// a slow store) would otherwise start a new attempt per cancellation while
// the earlier ones' requests and releases are still out, piling up work on
// a store that is already too slow to answer, until releases time out and
// locks are left behind for a whole TTL. Holding the turn keeps one attempt
// or one cleanup per key and client on the wire. It delays only this
// client's own goroutines, by at most the cleanup's bound, and decides
// nothing about who holds the lock, so it keeps every promise.
func (c *Client) cleanup(ctx context.Context, key, token string, ttl time.Duration, t *turn) {
	started := c.background(func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(ttl, cleanupLimit))
		defer cancel()
		c.releaseUntilKnown(rctx, key, token)
		t.pass()
	})
	if !started {
		t.pass()
	}
}

// cleanupLimit bounds a cleanup release, and so how long Close waits for one.
const cleanupLimit = 3 * time.Second

// cleanupResends bounds how many times a cleanup release is sent again.
const cleanupResends = 2

// unknownOutcome reports whether err leaves a request's outcome unknown: it
// is neither success nor the store's answer (ErrNotHeld, ErrInvalid), and
// the request was not refused by a closed backend.
func unknownOutcome(err error) bool {
	return err != nil && !errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrClosed)
}

// releaseUntilKnown sends a cleanup release, and sends it again, after a
// short pause and at most cleanupResends times, while its outcome is unknown:
// an error that is neither the store's answer (nil, ErrNotHeld, ErrInvalid)
// nor the end of ctx, such as a connection broken by the fault that made the
// acquire's or handover's outcome unknown in the first place. Sent once,
// such a release left the key held for a whole TTL.
//
// Why sending it again keeps every promise: a token is for one attempt, so
// its release can free only the lock that attempt may have taken, never a
// later owner's; and a release that reaches the store twice, or after the
// token lost the key, changes nothing on the lock (the backend contract:
// it answers nil or ErrNotHeld). The bound keeps a store that is down from
// being asked again and again. The conformance case ReleaseSentAgain holds
// a copy back behind a partition until another client holds the key, on
// every backend's real server, and checks that the copy leaves that lock
// alone.
func (c *Client) releaseUntilKnown(ctx context.Context, key, token string) {
	pause := 50 * time.Millisecond
	var err error
	if c.observing() {
		start := c.cfg.clock.Now()
		defer func() {
			if !unknownOutcome(err) {
				err = nil // settled: released, or nothing was held
			}
			c.observe(ctx, Event{Kind: EventCleanup, Key: key, Start: start, Err: err})
		}()
	}
	for sent := 0; ; sent++ {
		err = c.b.Release(ctx, key, token)
		if !unknownOutcome(err) || sent == cleanupResends {
			return
		}
		if c.sleep(ctx, &c.cfg, pause, nil) != nil {
			return
		}
		pause *= 4
	}
}
