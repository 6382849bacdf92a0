package etcd

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/backend/waitq"
)

// The waiters' queue and the handover (backend.Queuer). The state machine
// of a waiter's place, and why it keeps the promise, are package waitq's;
// this file gives it its primitives.
//
// The record. A waiter's place is a record under the lock key's queue
// prefix: its value is the token of the waiter's latest refused acquire,
// and it is attached to the waiter's lease, the lease its lock will be on:
// the lease is the record's carrier (Refresh is a keep-alive), and the
// record's create revision orders the queue. Beside it, under the
// attempt's token, is the attempt's holder label, if it carried one, on
// the same lease: a lock handed to that token shows it (see label.go).
//
// What the primitives guarantee:
//
//   - Atomicity. Attempt is one transaction: it takes the key only when
//     the place's own record still exists and comes first (deleting it in
//     the same step), or when nobody queues; its Else branch puts the
//     record, so that finding the key held and queueing cost one request.
//     Anyone else's acquire takes the key only when nobody queues.
//   - The handover's guard. The release hands the lock to the head of the
//     queue in one transaction, guarded by the releasing token and by the
//     head record's mod revision: it puts the head's token under the lock
//     key, on the head's lease, and deletes the head's record; the fence
//     is the revision of that put. The guard fails when the record was
//     deleted (its lease expired or was revoked) or replaced since the
//     releasing backend saw it: the release then deletes the key, and the
//     head's watch wakes it. A waiter is never handed the lock from a
//     record that vanished (the Jepsen etcd 3.4.3 finding). The head
//     learns of the handover from its follower's watch, with no request.
//   - The lock's life. A handed lock is on the waiter's lease, which
//     lives at least its TTL after each keep-alive or grant the store
//     received; keep-alives of unknown outcome only make it later, and
//     taint the lease so that it is never reused (see leases).
//   - Leave revokes the waiter's lease, which deletes its record and a
//     lock handed to it, even one handed by a release still on its way.
//
// The key's follower (follow.go) tells the place what the store did.

// watchSetupTimeout bounds Watch's wait for the key's watch; without it,
// package lock backs off and retries instead of waiting for wake-ups.
const watchSetupTimeout = 2 * time.Second

// place is the store side of one waiter's place in a key's queue
// (waitq.Store): its lease, the lease its lock will be on, and its record.
type place struct {
	qs      *queues
	q       *waitq.Place
	f       *follower
	key     string
	lockKey string
	qprefix string
	recKey  string

	// Guarded by qs.mu.
	secs   int64
	lease  clientv3.LeaseID
	create int64 // the record's create revision; 0: none known
	recRev int64 // revision of the latest change of the record this place knows of
	handed bool  // the queue took note of a handover
	took   bool  // the lease carries this waiter's lock
	// tainted: a keep-alive of the lease had an unknown outcome; a late
	// one would extend the lease's next lock, so it is never reused.
	tainted   bool
	closed    bool
	headWoken bool
	// labelToks are the tokens whose holder labels may be on the lease
	// (see label.go): the latest attempt's, when it carried one and its
	// outcome is known; more after attempts of unknown outcome. The next
	// attempt deletes them.
	labelToks []string
}

// newPlace returns a place in key's queue; follow says whether it follows
// the key at once, or only once an attempt queued it.
func (qs *queues) newPlace(key string, follow bool) (*place, error) {
	var id [8]byte
	crand.Read(id[:])
	lockKey, qprefix := qs.b.lockKeyOf(key), qs.b.queuePrefix(key)
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.closed {
		return nil, backend.ErrClosed
	}
	p := &place{qs: qs, key: key, lockKey: lockKey, qprefix: qprefix,
		recKey: qprefix + hex.EncodeToString(id[:])}
	p.q = qs.b.waiters.New(p)
	if follow {
		p.followLocked()
	}
	return p, nil
}

// followLocked makes p follow its key, through the backend's follower of
// it. qs.mu must be held.
func (p *place) followLocked() {
	if p.f != nil || p.closed || p.qs.closed {
		return
	}
	p.f = p.qs.followerLocked(p.key, p.lockKey)
	p.f.places[p] = struct{}{}
}

// Queue implements backend.Queuer. It sends nothing: the place follows the
// key (the backend's one watch of it) once an attempt of it queued, so that
// acquires that find the key free cost nothing more.
func (b *Backend) Queue(key string) (backend.Queue, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	p, err := b.queues.newPlace(key, false)
	if err != nil {
		return nil, err
	}
	return p.q, nil
}

// Watch implements backend.Notifier, for callers that do not use Queue: a
// place whose acquires are this backend's Acquire calls for the key until
// it closes (one such place per key and backend). It returns once the
// key's watch runs.
func (b *Backend) Watch(ctx context.Context, key string) (backend.Watch, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	p, err := b.queues.newPlace(key, true)
	if err != nil {
		return nil, err
	}
	t := time.NewTimer(watchSetupTimeout)
	defer t.Stop()
	select {
	case <-p.f.ready:
	case <-ctx.Done():
		p.q.Close(false)
		return nil, fmt.Errorf("etcd: watch: %w", ctx.Err())
	case <-t.C:
		p.q.Close(false)
		return nil, errors.New("etcd: watch: the store did not start the watch in time")
	}
	b.queues.mu.Lock()
	b.queues.watched[p.lockKey] = p
	b.queues.mu.Unlock()
	return p.q, nil
}

// Stop implements waitq.Store: the place stops following the key. A
// waiter that took the lock handed to it hands its lease to the lock.
func (p *place) Stop(took bool, handed *backend.Handover) {
	qs := p.qs
	qs.mu.Lock()
	defer qs.mu.Unlock()
	p.closed = true
	if p.f != nil {
		delete(p.f.places, p)
		p.f.lingerLocked()
	}
	if qs.watched[p.lockKey] == p {
		delete(qs.watched, p.lockKey)
	}
	if took && !p.took && handed != nil {
		// The caller took the lock handed to it: the lease is the lock's
		// now. (Not before: a release of a token whose handover the
		// caller did not take must not revoke the lease the place goes
		// on with.)
		p.took = true
		qs.b.leases.attach(p.lockKey, handed.Token, p.lease, p.secs, handed.Since, false, p.tainted)
	}
}

// Leave implements waitq.Store: it revokes the waiter's lease, which
// deletes its record and any lock handed to it, now or by a release still
// on its way.
func (p *place) Leave(ctx context.Context, _ waitq.Leaving) error {
	p.qs.mu.Lock()
	id, kept := p.lease, p.took
	p.qs.mu.Unlock()
	if kept || id == clientv3.NoLease {
		return nil
	}
	p.qs.b.revoke(ctx, id)
	return nil
}

// leaseFor returns the lease for an attempt, when the attempt was sent,
// and the send time of the lease's latest confirmed refresh: the place's
// own lease (refreshed at a.Refreshed) or an idle one, refreshed by a
// keep-alive whose answer comes on ka (refreshed is then sent), or a new
// one (granted its TTL). A lease refreshed lately carries a lock as it is
// (see reserve; ka nil, granted the TTL). When the attempt will most
// likely queue (refusable), a lease refreshed less than a third of its TTL
// ago is not refreshed either (ka nil, granted 0): its record lives, and
// the queue keeps it alive from then on; should the attempt take the key
// after all, the attempt refreshes the lease before it reports the grant.
// After ErrGone (a.Fresh), the lease is a new one.
func (p *place) leaseFor(ctx context.Context, a waitq.Attempt, secs int64, refusable bool) (id clientv3.LeaseID, sent, refreshed time.Time, ka <-chan kaAnswer, granted time.Duration, err error) {
	b := p.qs.b
	p.qs.mu.Lock()
	id, refreshed = p.lease, a.Refreshed
	p.qs.mu.Unlock()
	if id == clientv3.NoLease && !a.Fresh {
		id, refreshed = b.leases.take(secs)
	}
	sent = time.Now()
	switch {
	case id != clientv3.NoLease && asIs(secs, sent, refreshed):
		granted = time.Duration(secs) * time.Second
	case id != clientv3.NoLease && refusable && sent.Sub(refreshed) < time.Duration(secs)*time.Second/3:
	case id != clientv3.NoLease:
		ka, err = b.ka.start(id)
		if err != nil {
			return 0, time.Time{}, time.Time{}, nil, 0, b.storeErr(ctx, "acquire: keep-alive", err)
		}
	default:
		resp, err := b.cli.Grant(ctx, leaseSecs(secs))
		if err != nil {
			return 0, time.Time{}, time.Time{}, nil, 0, b.storeErr(ctx, "acquire: lease", err)
		}
		id, granted, refreshed = resp.ID, lockTTL(secs, resp.TTL), sent
	}
	p.qs.mu.Lock()
	p.lease, p.secs = id, secs
	p.qs.mu.Unlock()
	return id, sent, refreshed, ka, granted, nil
}

// refusableLocked reports whether an attempt of p will most likely find
// the key held or others queued before it, by the follower's view.
// qs.mu must be held.
func (p *place) refusableLocked() bool {
	if p.qs.refusable != nil {
		return p.qs.refusable()
	}
	f := p.f
	if f == nil {
		f = p.qs.fs[p.lockKey] // the backend follows the key for others
	}
	if f == nil || !f.current {
		return false
	}
	if f.lk.exists {
		return true
	}
	for k := range f.records {
		if k != p.recKey {
			return true
		}
	}
	return false
}

// Attempt implements waitq.Store: one acquire transaction of the waiter
// (see the comment at the top of this file). The lease is the record's
// carrier.
func (p *place) Attempt(ctx context.Context, a waitq.Attempt) (waitq.Result, error) {
	b := p.qs.b
	if err := b.check(); err != nil {
		return waitq.Result{}, err
	}
	if err := b.checkTTL(a.TTL); err != nil {
		return waitq.Result{}, err
	}
	label, err := requestLabel(ctx)
	if err != nil {
		return waitq.Result{}, err
	}
	token, secs := a.Token, seconds(a.TTL)
	p.qs.mu.Lock()
	p.handed = false // the caller did not take it: this attempt takes it over
	refusable := p.refusableLocked()
	p.qs.mu.Unlock()
	id, sent, refreshed, ka, granted, err := p.leaseFor(ctx, a, secs, refusable)
	if err != nil {
		return waitq.Result{Queued: a.Queued}, err
	}
	res := waitq.Result{Refreshed: refreshed}
	lk, tk, rk := p.lockKey, b.tombKeyOf(p.key, token), p.recKey
	p.qs.mu.Lock()
	create := p.create
	var stale []string
	for _, t := range p.labelToks {
		if t != token && !slices.Contains(stale, t) { // a key twice in a transaction is refused
			stale = append(stale, t)
		}
	}
	p.qs.mu.Unlock()
	// Every branch puts this attempt's label, if any, on the lease: with
	// the key it takes, or beside its record, for a handover to find
	// (see label.go); and deletes the labels of the place's earlier
	// tokens.
	labelled := func(ops ...clientv3.Op) []clientv3.Op {
		return deleteLabels(putLabel(ops, lk, token, label, id), lk, stale)
	}

	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(lk), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(tk), "=", 0),
	}
	then := []clientv3.Op{clientv3.OpPut(lk, token, clientv3.WithLease(id))}
	if create > 0 {
		// The record still exists and comes first: every record's
		// create revision is at least its own.
		cmps = append(cmps,
			clientv3.Compare(clientv3.CreateRevision(rk), "=", create),
			clientv3.Compare(clientv3.CreateRevision(p.qprefix), ">", create-1).WithPrefix())
		then = append(then, clientv3.OpDelete(rk))
	} else {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(p.qprefix), "=", 0).WithPrefix())
	}
	then = labelled(then...)
	enqueue := labelled(
		clientv3.OpGet(tk, clientv3.WithCountOnly()),
		clientv3.OpPut(rk, token, clientv3.WithLease(id), clientv3.WithPrevKV()),
	)
	els := enqueue
	if a.Prev != "" {
		// A release may have handed the lock to the previous token
		// (and the caller did not take it: it learned of it too late to
		// count on it, or not yet): take it over with this one, a new
		// grant with its own keep-alive, instead of queueing.
		els = []clientv3.Op{clientv3.OpTxn(
			[]clientv3.Cmp{
				clientv3.Compare(clientv3.Value(lk), "=", a.Prev),
				clientv3.Compare(clientv3.LeaseValue(lk), "=", id),
				clientv3.Compare(clientv3.CreateRevision(tk), "=", 0),
			},
			labelled(clientv3.OpPut(lk, token, clientv3.WithLease(id))),
			enqueue,
		)}
	}
	resp, err := b.cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	p.labelsSent(id, token, label, err)
	took := err == nil && resp.Succeeded
	enq := resp
	if err == nil && !resp.Succeeded && a.Prev != "" {
		inner := resp.Responses[0].GetResponseTxn()
		took = inner.Succeeded
		enq = (*clientv3.TxnResponse)(inner)
	}
	if ka != nil {
		var kerr error
		var kttl int64
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			kerr = rpctypes.ErrLeaseNotFound
		} else {
			kttl, kerr = await(ctx, ka)
		}
		switch {
		case errors.Is(kerr, rpctypes.ErrLeaseNotFound) && (errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && !took):
			// The lease expired, and with it the record, if any.
			return waitq.Result{}, p.leaseGone(id)
		case kerr != nil && err == nil && !took:
			// Queued; the lease's refresh is unknown, so its
			// confirmed refresh stays the earlier one.
			p.qs.mu.Lock()
			p.tainted = true
			p.qs.mu.Unlock()
		case kerr != nil:
			b.leases.attach(lk, token, id, secs, sent, true, true)
			return waitq.Result{Queued: true}, b.storeErr(ctx, "acquire: keep-alive", errors.Join(kerr, err))
		default:
			granted, refreshed = lockTTL(secs, kttl), sent
			res.Refreshed = sent
		}
	} else if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The lease expired before the attempt (it was not refreshed
		// for it); the transaction did nothing.
		return waitq.Result{}, p.leaseGone(id)
	} else if err == nil && took && granted == 0 {
		// Taken on a lease not refreshed for this attempt: refresh it
		// now. Once the store confirms it, it keeps the lock at least
		// the TTL from the keep-alive, which was sent after the
		// attempt; until then the lease lived (it was found).
		kaSent := time.Now()
		kttl, kerr := b.ka.keepAlive(ctx, id)
		switch {
		case errors.Is(kerr, rpctypes.ErrLeaseNotFound):
			// Expired between the two: the key went with it.
			return waitq.Result{}, p.leaseGone(id)
		case kerr != nil:
			b.leases.attach(lk, token, id, secs, sent, true, true)
			return waitq.Result{Queued: true}, b.storeErr(ctx, "acquire: keep-alive", kerr)
		}
		granted, refreshed = lockTTL(secs, kttl), kaSent
		res.Refreshed = kaSent
	}
	if err != nil {
		// The key may be attached to the lease now or later: the
		// release that package lock sends to undo this attempt finds
		// the lease here, marked unknown, and revokes it whatever it
		// finds, as Leave does; it never reuses it (see leases).
		b.leases.attach(lk, token, id, secs, refreshed, true, false)
		res.Queued = true
		return res, b.storeErr(ctx, "acquire", err)
	}
	if took {
		p.qs.mu.Lock()
		p.took, p.create, p.recRev = true, 0, resp.Header.Revision
		tainted := p.tainted
		p.qs.mu.Unlock()
		b.leases.attach(lk, token, id, secs, refreshed, false, tainted)
		res.Grant = backend.Grant{Fence: uint64(resp.Header.Revision), TTL: granted}
		return res, nil
	}
	if enq.Responses[0].GetResponseRange().Count > 0 {
		return waitq.Result{Queued: true}, errDead
	}
	created := resp.Header.Revision
	if prev := enq.Responses[1].GetResponsePut().PrevKv; prev != nil {
		created = prev.CreateRevision // the place it had
	}
	p.qs.mu.Lock()
	if resp.Header.Revision > p.recRev {
		p.create, p.recRev = created, resp.Header.Revision
	}
	if p.f == nil {
		p.followLocked()
		// A follower that ran before may have seen the key freed, or
		// handed to this token, before the place joined it.
		if p.f != nil && p.f.current {
			p.handedLocked(p.f.lk)
			p.f.settleLocked()
		}
	}
	p.qs.mu.Unlock()
	res.Queued = true
	return res, backend.Locked(0)
}

// leaseGone forgets the place's lease id, which the store no longer has,
// and says so to the queue (waitq.ErrGone).
func (p *place) leaseGone(id clientv3.LeaseID) error {
	p.qs.mu.Lock()
	defer p.qs.mu.Unlock()
	if p.lease == id {
		p.lease, p.create, p.handed = clientv3.NoLease, 0, false
		p.labelToks = nil // gone with the lease
	}
	return fmt.Errorf("%w: %w", waitq.ErrGone, errLeaseGone)
}

// labelsSent records which labels the attempt transaction of token, on
// lease id, left on the lease, from its outcome err: every branch of a
// transaction that ran put token's label, if any, and deleted the earlier
// ones; one of unknown outcome may have, or not.
func (p *place) labelsSent(id clientv3.LeaseID, token, label string, err error) {
	p.qs.mu.Lock()
	defer p.qs.mu.Unlock()
	switch {
	case p.lease != id || errors.Is(err, rpctypes.ErrLeaseNotFound):
		// The lease is gone: the transaction did nothing.
	case err == nil && label == "":
		p.labelToks = nil
	case err == nil:
		p.labelToks = []string{token}
	case label != "":
		p.labelToks = append(p.labelToks, token)
	}
}

// Refresh implements waitq.Store: a keep-alive of the place's lease, which
// keeps its record (and a lock handed to it) alive.
func (p *place) Refresh(ctx context.Context, _ time.Duration) (waitq.Refreshed, error) {
	p.qs.mu.Lock()
	id, stop := p.lease, p.closed || p.took || p.qs.closed
	p.qs.mu.Unlock()
	switch {
	case stop:
		return waitq.Refreshed{}, backend.ErrClosed
	case id == clientv3.NoLease:
		return waitq.Refreshed{}, fmt.Errorf("%w: the place has no lease", waitq.ErrGone)
	}
	_, err := p.qs.b.ka.keepAlive(ctx, id)
	switch {
	case err == nil:
		return waitq.Refreshed{}, nil
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return waitq.Refreshed{}, p.leaseGone(id) // the record went with it: queue again
	}
	p.qs.mu.Lock()
	if p.lease == id {
		p.tainted = true
	}
	p.qs.mu.Unlock()
	return waitq.Refreshed{}, err
}
