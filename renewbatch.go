package lock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
)

// Batched automatic renewals. When several leases of a Client fall due
// together and the backend can renew many locks in one request
// (backend.BatchRenewer), the scheduler sends them as batches of up to
// maxRenewBatch, each on one goroutine and one of the Client's renewal
// slots, instead of a goroutine and a request per lease. A process holding
// hundreds of thousands of leases renews tens of thousands a second: per
// lease, the goroutines alone (parked on the slots) ran to gigabytes.
//
// Why it keeps the promise:
//   - Each lease's renewal is what watchdogRenew would send: the TTL and
//     send time come from the lease (renewStart), before the batch goes
//     out, and the answer is applied to that lease alone (renewEnd): its
//     deadline counts from its own send time, which is before the store
//     received the batch; one lease's ErrNotHeld ends that lease only.
//   - The deadline never waits for the batch: the scheduler checks every
//     due lease's deadline before any renewal starts (tick), and a lease
//     stays scheduled for its deadline while its renewal is in flight, so
//     a batch that hangs or comes back late delays no lost signal. An
//     answer that comes after a lease's deadline is not applied: the
//     lease ended at its deadline, and a lock the store extended for a
//     lost lease is freed (renewEnd's cleanup).
//   - The batch's context ends at the latest deadline in it (on the real
//     clock): a renewal is no use after its lease's deadline, and no lease
//     of the batch is cut short before its own. It ends too when the
//     Client closes, which stops the watchdogs anyway. A lease whose renewal
//     failed is renewed again soon, alone or in a later batch, while it is
//     valid (watchdogEnd).
//   - A lease that ends while its batch is in flight (released, lost) is
//     not cancelled out of the batch, which would fail the others: its
//     answer is ignored when it comes (renewEnd sees it ended), and a
//     renewal that reached the store after the release finds the token
//     gone and changes nothing.

// maxRenewBatch bounds the renewals of one batch.
const maxRenewBatch = 256

// renewDue runs the automatic renewals tick marked as running, at most
// maxConcurrentTicks requests at once per Client: batches when the
// Client's backend renews many locks in one request, one lease per request
// otherwise. It returns when they are done, so that clock.Fake.AdvanceWait
// covers them. Each is background work of its Client (track), which
// Client.Close ends and waits for; none starts once the Client is closing.
func renewDue(renew []*Lease) {
	var wg sync.WaitGroup
	var batch map[*Client][]*Lease
	for _, l := range renew {
		if _, ok := l.c.b.(backend.BatchRenewer); ok && len(renew) > 1 && !l.handingOver() {
			if batch == nil {
				batch = map[*Client][]*Lease{}
			}
			batch[l.c] = append(batch[l.c], l)
			continue
		}
		wg.Go(func() {
			if !l.c.track() {
				l.watchdogEnd(nil) // closing: no renewal
				return
			}
			defer l.c.bg.Done()
			l.c.renewSlots <- struct{}{}
			defer func() { <-l.c.renewSlots }()
			l.watchdogRenew()
		})
	}
	for c, ls := range batch {
		for len(ls) > 0 {
			n := min(len(ls), maxRenewBatch)
			chunk := ls[:n:n]
			ls = ls[n:]
			wg.Go(func() {
				if !c.track() {
					for _, l := range chunk {
						l.watchdogEnd(nil) // closing: no renewal
					}
					return
				}
				defer c.bg.Done()
				c.renewSlots <- struct{}{}
				defer func() { <-c.renewSlots }()
				if len(chunk) == 1 {
					chunk[0].watchdogRenew()
					return
				}
				renewBatch(c, chunk)
			})
		}
	}
	wg.Wait()
}

// renewBatch runs the automatic renewals of ls, leases of c, as one batch
// (see the argument above). It sends nothing once c is closing, and
// c.Close cancels it in flight, as watchdogRenew.
func renewBatch(c *Client, ls []*Lease) {
	if c.closed.Load() {
		for _, l := range ls {
			l.watchdogEnd(nil)
		}
		return
	}
	br := c.b.(backend.BatchRenewer)
	live := make([]*Lease, 0, len(ls))
	sents := make([]time.Time, 0, len(ls))
	rs := make([]backend.Renewal, 0, len(ls))
	var latest time.Time
	realClock := true
	for _, l := range ls {
		ttl, sent, err := l.renewStart()
		if err != nil {
			l.watchdogEnd(err)
			continue
		}
		l.mu.Lock()
		if l.v.deadline.After(latest) {
			latest = l.v.deadline
		}
		realClock = realClock && clock.IsReal(l.sched.clock)
		l.mu.Unlock()
		live = append(live, l)
		sents = append(sents, sent)
		rs = append(rs, backend.Renewal{Key: l.key, Token: l.token, TTL: ttl})
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(c.renewCtx)
	if realClock {
		ctx, cancel = context.WithDeadline(c.renewCtx, latest)
	}
	defer cancel()
	res := br.RenewBatch(ctx, rs)
	if len(res) != len(rs) {
		res = backend.FailedRenewals(len(rs), fmt.Errorf("lock: the backend's RenewBatch answered %d renewals of %d (a backend bug)", len(res), len(rs)))
	}
	for i, l := range live {
		err := l.renewEnd(ctx, sents[i], res[i].Grant, res[i].Err)
		if l.c.observing() {
			l.observeEnd(ctx, EventRenew, sents[i], true, err)
		}
		l.watchdogEnd(err)
	}
}
