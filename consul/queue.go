package consul

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
// the token of the waiter's latest refused acquire; its CreateIndex orders
// the queue.
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
//     the releasing session holds it), locks it for the head's session
//     with the head's token, checks that the head's record is unchanged
//     since it was read (check-index), and locks the record again with the
//     value "h:" and, for the new holder, the waiters queued after it (so
//     that its own release can hand over in one transaction too). A record
//     whose session is gone refuses it twice: the check-index and the lock
//     with the session. The head's blocking query on its record returns
//     with that value, and reports the handover. A releaser that knows no
//     waiter deletes the entry and reads the queue in the same
//     transaction, then hands the free lock to the head in a second one;
//     stale views of the waiters are refused by the check-index.
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

// maxView bounds the waiters a handover tells the new holder of.
const maxView = 16

// hotFor is how long after finding a key held or queued a waiter enqueues
// first instead of trying the lock first.
const hotFor = time.Second

// handoverGrace is how long a waiter that saw the lock entry freed waits
// for a handover before it tries the lock itself.
const handoverGrace = 200 * time.Millisecond

// handoverTimeout bounds a handover sent after a release.
const handoverTimeout = 10 * time.Second

// waiter is a queued waiter as a releaser read it.
type waiter struct {
	Key     string `json:"k"` // the record
	Session string `json:"s"`
	Token   string `json:"t"`
	Index   uint64 `json:"i"` // the record's ModifyIndex when read
}

// handedValue is the value of a record handed the lock, after recHanded.
type handedValue struct {
	Token string   `json:"t"`
	Next  []waiter `json:"n,omitempty"`
}

// handoverOps are the operations that give the free or just unlocked entry
// name to ws[0], telling it of the rest.
func handoverOps(name string, ws []waiter) api.TxnOps {
	n := ws[0]
	v, _ := json.Marshal(handedValue{Token: n.Token, Next: ws[1:min(len(ws), maxView+1)]})
	return api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: name, Value: []byte(n.Token), Session: n.Session}},
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: n.Key, Index: n.Index}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: n.Key, Value: append([]byte(recHanded), v...), Session: n.Session}},
	}
}

// waiters returns the queued waiters of entry name in a transaction's
// results (of a get-tree of the queue, or of the entry's name), oldest
// first.
func waiters(name string, resp *api.TxnResponse) []waiter {
	if resp == nil {
		return nil
	}
	var out []waiter
	var created []uint64
	for _, r := range resp.Results {
		kv := r.KV
		if kv == nil || kv.Session == "" || !strings.HasPrefix(kv.Key, name+queueSep) || !strings.HasPrefix(string(kv.Value), recQueued) {
			continue
		}
		out = append(out, waiter{Key: kv.Key, Session: kv.Session, Token: string(kv.Value[len(recQueued):]), Index: kv.ModifyIndex})
		created = append(created, kv.CreateIndex)
	}
	idx := make([]int, len(out))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(created[a], created[b]) })
	sorted := make([]waiter, len(out))
	for i, j := range idx {
		sorted[i] = out[j]
	}
	return sorted
}

// handOverLater hands the free entry name to the first of ws that can
// take it, in the background: a waiter whose record changed or whose
// session is gone is skipped; a lock taken by someone else meanwhile ends
// it (that holder's release hands it over).
func (b *Backend) handOverLater(name string, ws []waiter) {
	b.sawHeld(name)
	b.bg.Go(func() {
		ctx, cancel := context.WithTimeout(b.ctx, handoverTimeout)
		defer cancel()
		for i := 0; i < len(ws) && i < 3; i++ {
			ok, resp, _, err := b.cli.Txn().Txn(handoverOps(name, ws[i:]), (&api.QueryOptions{}).WithContext(ctx))
			if ok || err != nil {
				return // handed over, or unknown: the waiter's timer covers it
			}
			if lockRefused(resp) {
				return
			}
		}
	})
}

// lockRefused reports whether a handover was refused by the lock entry
// (held by someone else, or under a lock-delay) rather than by the
// waiter's record or session.
func lockRefused(resp *api.TxnResponse) bool {
	if resp == nil {
		return false
	}
	for _, e := range resp.Errors {
		if e.OpIndex == 0 && !strings.Contains(e.What, "invalid session") {
			return true
		}
	}
	return false
}

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
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return waitq.Result{}, backend.ErrClosed
	}
	a := &attempt{Attempt: wa, sess: p.sess}
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

// lock tries to lock the entry with the attempt's session: a grant, or
// the reason of a refusal ("" when none), or waitq.ErrGone when the
// session is gone. Unless the session was created after the attempt's
// send time (fresh), or renewed lately enough to carry the lock as it is
// (asIs), it is renewed in the same round trip, so that the store keeps a
// lock it grants at least the TTL from that send time. The transaction
// deletes the place's record, should it have one: the lock is the
// record's end.
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
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: p.name, Value: []byte(token), Session: sess}},
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
		// The lease has the session now, and the record is gone.
		p.mu.Lock()
		if p.handed != "" {
			b.kill(p.handed, false) // handed meanwhile, and taken over by token
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

// enqueue puts (or keeps) the place in the queue with the attempt's token,
// and reports whether the lock entry was free then; waitq.ErrGone when
// the session is gone. The session is renewed beside it when its latest
// renewal is older than a third of the TTL, so that a handover leaves the
// waiter most of the TTL.
func (p *place) enqueue(ctx context.Context, a *attempt) (free bool, err error) {
	b := p.b
	ttl, token, sess := a.TTL, a.Token, a.sess
	p.mu.Lock()
	rec := p.rec
	p.mu.Unlock()
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: rec, Value: []byte(recQueued + token), Session: sess}},
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

// watchEntry follows the lock entry with blocking queries from index, for
// a waiter that was first in the queue when it queued: when the entry is
// freed without a handover (its holder's session expired or was destroyed,
// or a release of unknown outcome destroyed it), it wakes the waiter, which
// then tries the lock (sleeping out a lock-delay) instead of waiting for
// its timer. It ends when the waiter's session holds the entry, or the
// place closes.
func (p *place) watchEntry(sess string, index uint64) {
	b := p.b
	p.mu.Lock()
	ctx := p.entryCtx()
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.heading = false
		if p.ctx == ctx {
			// The query returned: cancelling closes nothing now.
			p.cancel()
			p.ctx, p.cancel = nil, nil
		}
		p.mu.Unlock()
	}()
	for {
		kv, meta, err := b.cli.KV().Get(p.name, (&api.QueryOptions{WaitIndex: index, WaitTime: waitTime}).WithContext(ctx))
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if sleep(ctx, retryDelay) != nil {
				return
			}
			continue
		}
		if meta.LastIndex == index {
			continue
		}
		index = meta.LastIndex
		p.mu.Lock()
		done := p.closed || p.sess != sess
		p.mu.Unlock()
		switch {
		case done || (kv != nil && kv.Session == sess):
			return
		case kv == nil || kv.Session == "":
			// Freed. A release by this library hands the lock over
			// right after (to this waiter, most likely): wake the
			// waiter only if no handover came meanwhile.
			b.sawFree(p.name)
			time.AfterFunc(handoverGrace, func() {
				p.mu.Lock()
				handed := p.handed != ""
				p.mu.Unlock()
				if !handed {
					p.q.Wake()
				}
			})
		}
	}
}

// watch follows the place's record with blocking queries from index: it
// reports a handover, and wakes the waiter when the record goes or a
// releaser asks it to try.
func (p *place) watch(sess, rec string, index uint64) {
	b := p.b
	defer func() {
		p.mu.Lock()
		p.watching = false
		p.mu.Unlock()
	}()
	for {
		kv, meta, err := b.cli.KV().Get(rec, (&api.QueryOptions{WaitIndex: index, WaitTime: waitTime}).WithContext(b.ctx))
		if b.ctx.Err() != nil {
			return
		}
		if err != nil {
			if sleep(b.ctx, retryDelay) != nil {
				return
			}
			continue
		}
		if meta.LastIndex == index {
			continue // the wait timed out
		}
		index = meta.LastIndex
		p.mu.Lock()
		if p.closed || p.sess != sess || p.rec != rec {
			p.mu.Unlock()
			return
		}
		switch {
		case kv == nil || kv.Session != sess:
			// The record went (the place's own lock deleting it ended
			// the watch above): the session expired or was destroyed.
			// Queue again with a new session, under a new name (the
			// old one is under the session's lock-delay).
			p.goneLocked()
			p.mu.Unlock()
			p.q.Lost()
			return
		case strings.HasPrefix(string(kv.Value), recHanded):
			var v handedValue
			if json.Unmarshal(kv.Value[len(recHanded):], &v) != nil || v.Token == "" {
				p.mu.Unlock()
				continue
			}
			p.mu.Unlock()
			ttl := p.q.TTL()
			if !p.q.Handoff(v.Token, backend.Grant{Fence: kv.ModifyIndex, TTL: ttl}) {
				return
			}
			// Since is the place's latest confirmed renewal (zero until
			// the attempt that queued returns: a pooled session is then
			// renewed before it carries a lock again).
			b.mu.Lock()
			b.owned[v.Token] = &owned{key: p.name, session: sess, ttl: ttl, fence: kv.ModifyIndex, renewed: p.q.Refreshed(), rec: rec, next: v.Next}
			b.mu.Unlock()
			p.mu.Lock()
			p.handed = v.Token
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

// entryCtx returns the context of the place's blocking queries on the lock
// entry. p.mu must be held.
func (p *place) entryCtx() context.Context {
	if p.ctx == nil {
		p.ctx, p.cancel = context.WithCancel(p.b.ctx)
	}
	return p.ctx
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
