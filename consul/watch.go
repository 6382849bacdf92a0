package consul

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock/backend"
)

// waitTime bounds one blocking query; the watch then asks again.
const waitTime = 5 * time.Minute

// retryDelay is the pause after a failed blocking query.
const retryDelay = 100 * time.Millisecond

// watch is a backend.Watch over blocking queries on one entry.
type watch struct {
	ch     chan struct{}
	cancel context.CancelFunc
}

func (w *watch) C() <-chan struct{} { return w.ch }

// Close implements backend.Watch. Every waiter is woken by a release, so
// there is no wake-up to pass on.
func (w *watch) Close(bool) error {
	w.cancel()
	return nil
}

// Watch implements backend.Notifier: a blocking query on the key's entry
// wakes the watcher whenever the entry is free (deleted or unlocked). ctx
// bounds the first read only.
func (b *Backend) Watch(ctx context.Context, key string) (backend.Watch, error) {
	if b.closed.Load() {
		return nil, backend.ErrClosed
	}
	name := b.entry(key)
	_, meta, err := b.cli.KV().Get(name, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("consul: watch %q: %w", key, err)
	}
	wctx, cancel := context.WithCancel(b.ctx)
	w := &watch{ch: make(chan struct{}, 1), cancel: cancel}
	index := meta.LastIndex
	b.bg.Go(func() {
		for {
			kv, meta, err := b.cli.KV().Get(name, (&api.QueryOptions{WaitIndex: index, WaitTime: waitTime}).WithContext(wctx))
			if wctx.Err() != nil {
				return
			}
			if err != nil {
				if sleep(wctx, retryDelay) != nil {
					return
				}
				continue
			}
			switch {
			case meta.LastIndex == index:
				continue // the wait timed out
			case meta.LastIndex < index:
				index = 0 // the servers' index went back (a restore): start over
			default:
				index = meta.LastIndex
			}
			if kv == nil || kv.Session == "" {
				b.sawFree(name)
				select {
				case w.ch <- struct{}{}:
				default:
				}
			}
		}
	})
	return w, nil
}

// sawFree notes that name was seen free now: a lock-delay that an
// invalidated session set on it ends at the latest a lock-delay later.
func (b *Backend) sawFree(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.delays) > 4096 {
		clear(b.delays) // only a hint: bounded memory first
	}
	b.delays[name] = time.Now().Add(b.o.lockDelay)
}

// maxLossWatches bounds the loss watches a backend runs at once. Each is a
// blocking query, and so an HTTP/1.1 connection of its own, and Consul
// refuses more than http_max_conns_per_client (200 by default) connections
// from one address with 429 Too Many Requests, to every client on it: one
// watch per lock would make a process that holds hundreds of locks fail
// its own acquires and renewals. A lock beyond the bound is not watched:
// its lease learns of a loss at its next renewal, as on a backend without
// loss reports (package lock renews every TTL/3, and ends the lease at its
// deadline in any case).
const maxLossWatches = 16

// NotifyLoss implements backend.LossNotifier: a blocking query on the
// entry from the index of the grant (so that no read from before it
// counts) calls lost when the entry is deleted or locked by another
// session: released from outside, or its session destroyed or expired.
// At most maxLossWatches locks are watched at once; the others are not.
func (b *Backend) NotifyLoss(key, token string, fence uint64, lost func(error)) (stop func()) {
	b.mu.Lock()
	o := b.owned[token]
	b.mu.Unlock()
	if o == nil || b.closed.Load() {
		return func() {}
	}
	select {
	case b.lossWatches <- struct{}{}:
	default:
		return func() {} // the renewals will tell
	}
	name, sess := o.key, o.session
	// stop does not cancel the query in flight: that would close its
	// connection (HTTP/1.1), one per lease. A release changes the entry,
	// which ends the query at once; Close cancels the rest.
	var stopped atomic.Bool
	b.bg.Go(func() {
		defer func() { <-b.lossWatches }()
		index := fence
		for !stopped.Load() {
			kv, meta, err := b.cli.KV().Get(name, (&api.QueryOptions{WaitIndex: index, WaitTime: waitTime}).WithContext(b.ctx))
			if b.ctx.Err() != nil || stopped.Load() {
				return
			}
			if err != nil || meta.LastIndex <= fence {
				// No answer, or one from a state without the grant.
				if err != nil && sleep(b.ctx, retryDelay) != nil {
					return
				}
				continue
			}
			index = meta.LastIndex
			switch {
			case kv == nil:
				b.sawFree(name)
				lost(errors.New("consul: the lock's entry was deleted (released from outside, or its session destroyed or expired)"))
				return
			case kv.Session != sess:
				lost(fmt.Errorf("consul: the lock's entry is no longer held by its session %s", sess))
				return
			case tokenOf(kv.Value) != token:
				// Held by the same session for another lease: a
				// shared session's (sessions.go).
				lost(errors.New("consul: the lock's entry is held by another lease of its session"))
				return
			}
		}
	})
	return func() { stopped.Store(true) }
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
