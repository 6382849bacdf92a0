package consul

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/backend/waitq"
)

// The waiters' queue and the handover (backend.Queuer). The state machine
// of a waiter's place, and why it keeps the promise, are package waitq's;
// this file gives it its primitives.
//
// The record. A waiter's place is the entry PREFIX+KEY/q/ID, locked by the
// waiter's session, the session its lock will be on: the session is the
// record's carrier (Refresh renews it; a session that expires or is
// destroyed deletes the record, behavior delete). Its value is "q:" and
// the token of the waiter's latest refused acquire, with that acquire's
// holder label (label.go); its CreateIndex orders the queue.
//
// What the primitives guarantee:
//
//   - Atomicity. Consul transactions have no else branch, so Attempt is a
//     lock transaction and an enqueue transaction: a waiter that finds the
//     key held again soon after (sawHeld) enqueues first, and the same
//     transaction reads the lock entry, so that a lock freed meanwhile is
//     tried at once. The lock transaction deletes the waiter's record.
//   - The handover's guard. A release hands the lock to the head of the
//     queue in one transaction: it unlocks the entry (which fails unless
//     the releasing session holds it), locks it for the head's session with
//     the head's token and label, checks that the head's record is
//     unchanged since it was read (check-index), and locks the record again
//     with the value "h:" and, for the new holder, the waiters queued after
//     it (so that its own release can hand over in one transaction too),
//     with their labels. A record whose session is gone refuses it twice:
//     the check-index and the lock with the session. The head's blocking
//     query on its record returns with that value, and reports the
//     handover. A releaser that knows no waiter deletes the entry and reads
//     the queue in the same transaction, then hands the free lock to the
//     head in a second one; stale views of the waiters are refused by the
//     check-index.
//   - Fences. Consul gives every entry a transaction writes the same
//     ModifyIndex, the transaction's Raft index: the record's ModifyIndex,
//     which the head reads, is the lock entry's, above every index before.
//   - Leave deletes the record when it is as the place last wrote it
//     (nothing was handed to it, and no handover can follow), or else the
//     entry if its session holds it and the record, in one transaction
//     that checks the session; failing both, it destroys the session,
//     which deletes the record and makes a later handover fail. Only a
//     handover that lands between those requests frees the lock under
//     Consul's lock-delay, which the next waiter sleeps out (RetryIn).
//
// A holder that expires is not a release: the head learns of it from its
// blocking query on the lock entry (watchEntry), or from package lock's
// timer.

// queueSep separates a lock entry's name from its queue records' names.
// Entry names never hold a slash after the prefix (keys are path-escaped),
// so no other lock's entry starts with NAME/q/.
const queueSep = "/q/"

// Record values: queued with a token, or handed over.
const (
	recQueued = "q:"
	recHanded = "h:"
)

// hotFor is how long after finding a key held or queued a waiter enqueues
// first instead of trying the lock first.
const hotFor = time.Second

// sawHeld notes that name was found held or queued now.
func (b *Backend) sawHeld(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.hot) > 4096 {
		clear(b.hot) // only a hint: bounded memory first
	}
	b.hot[name] = time.Now()
}

// isHot reports whether name was found held or queued within hotFor.
func (b *Backend) isHot(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.hot[name]
	return ok && time.Since(t) < hotFor
}

// Queue implements backend.Queuer. It sends nothing: the place's Acquire
// does.
func (b *Backend) Queue(key string) (backend.Queue, error) {
	if b.closed.Load() {
		return nil, backend.ErrClosed
	}
	name := b.entry(key)
	p := &place{b: b, key: key, name: name, rec: b.recordName(name)}
	p.q = b.waiters.New(p)
	return p.q, nil
}

// recordName returns a new name for a queue record of entry name.
func (b *Backend) recordName(name string) string {
	var id [8]byte
	crand.Read(id[:])
	return name + queueSep + hex.EncodeToString(id[:])
}

// place is the store side of one waiter's place in a key's queue
// (waitq.Store): its session, the session its lock will be on, and its
// record.
type place struct {
	b    *Backend
	q    *waitq.Place
	key  string
	name string // the lock entry

	mu       sync.Mutex
	rec      string // the record
	sess     string // the place's session; "" when none (or a lease took it)
	recIndex uint64 // the record's ModifyIndex as the place last wrote it; 0 when unknown
	handed   string // the token of a handover the queue took note of
	watching bool   // a blocking query on the record runs
	heading  bool   // a blocking query on the lock entry runs (see watchEntry)
	ctx      context.Context
	cancel   context.CancelFunc
	closed   bool
}

// Stop implements waitq.Store. A blocking query on the lock entry ends
// when the entry changes; one that waits for a holder this waiter left
// behind is cancelled (which closes its connection). A waiter that took
// the lock handed to it leaves its session to the lease.
func (p *place) Stop(took bool, _ *backend.Handover) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if !took && p.cancel != nil {
		p.cancel()
	}
	if took {
		p.sess = "" // the lease has it (the grant's, or the handover's)
	}
}

// Leave implements waitq.Store. A place that leaves without the lock
// frees what it may hold in the store (see leave); a session that holds
// neither a record nor a lock goes back to the pool.
func (p *place) Leave(ctx context.Context, l waitq.Leaving) error {
	p.mu.Lock()
	sess, rec, recIndex, handed := p.sess, p.rec, p.recIndex, p.handed
	p.sess = ""
	p.mu.Unlock()
	ttl, renewed := p.q.TTL(), p.q.Refreshed()
	if l.Handed != nil {
		handed = l.Handed.Token
	}
	switch {
	case sess == "":
	case handed != "" || l.Queued:
		if handed != "" {
			p.b.kill(handed, false)
			recIndex = 0 // the handover rewrote the record
		}
		p.b.leave(ctx, p.name, rec, sess, recIndex, ttl, renewed)
	default:
		p.b.keep(sess, ttl, renewed)
	}
	return nil
}

// leave frees what a waiter that gives up may hold: its record, and a lock
// handed to its session (known to it or not), without the lock-delay that
// destroying the session would put on the key.
//
//   - When the record is as the place last wrote it (recIndex), nothing
//     was handed to it: a handover rewrites the record in the transaction
//     that locks the entry. Deleting the record with a check of that index
//     ends every later handover to it too (each checks the record's
//     index), so the session then holds nothing and is pooled.
//   - Otherwise one transaction deletes the entry, if the session holds it,
//     and the record.
//   - When neither applies (the record changed and the session does not
//     hold the entry, or an answer was lost), the session is destroyed,
//     which deletes the record and frees a lock handed to it meanwhile
//     under the lock-delay.
func (b *Backend) leave(ctx context.Context, name, rec, sess string, recIndex uint64, ttl time.Duration, renewed time.Time) {
	opts := (&api.QueryOptions{}).WithContext(ctx)
	if recIndex != 0 {
		ok, _, _, err := b.cli.Txn().Txn(api.TxnOps{
			{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: rec, Index: recIndex}},
			{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: rec}},
		}, opts)
		if err == nil && ok {
			b.keep(sess, ttl, renewed)
			return
		}
	}
	ok, _, _, err := b.cli.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: name, Session: sess}},
		{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: name}},
		{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: rec}},
	}, opts)
	if err == nil && ok {
		b.keep(sess, ttl, renewed)
		return
	}
	if _, err := b.cli.Session().Destroy(sess, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		b.destroy(sess) // tried again, in the background
	}
}

// attempt is what one Attempt learned so far.
type attempt struct {
	waitq.Attempt
	label string // the holder label of the attempt's request (label.go)
	sess  string
	fresh bool // the session was created after the attempt's send time
	res   waitq.Result
}

// renewedAt notes a confirmed renewal of the attempt's session sent at
// sent.
func (a *attempt) renewedAt(sent time.Time) {
	if sent.After(a.res.Refreshed) {
		a.res.Refreshed = sent
	}
	if sent.After(a.Refreshed) {
		a.Refreshed = sent
	}
}

// Attempt implements waitq.Store. The session is the record's carrier. A
// try that found its session gone changed nothing (waitq.ErrGone); the
// queue's next one (a.Fresh) creates a session of its own instead of
// taking another from the pool, which may have expired as well.
func (p *place) Attempt(ctx context.Context, wa waitq.Attempt) (waitq.Result, error) {
	b := p.b
	if err := b.check(wa.TTL); err != nil {
		return waitq.Result{}, err
	}
	label, err := requestLabel(ctx, wa.Token)
	if err != nil {
		return waitq.Result{}, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return waitq.Result{}, backend.ErrClosed
	}
	a := &attempt{Attempt: wa, label: label, sess: p.sess}
	p.handed = "" // the caller did not take it: this attempt takes it over
	p.mu.Unlock()
	a.res.Queued = a.Queued
	ttl := a.TTL
	sent := time.Now()
	if a.sess == "" {
		var e pooled
		ok := false
		if !a.Fresh {
			e, ok = b.pool.get(ttl)
		}
		if ok {
			a.sess, a.Refreshed = e.id, e.renewed
		} else {
			sess, err := b.createSession(ctx, p.key, ttl)
			if err != nil {
				return a.res, err
			}
			a.sess, a.Refreshed, a.fresh = sess, sent, true
		}
		a.res.Refreshed = a.Refreshed
		p.mu.Lock()
		p.sess = a.sess
		p.mu.Unlock()
	}
	enqueued := false
	if !a.Queued && a.Handed == nil && b.isHot(p.name) {
		// The key was held or queued a moment ago: enqueue first, and
		// try the lock only if it is free.
		free, err := p.enqueue(ctx, a)
		if err != nil {
			return a.res, err
		}
		if !free {
			return a.res, backend.Locked(0)
		}
		enqueued = true
	}
	for {
		g, refusal, err := p.lock(ctx, a)
		if refusal == "" || err != nil {
			if err == nil && a.Handed != nil {
				b.kill(a.Handed.Token, false) // taken over by token
			}
			a.res.Grant = g
			return a.res, err
		}
		if strings.Contains(refusal, "lock delay") {
			// Nobody can hand the lock over during a lock-delay: wake
			// the waiter when it ends. The place is as it was.
			left := b.lockDelayLeft(p.name)
			a.res.RetryIn = left
			if !enqueued {
				a.res.Queued = false
			}
			return a.res, backend.Locked(left)
		}
		b.sawHeld(p.name)
		if enqueued {
			return a.res, backend.Locked(0) // queued, and the lock was taken again
		}
		free, err := p.enqueue(ctx, a)
		if err != nil {
			return a.res, err
		}
		if !free {
			return a.res, backend.Locked(0)
		}
		enqueued = true
	}
}

// lock tries to lock the entry with the attempt's session, token and
// label: a grant, or the reason of a refusal ("" when none), or
// waitq.ErrGone when the session is gone. Unless the session was created
// after the attempt's send time (fresh), or renewed lately enough to carry
// the lock as it is (asIs), it is renewed in the same round trip, so that
// the store keeps a lock it grants at least the TTL from that send time.
// The transaction deletes the place's record, should it have one: the
// lock is the record's end.
func (p *place) lock(ctx context.Context, a *attempt) (g backend.Grant, refusal string, err error) {
	b := p.b
	ttl, token, sess := a.TTL, a.Token, a.sess
	p.mu.Lock()
	hasRec, rec := a.res.Queued || a.Handed != nil || p.handed != "", p.rec
	p.mu.Unlock()
	b.mu.Lock()
	b.owned[token] = &owned{key: p.name, session: sess, ttl: ttl}
	b.mu.Unlock()
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: p.name, Value: entryValue(token, a.label), Session: sess}},
		{KV: &api.KVTxnOp{Verb: api.KVGet, Key: p.name}},
	}
	if hasRec {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: rec}})
	}
	renewed := a.Refreshed
	var renewErr error
	var wg sync.WaitGroup
	renew := !a.fresh && !asIs(ttl, time.Now(), renewed)
	if renew {
		wg.Go(func() { renewed, renewErr = b.renewAfter(ctx, sess) })
	}
	ok, resp, _, err := b.cli.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	wg.Wait()
	if renew && renewErr == nil {
		a.renewedAt(renewed)
	}
	switch {
	case err != nil:
		// The outcome is unknown: the lock, and the record's delete,
		// may have landed. The release package lock sends to undo it
		// owns the session now (it destroys it, or pools it after a
		// release that freed the lock); the place forgets it.
		p.forget()
		a.res.Queued = false
		return backend.Grant{}, "", fmt.Errorf("consul: acquire %q: %w", p.key, err)
	case ok && renewErr != nil:
		p.forget()
		a.res.Queued = false
		b.destroyLater(token)
		return backend.Grant{}, "", fmt.Errorf("consul: acquire %q: renewing the session: %w", p.key, renewErr)
	case ok:
		if len(resp.Results) < 2 || resp.Results[1].KV == nil {
			p.forget()
			a.res.Queued = false
			b.destroyLater(token)
			return backend.Grant{}, "", fmt.Errorf("consul: acquire %q: the transaction returned no entry", p.key)
		}
		fence := resp.Results[1].KV.ModifyIndex
		b.mu.Lock()
		if o := b.owned[token]; o != nil {
			o.fence, o.renewed = fence, renewed
		}
		b.mu.Unlock()
		// The lease has the session now, and the record is gone. A
		// handover reported meanwhile to an earlier token of the place
		// is taken over by token: that token is dead. One to token
		// itself (the record this attempt queued, handed to it before
		// its lock landed; the lock then found the session holding the
		// entry) is this grant's lock: token is the lease's.
		p.mu.Lock()
		if p.handed != "" && p.handed != token {
			b.kill(p.handed, false)
		}
		p.sess, p.handed, p.recIndex = "", "", 0
		p.mu.Unlock()
		return backend.Grant{Fence: fence, TTL: ttl}, "", nil
	}
	b.mu.Lock()
	delete(b.owned, token)
	b.mu.Unlock()
	why := txnErrors(resp)
	if strings.Contains(why, "invalid session") || errors.Is(renewErr, errSessionGone) {
		return backend.Grant{}, why, p.sessionGone(sess)
	}
	return backend.Grant{}, why, nil
}

// enqueue puts (or keeps) the place in the queue with the attempt's token
// and label, and reports whether the lock entry was free then;
// waitq.ErrGone when the session is gone. The session is renewed beside it
// when its latest renewal is older than a third of the TTL, so that a
// handover leaves the waiter most of the TTL.
func (p *place) enqueue(ctx context.Context, a *attempt) (free bool, err error) {
	b := p.b
	ttl, token, sess := a.TTL, a.Token, a.sess
	p.mu.Lock()
	rec := p.rec
	p.mu.Unlock()
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: rec, Value: append([]byte(recQueued), entryValue(token, a.label)...), Session: sess}},
		{KV: &api.KVTxnOp{Verb: api.KVGetTree, Key: p.name}},
	}
	var rsent time.Time
	var renewErr error
	var wg sync.WaitGroup
	if time.Since(a.Refreshed) > ttl/3 {
		wg.Go(func() { rsent, renewErr = b.renewAfter(ctx, sess) })
	}
	ok, resp, _, err := b.cli.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	wg.Wait()
	if !rsent.IsZero() && renewErr == nil {
		a.renewedAt(rsent)
	}
	switch {
	case err != nil:
		// The record may exist: it goes with the session when the
		// place leaves.
		p.mu.Lock()
		p.recIndex = 0
		p.mu.Unlock()
		a.res.Queued = true
		return false, fmt.Errorf("consul: acquire %q: queueing: %w", p.key, err)
	case !ok:
		why := txnErrors(resp)
		switch {
		case strings.Contains(why, "invalid session"):
			return false, p.sessionGone(sess)
		case strings.Contains(why, "lock delay"):
			// The record's name is under the lock-delay of a session
			// that held it: take another, and try once more.
			p.mu.Lock()
			if p.rec == rec {
				p.rec = b.recordName(p.name)
			}
			p.mu.Unlock()
			return false, fmt.Errorf("%w: the record's name was under a lock-delay", waitq.ErrGone)
		}
		return false, fmt.Errorf("consul: acquire %q: queueing: %s", p.key, why)
	}
	var index, entryIndex uint64
	free = true
	for _, r := range resp.Results {
		switch {
		case r.KV == nil:
		case r.KV.Key == rec:
			index = r.KV.ModifyIndex
		case r.KV.Key == p.name && r.KV.Session != "":
			free, entryIndex = false, r.KV.ModifyIndex
		}
	}
	ws := waiters(p.name, resp)
	first := len(ws) > 0 && ws[0].Key == rec
	a.res.Queued = true
	p.mu.Lock()
	if p.rec == rec {
		p.recIndex = index
	}
	start := !p.watching && !p.closed
	if start {
		p.watching = true
	}
	head := first && !free && !p.heading && !p.closed
	if head {
		p.heading = true
	}
	p.mu.Unlock()
	if start {
		b.bg.Go(func() { p.watch(sess, rec, index) })
	}
	if head {
		b.bg.Go(func() { p.watchEntry(sess, entryIndex) })
	}
	return free, nil
}

// Refresh implements waitq.Store: a renewal of the place's session.
func (p *place) Refresh(ctx context.Context, _ time.Duration) (waitq.Refreshed, error) {
	p.mu.Lock()
	sess := p.sess
	p.mu.Unlock()
	if sess == "" {
		return waitq.Refreshed{}, fmt.Errorf("%w: the place has no session", waitq.ErrGone)
	}
	_, err := p.b.renewAfter(ctx, sess)
	if errors.Is(err, errSessionGone) {
		return waitq.Refreshed{}, p.sessionGone(sess)
	}
	return waitq.Refreshed{}, err
}

// sessionGone forgets the place's session sess, which Consul no longer
// knows: its record went with it (waitq.ErrGone).
func (p *place) sessionGone(sess string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sess == sess {
		p.goneLocked()
	}
	return fmt.Errorf("%w: consul: the session is gone", waitq.ErrGone)
}

// goneLocked forgets the place's session and record. The old record's
// name is under the lock-delay of the session that held it: the place
// queues again under a new one. p.mu must be held.
func (p *place) goneLocked() {
	p.sess, p.handed, p.recIndex = "", "", 0
	p.rec = p.b.recordName(p.name)
}

// forget forgets the place's session, which a lock attempt of unknown
// outcome passed to the release that undoes it.
func (p *place) forget() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.goneLocked()
}
