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
)

// The waiters' queue and the handover (backend.Queuer).
//
// A waiter's place in a key's queue is a record, the entry
// PREFIX+KEY/q/ID, locked by the waiter's session: the session its lock
// will be on. Its value is "q:" and the token of the waiter's latest
// refused acquire; its CreateIndex orders the queue. Consul transactions
// have no else branch, so a refused lock and the enqueue are two requests;
// a waiter that finds the key held again soon after (sawHeld) enqueues
// first, and the same transaction reads the lock entry, so that a lock
// freed meanwhile is tried at once.
//
// A release hands the lock to the head of the queue in one transaction:
// it unlocks the entry (which fails unless the releasing session holds
// it), locks it for the head's session with the head's token, checks that
// the head's record is unchanged since it was read (check-index), and
// locks the record again with the value "h:" and, for the new holder, the
// waiters queued after it (so that its own release can hand over in one
// transaction too). The head's blocking query on its record returns with
// that value: it holds the lock, with no request of its own. A releaser
// that knows no waiter deletes the entry and reads the queue in the same
// transaction, then hands the free lock to the head in a second one. Why
// that keeps the promise:
//
//   - Exclusion. The handover checks and replaces the holder's session in
//     one Raft write; every other acquire finds the entry locked.
//   - The waiter's deadline. The lock is on the waiter's session, which
//     the store keeps at least its TTL after each creation or renewal it
//     received; the waiter counts its deadline from the send time of the
//     latest one the store confirmed (Handover.Since), never from the
//     handover, which it did not send. The place renews its session every
//     third of the TTL while it waits.
//   - Vanished records. A session that expired or was destroyed deletes
//     the record it locked (behavior delete), and a lock request with it
//     fails: the check-index on the record and the lock with the session
//     both refuse the handover, and nothing is written. A waiter is never
//     handed the lock from a record that vanished; its next attempt
//     queues again with a new session.
//   - Fences. Consul gives every entry a transaction writes the same
//     ModifyIndex, the transaction's Raft index: the record's ModifyIndex,
//     which the head reads, is the lock entry's, above every index before.
//   - A waiter that gives up deletes its record when the record is as it
//     last wrote it (nothing was handed to it, and no handover can follow:
//     each checks the record's index), or else the entry if its session
//     holds it (a lock handed to it) and its record, in one transaction
//     that checks the session; failing both, it destroys its session,
//     which deletes its record and makes a later handover fail on the
//     session. Only a handover that lands between those requests frees
//     the lock under Consul's lock-delay, which the next waiter sleeps out.
//     Its Acquire returns once that is done (or after leaveWait, when the
//     store does not answer). A waiter whose process dies leaves its
//     record and any lock handed to it to its session's expiry: between
//     one and two TTLs after its last renewal.
//   - Stale views. The waiters a new holder is told of may have left or
//     queued again since: the check-index refuses them, and the release
//     falls back to delete, read and hand over.
//
// A holder that expires is not a release: the head learns of it from its
// timer (package lock retries a queued waiter at least every TTL), not at
// once.

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
	return &place{b: b, key: key, name: name, rec: b.recordName(name), ch: make(chan struct{}, 1)}, nil
}

// recordName returns a new name for a queue record of entry name.
func (b *Backend) recordName(name string) string {
	var id [8]byte
	crand.Read(id[:])
	return name + queueSep + hex.EncodeToString(id[:])
}

// place is one waiter's place in a key's queue.
type place struct {
	b    *Backend
	key  string
	name string // the lock entry
	rec  string // the record
	ch   chan struct{}

	mu       sync.Mutex
	sess     string // the place's session; "" when none (or a lease took it)
	ttl      time.Duration
	renewed  time.Time // send time of the latest confirmed creation or renewal of sess
	queued   bool      // the record may exist
	recIndex uint64    // the record's ModifyIndex as the place last wrote it; 0 when unknown
	watching bool      // a blocking query on the record runs
	heading  bool      // a blocking query on the lock entry runs (see watchEntry)
	ctx      context.Context
	cancel   context.CancelFunc
	handed   *backend.Handover
	closed   bool
	renew    *time.Timer
}

func (p *place) C() <-chan struct{} { return p.ch }

func (p *place) wake() {
	select {
	case p.ch <- struct{}{}:
	default:
	}
}

// Handed implements backend.Queue.
func (p *place) Handed() (backend.Handover, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.handed == nil {
		return backend.Handover{}, false
	}
	return *p.handed, true
}

// Close implements backend.Queue. A place that leaves without the lock
// destroys its session when it may hold a record or a lock handed to it:
// both go with it. A session that holds neither goes back to the pool.
func (p *place) Close(took bool) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.renew != nil {
		p.renew.Stop()
	}
	sess, ttl, renewed, queued, handed, rec, recIndex := p.sess, p.ttl, p.renewed, p.queued, p.handed, p.rec, p.recIndex
	p.sess = ""
	if !took && p.cancel != nil {
		// A blocking query on the lock entry ends when the entry
		// changes; one that waits for a holder this waiter left behind
		// is cancelled (which closes its connection).
		p.cancel()
	}
	p.mu.Unlock()
	switch {
	case sess == "":
	case took && handed != nil:
		// The lease has the session.
	case handed != nil || queued:
		if handed != nil {
			p.b.kill(handed.Token, false)
			recIndex = 0 // the handover rewrote the record
		}
		p.b.leave(p.name, rec, sess, recIndex, ttl, renewed)
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
//
// Close waits for it up to leaveWait, so that a waiter that gave up has
// left nothing behind when its Acquire returns; a store that does not
// answer by then gets the rest in the background.
func (b *Backend) leave(name, rec, sess string, recIndex uint64, ttl time.Duration, renewed time.Time) {
	done := make(chan struct{})
	b.bg.Go(func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(b.ctx, handoverTimeout)
		defer cancel()
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
	})
	t := time.NewTimer(leaveWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// leaveWait bounds how long a waiter that gives up waits for its leave.
const leaveWait = 500 * time.Millisecond

// Acquire implements backend.Queue.
func (p *place) Acquire(ctx context.Context, token string, ttl time.Duration) (backend.Grant, error) {
	if err := p.b.check(ttl); err != nil {
		return backend.Grant{}, err
	}
	// A try that found its session gone changed nothing. The next one
	// creates a session of its own instead of taking another from the
	// pool, which may have expired as well; should even that one be gone
	// at once, the acquire fails. It never returns a zero grant.
	for attempt := 0; ; attempt++ {
		g, retry, err := p.try(ctx, token, ttl, attempt > 0)
		switch {
		case !retry:
			return g, err
		case attempt > 0:
			return backend.Grant{}, fmt.Errorf("consul: acquire %q: the session created for the attempt was gone at once (destroyed from outside?); nothing was changed", p.key)
		}
	}
}

// try is one try of Acquire; retry is true when the place's session was
// gone, and nothing changed. With create, a place without a session
// creates one instead of taking one from the pool.
func (p *place) try(ctx context.Context, token string, ttl time.Duration, create bool) (g backend.Grant, retry bool, err error) {
	b := p.b
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return backend.Grant{}, false, backend.ErrClosed
	}
	if p.sess != "" && p.ttl != ttl {
		p.mu.Unlock()
		return backend.Grant{}, false, fmt.Errorf("%w: consul: acquire %q for %v in a queue entered with a TTL of %v", backend.ErrInvalid, p.key, ttl, p.ttl)
	}
	sess, renewed, queued, handed := p.sess, p.renewed, p.queued, p.handed
	p.mu.Unlock()
	sent := time.Now()
	fresh := false // the session was created after sent
	if sess == "" {
		var e pooled
		ok := false
		if !create {
			e, ok = b.pool.get(ttl)
		}
		if ok {
			sess, renewed = e.id, e.renewed
		} else {
			sess, err = b.createSession(ctx, p.key, ttl)
			if err != nil {
				return backend.Grant{}, false, err
			}
			renewed, fresh = sent, true
		}
		p.mu.Lock()
		p.sess, p.ttl, p.renewed = sess, ttl, renewed
		p.mu.Unlock()
	}
	enqueued := false
	if !queued && handed == nil && b.isHot(p.name) {
		// The key was held or queued a moment ago: enqueue first, and
		// try the lock only if it is free.
		free, retry, err := p.enqueue(ctx, token, sess, renewed)
		if retry || err != nil {
			return backend.Grant{}, retry, err
		}
		if !free {
			return backend.Grant{}, false, backend.Locked(0)
		}
		enqueued = true
	}
	for {
		g, refusal, retry, err := p.lock(ctx, token, sess, fresh)
		if refusal == "" || retry {
			if err == nil && !retry && handed != nil {
				b.kill(handed.Token, false) // taken over by token
			}
			return g, retry, err
		}
		if strings.Contains(refusal, "lock delay") {
			// Nobody can hand the lock over during a lock-delay: wake
			// the waiter when it ends.
			left := b.lockDelayLeft(p.name)
			time.AfterFunc(left, p.wake)
			return backend.Grant{}, false, backend.Locked(left)
		}
		b.sawHeld(p.name)
		if enqueued {
			return backend.Grant{}, false, backend.Locked(0) // queued, and the lock was taken again
		}
		free, retry, err := p.enqueue(ctx, token, sess, renewed)
		if retry || err != nil {
			return backend.Grant{}, retry, err
		}
		if !free {
			return backend.Grant{}, false, backend.Locked(0)
		}
		enqueued = true
	}
}

// lock tries to lock the entry with the place's session: a grant, or the
// reason of a refusal ("" when none), or retry when the session is gone.
// Unless the session was created after the caller's send time (fresh), or
// renewed lately enough to carry the lock as it is (asIs), it is renewed
// in the same round trip, so that the store keeps a lock it grants at
// least the TTL from that send time. The transaction deletes the
// place's record, should it have one: the lock is the record's end.
func (p *place) lock(ctx context.Context, token, sess string, fresh bool) (g backend.Grant, refusal string, retry bool, err error) {
	b := p.b
	p.mu.Lock()
	ttl, hasRec, rec := p.ttl, p.queued || p.handed != nil, p.rec
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
	p.mu.Lock()
	renewed := p.renewed
	p.mu.Unlock()
	var renewErr error
	var wg sync.WaitGroup
	renew := !fresh && !asIs(ttl, time.Now(), renewed)
	if renew {
		wg.Go(func() { renewed, renewErr = b.renewAfter(ctx, sess) })
	}
	ok, resp, _, err := b.cli.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	wg.Wait()
	if renew && renewErr == nil {
		p.renewedAt(renewed)
	}
	switch {
	case err != nil:
		// The outcome is unknown: the lock, and the record's delete,
		// may have landed. The release package lock sends to undo it
		// owns the session now (it destroys it, or pools it after a
		// release that freed the lock); the place forgets it.
		p.forget()
		return backend.Grant{}, "", false, fmt.Errorf("consul: acquire %q: %w", p.key, err)
	case ok && renewErr != nil:
		p.forget()
		b.destroyLater(token)
		return backend.Grant{}, "", false, fmt.Errorf("consul: acquire %q: renewing the session: %w", p.key, renewErr)
	case ok:
		if len(resp.Results) < 2 || resp.Results[1].KV == nil {
			p.forget()
			b.destroyLater(token)
			return backend.Grant{}, "", false, fmt.Errorf("consul: acquire %q: the transaction returned no entry", p.key)
		}
		fence := resp.Results[1].KV.ModifyIndex
		b.mu.Lock()
		if o := b.owned[token]; o != nil {
			o.fence, o.renewed = fence, renewed
		}
		b.mu.Unlock()
		// The lease has the session now, and the record is gone.
		p.mu.Lock()
		if p.handed != nil {
			b.kill(p.handed.Token, false) // handed meanwhile, and taken over by token
		}
		p.sess, p.queued, p.handed = "", false, nil
		p.recIndex = 0
		if p.renew != nil {
			p.renew.Stop()
		}
		p.mu.Unlock()
		return backend.Grant{Fence: fence, TTL: ttl}, "", false, nil
	}
	b.mu.Lock()
	delete(b.owned, token)
	b.mu.Unlock()
	why := txnErrors(resp)
	if strings.Contains(why, "invalid session") || errors.Is(renewErr, errSessionGone) {
		p.sessionGone(sess)
		return backend.Grant{}, why, true, nil
	}
	return backend.Grant{}, why, false, nil
}

// enqueue puts (or keeps) the place in the queue with token, and reports
// whether the lock entry was free then; retry is true when the session is
// gone. The session is renewed beside it when its latest renewal is older
// than a third of the TTL, so that a handover leaves the waiter most of
// the TTL.
func (p *place) enqueue(ctx context.Context, token, sess string, renewed time.Time) (free, retry bool, err error) {
	b := p.b
	p.mu.Lock()
	ttl, rec := p.ttl, p.rec
	p.mu.Unlock()
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: rec, Value: []byte(recQueued + token), Session: sess}},
		{KV: &api.KVTxnOp{Verb: api.KVGetTree, Key: p.name}},
	}
	var rsent time.Time
	var renewErr error
	var wg sync.WaitGroup
	if time.Since(renewed) > ttl/3 {
		wg.Go(func() { rsent, renewErr = b.renewAfter(ctx, sess) })
	}
	ok, resp, _, err := b.cli.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	wg.Wait()
	if !rsent.IsZero() && renewErr == nil {
		p.renewedAt(rsent)
	}
	switch {
	case err != nil:
		// The record may exist: it goes with the session when the
		// place closes.
		p.mu.Lock()
		p.queued, p.recIndex = true, 0
		p.mu.Unlock()
		return false, false, fmt.Errorf("consul: acquire %q: queueing: %w", p.key, err)
	case !ok:
		why := txnErrors(resp)
		switch {
		case strings.Contains(why, "invalid session"):
			p.sessionGone(sess)
			return false, true, nil
		case strings.Contains(why, "lock delay"):
			// The record's name is under the lock-delay of a session
			// that held it: take another.
			p.mu.Lock()
			if p.rec == rec {
				p.rec = b.recordName(p.name)
			}
			p.mu.Unlock()
			return false, true, nil
		}
		return false, false, fmt.Errorf("consul: acquire %q: queueing: %s", p.key, why)
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
	p.mu.Lock()
	p.queued = true
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
	p.scheduleRenewLocked()
	p.mu.Unlock()
	if start {
		b.bg.Go(func() { p.watch(sess, rec, index) })
	}
	if head {
		b.bg.Go(func() { p.watchEntry(sess, entryIndex) })
	}
	return free, false, nil
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
				handed := p.handed != nil
				p.mu.Unlock()
				if !handed {
					p.wake()
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
			p.sess, p.queued = "", false
			p.recIndex = 0
			p.rec = b.recordName(p.name)
			p.mu.Unlock()
			p.wake()
			return
		case strings.HasPrefix(string(kv.Value), recHanded):
			var v handedValue
			if json.Unmarshal(kv.Value[len(recHanded):], &v) != nil || v.Token == "" {
				p.mu.Unlock()
				continue
			}
			h := &backend.Handover{Token: v.Token, Grant: backend.Grant{Fence: kv.ModifyIndex, TTL: p.ttl}, Since: p.renewed}
			p.handed = h
			b.mu.Lock()
			b.owned[v.Token] = &owned{key: p.name, session: sess, ttl: p.ttl, fence: kv.ModifyIndex, renewed: p.renewed, rec: rec, next: v.Next}
			b.mu.Unlock()
			p.mu.Unlock()
			p.wake()
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

// scheduleRenewLocked renews the place's session a third of the TTL after
// its latest renewal while the place waits. p.mu must be held.
func (p *place) scheduleRenewLocked() {
	if p.closed || p.renew != nil || p.sess == "" {
		return
	}
	ttl := p.ttl
	p.renew = time.AfterFunc(max(ttl/3-time.Since(p.renewed), 0), func() {
		p.mu.Lock()
		p.renew = nil
		sess, closed := p.sess, p.closed
		p.mu.Unlock()
		if closed || sess == "" {
			return
		}
		ctx, cancel := context.WithTimeout(p.b.ctx, ttl/3)
		defer cancel()
		sent, err := p.b.renewAfter(ctx, sess)
		switch {
		case err == nil:
			p.renewedAt(sent)
		case errors.Is(err, errSessionGone):
			p.sessionGone(sess)
			p.wake()
			return
		}
		p.mu.Lock()
		if p.sess == sess {
			p.scheduleRenewLocked()
		}
		p.mu.Unlock()
	})
}

// renewedAt notes a confirmed renewal of the place's session sent at sent.
func (p *place) renewedAt(sent time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if sent.After(p.renewed) {
		p.renewed = sent
	}
}

// sessionGone forgets the place's session sess, which Consul no longer
// knows: its record went with it.
func (p *place) sessionGone(sess string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sess == sess {
		p.sess, p.queued, p.handed = "", false, nil
		p.recIndex = 0
		// The old record's name is under the lock-delay of the session
		// that held it: queue again under a new one.
		p.rec = p.b.recordName(p.name)
	}
}

// forget forgets the place's session, which a lock attempt of unknown
// outcome passed to the release that undoes it.
func (p *place) forget() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sess, p.queued, p.handed = "", false, nil
	p.recIndex = 0
	p.rec = p.b.recordName(p.name)
	if p.renew != nil {
		p.renew.Stop()
	}
}
