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
// turn passes to the longest-waiting goroutine. The store then sees one
// request per acquisition from this process instead of one per waiter, and a
// release is followed at once by the next local acquisition. Waiters in other
// processes still contend through the store and its wake-ups.
type localQueue struct {
	shards [16]localShard
}

type localShard struct {
	mu   sync.Mutex
	keys map[string]*localKey // present: the turn is taken; nil: nobody waits
}

type localKey struct {
	waiters list.List // of chan struct{}, in arrival order
}

func (q *localQueue) shard(key string) *localShard {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return &q.shards[h%uint32(len(q.shards))]
}

// tryTurn takes the key's turn if nobody of this Client has it.
func (q *localQueue) tryTurn(key string) bool {
	sh := q.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, busy := sh.keys[key]; busy {
		return false
	}
	if sh.keys == nil {
		sh.keys = map[string]*localKey{}
	}
	sh.keys[key] = nil
	return true
}

// turn waits for the key's turn, or for the end of ctx.
func (q *localQueue) turn(ctx context.Context, key string) error {
	sh := q.shard(key)
	sh.mu.Lock()
	k, busy := sh.keys[key]
	if !busy {
		if sh.keys == nil {
			sh.keys = map[string]*localKey{}
		}
		sh.keys[key] = nil
		sh.mu.Unlock()
		return nil
	}
	if k == nil {
		k = &localKey{}
		sh.keys[key] = k
	}
	ch := make(chan struct{}, 1)
	e := k.waiters.PushBack(ch)
	sh.mu.Unlock()

	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	sh.mu.Lock()
	select {
	case <-ch:
		// The turn came as ctx ended: pass it on.
		sh.mu.Unlock()
		q.pass(key)
	default:
		k.waiters.Remove(e)
		sh.mu.Unlock()
	}
	return ctx.Err()
}

// pass gives the key's turn to the longest-waiting goroutine, or frees it.
func (q *localQueue) pass(key string) {
	sh := q.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if k := sh.keys[key]; k != nil {
		if e := k.waiters.Front(); e != nil {
			k.waiters.Remove(e)
			e.Value.(chan struct{}) <- struct{}{}
			return
		}
	}
	delete(sh.keys, key)
}
