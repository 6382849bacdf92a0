package lock

import (
	"container/list"
	"context"
	"sync"
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

// tryTurn takes the key's turn if nobody of this Client has it.
func (q *localQueue) tryTurn(key string) bool {
	sh := q.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.takeLocked(key)
}

// turn waits for the key's turn, or for the end of ctx. It returns a lease
// when the previous holder transferred the lock to token.
func (q *localQueue) turn(ctx context.Context, key string, cfg *config) (*Lease, error) {
	sh := q.shard(key)
	sh.mu.Lock()
	if sh.takeLocked(key) {
		sh.mu.Unlock()
		return nil, nil
	}
	k := sh.keys[key]
	if k == nil {
		k = &localKey{}
		sh.keys[key] = k
	}
	// The token a transfer gives the lock to; used for nothing else.
	w := &localWaiter{token: newToken(), cfg: cfg, ch: make(chan *Lease, 1)}
	w.elem = k.waiters.PushBack(w)
	sh.mu.Unlock()

	select {
	case l := <-w.ch:
		return l, nil
	case <-ctx.Done():
	}
	sh.mu.Lock()
	if w.elem != nil {
		k.waiters.Remove(w.elem)
		w.elem = nil
		sh.mu.Unlock()
		return nil, ctx.Err()
	}
	sh.mu.Unlock()
	// The turn, or a lease, came as ctx ended: give it back.
	if l := <-w.ch; l != nil {
		l.releaseInBackground()
	} else {
		q.pass(key)
	}
	return nil, ctx.Err()
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
