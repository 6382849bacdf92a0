package lock

import (
	"container/list"
	"context"
	"sync"
	"sync/atomic"
)

// localQueue keeps the goroutines of one Client that want the same key in
// line, in this process, instead of all of them asking the store. A key has a
// turn: the goroutine that holds the turn is the only one of this Client that
// asks the store for the key, and it keeps the turn while it holds the lease.
// When its lease ends (released on the store, or lost) or it gives up, the
// turn passes to the longest-waiting goroutine. When the backend can transfer
// a lock (backend.Transferer), the release hands the lock itself to that
// goroutine in one request. The store then sees about one request per
// acquisition from this process instead of one per waiter, and the next
// holder starts as soon as the previous one releases. Waiters in other
// processes still contend through the store and its wake-ups; a transfer is
// refused when one of them waits.
type localQueue struct {
	shards [16]localShard
}

type localShard struct {
	mu   sync.Mutex
	keys map[string]*localKey // present: the turn is taken; nil: nobody waits
}

type localKey struct {
	waiters list.List // of *localWaiter, in arrival order
}

// localWaiter is a goroutine waiting for a key's turn.
type localWaiter struct {
	token string
	cfg   *config
	ch    chan *Lease // nil: the turn; non-nil: a lease transferred to it
	elem  *list.Element
}

func (q *localQueue) shard(key string) *localShard {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return &q.shards[h%uint32(len(q.shards))]
}

// takeLocked takes the key's turn if it is free; called with sh.mu held.
func (sh *localShard) takeLocked(key string) bool {
	if _, busy := sh.keys[key]; busy {
		return false
	}
	if sh.keys == nil {
		sh.keys = map[string]*localKey{}
	}
	sh.keys[key] = nil
	return true
}

// tryTurn takes the key's turn if nobody of this Client has it, and
// returns it; nil when somebody has it.
func (q *localQueue) tryTurn(key string) *turn {
	sh := q.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.takeLocked(key) {
		return nil
	}
	return &turn{q: q, key: key}
}

// waitTurn waits for the key's turn, or for the end of ctx, and returns
// the turn; or, when the previous holder transferred the lock to this
// goroutine, a lease, which holds the turn. token makes the token a
// transfer would give the lock to, when the goroutine has to wait.
func (q *localQueue) waitTurn(ctx context.Context, key string, cfg *config, token func() (string, error)) (*turn, *Lease, error) {
	sh := q.shard(key)
	sh.mu.Lock()
	if sh.takeLocked(key) {
		sh.mu.Unlock()
		return &turn{q: q, key: key}, nil, nil
	}
	// The token a transfer gives the lock to; used for nothing else.
	tok, err := token()
	if err != nil {
		sh.mu.Unlock()
		return nil, nil, err
	}
	k := sh.keys[key]
	if k == nil {
		k = &localKey{}
		sh.keys[key] = k
	}
	w := &localWaiter{token: tok, cfg: cfg, ch: make(chan *Lease, 1)}
	w.elem = k.waiters.PushBack(w)
	sh.mu.Unlock()

	select {
	case l := <-w.ch:
		if l != nil {
			return nil, l, nil
		}
		return &turn{q: q, key: key}, nil, nil
	case <-ctx.Done():
	}
	sh.mu.Lock()
	if w.elem != nil {
		k.waiters.Remove(w.elem)
		w.elem = nil
		sh.mu.Unlock()
		return nil, nil, ctx.Err()
	}
	sh.mu.Unlock()
	// The turn, or a lease, came as ctx ended: give it back.
	if l := <-w.ch; l != nil {
		l.releaseInBackground()
	} else {
		q.pass(key)
	}
	return nil, nil, ctx.Err()
}

// waiting returns how many goroutines wait for key's turn.
func (q *localQueue) waiting(key string) int {
	sh := q.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if k := sh.keys[key]; k != nil {
		return k.waiters.Len()
	}
	return 0
}

// next returns the longest-waiting goroutine for key, or nil.
func (q *localQueue) next(key string) *localWaiter {
	sh := q.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if k := sh.keys[key]; k != nil {
		if e := k.waiters.Front(); e != nil {
			return e.Value.(*localWaiter)
		}
	}
	return nil
}

// deliver hands l, transferred to w's token, to w along with the turn. It
// reports false when w gave up meanwhile; the caller then releases l.
func (q *localQueue) deliver(key string, w *localWaiter, l *Lease) bool {
	sh := q.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if w.elem == nil {
		return false
	}
	sh.keys[key].waiters.Remove(w.elem)
	w.elem = nil
	w.ch <- l
	return true
}

// pass gives the key's turn to the longest-waiting goroutine, or frees it.
// Outside this file the turn passes through its holder's turn value
// (turn.pass), which passes it at most once.
func (q *localQueue) pass(key string) {
	sh := q.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if k := sh.keys[key]; k != nil {
		if e := k.waiters.Front(); e != nil {
			w := e.Value.(*localWaiter)
			k.waiters.Remove(e)
			w.elem = nil
			w.ch <- nil
			return
		}
	}
	delete(sh.keys, key)
}

// turn is one holder's hold on its Client's turn for a key (see
// localQueue). The holders, in order:
//
//   - the acquisition (Acquire, TryAcquire), which takes the turn
//     (tryTurn, waitTurn) and passes it when it returns without a lease,
//     unless it handed the turn on to
//   - the lease it returns, which passes the turn when it ends: lost, or
//     released once the store has answered the release (or at once when
//     the release cannot run because the Client is closing); or
//   - the cleanup of an attempt of unknown outcome (or of a grant that
//     broke the backend contract), which passes the turn when its release
//     has ended (at once when the Client is closing);
//   - and when a lease hands its lock to the next goroutine of the Client
//     (Lease.transferToNext), the turn goes on with the lock to that
//     goroutine's lease, which comes to its acquisition with the turn.
//
// Each move makes a new value for the new holder (handOn) and spends the
// old one, so a holder can call pass whenever it is done, whether or not
// it handed the turn on, and the turn passes once, from its last holder.
//
// A nil *turn is no turn: on a backend whose store runs in this process
// (Capabilities.InProcess) acquisitions take none, and pass and handOn do
// nothing.
type turn struct {
	q     *localQueue
	key   string
	spent atomic.Bool // passed, or handed on to a new holder
}

// pass gives the turn to the longest-waiting goroutine of the Client for
// the key, or frees it, unless t is spent: only the first call of pass or
// handOn on a turn value counts.
func (t *turn) pass() {
	if t != nil && t.spent.CompareAndSwap(false, true) {
		t.q.pass(t.key)
	}
}

// handOn moves the turn to a new holder without giving it up (the queue
// never sees it free): it spends t and returns the new holder's value. It
// returns nil, no turn, when t is nil or spent.
func (t *turn) handOn() *turn {
	if t == nil || !t.spent.CompareAndSwap(false, true) {
		return nil
	}
	return &turn{q: t.q, key: t.key}
}
