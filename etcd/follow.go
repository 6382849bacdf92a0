package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock/backend"
)

// Each backend follows the keys it waits for with one watch per key over
// the lock key and its queue (they share a prefix, so that the events of
// one transaction arrive together), which stays up a while after the last
// waiter left (followerLinger), so that this backend's release of the key
// knows the head of the queue. A release by a backend that does not follow
// the key deletes it; the head's watch then wakes it, and its acquire takes
// the key. The follower tells this backend's places what it sees: a
// handover to one of them, a record that vanished, a key freed with a
// place at the head.

// followerLinger is how long a backend keeps following a key after its
// last waiter for it left: a release in that time hands the lock over.
const followerLinger = 10 * time.Second

// retryMin and retryMax bound the delay before a follower whose watch broke
// (a leader change, a connection lost) watches again.
const (
	retryMin = 50 * time.Millisecond
	retryMax = time.Second
)

// queues is the backend's followers of the keys its places wait for, and
// the places of Watch.
type queues struct {
	b  *Backend
	wg sync.WaitGroup // followers

	mu      sync.Mutex
	closed  bool
	fs      map[string]*follower // by lock key
	watched map[string]*place    // by lock key: the place of a Watch, which Backend.Acquire uses

	refusable func() bool // tests: overrides the follower's prediction
}

func newQueues(b *Backend) *queues {
	return &queues{b: b, fs: map[string]*follower{}, watched: map[string]*place{}}
}

// follower follows one lock key and its queue for this backend.
type follower struct {
	qs      *queues
	lockKey string
	qprefix string
	ctx     context.Context
	cancel  context.CancelFunc
	ready   chan struct{} // closed once the view is current the first time

	// Guarded by qs.mu.
	current bool // the view below is current (the watch runs)
	lk      kvState
	records map[string]record
	places  map[*place]struct{}
	linger  *time.Timer
}

type kvState struct {
	exists bool
	value  string
	mod    int64
	lease  int64
}

type record struct {
	token  string
	create int64
	mod    int64
	lease  int64
}

// followerLocked returns the follower of lockKey, started if need be.
// qs.mu must be held.
func (qs *queues) followerLocked(key, lockKey string) *follower {
	if f := qs.fs[lockKey]; f != nil {
		if f.linger != nil {
			f.linger.Stop()
			f.linger = nil
		}
		return f
	}
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	f := &follower{qs: qs, lockKey: lockKey, qprefix: qs.b.queuePrefix(key), ctx: ctx, cancel: cancel,
		ready: make(chan struct{}), records: map[string]record{}, places: map[*place]struct{}{}}
	qs.fs[lockKey] = f
	qs.wg.Add(1)
	go f.run()
	return f
}

// lingerLocked stops f after followerLinger unless a place comes meanwhile.
// qs.mu must be held.
func (f *follower) lingerLocked() {
	if len(f.places) > 0 || f.linger != nil {
		return
	}
	f.linger = time.AfterFunc(followerLinger, func() {
		f.qs.mu.Lock()
		defer f.qs.mu.Unlock()
		if len(f.places) == 0 && f.qs.fs[f.lockKey] == f {
			delete(f.qs.fs, f.lockKey)
			f.cancel()
		}
	})
}

// watchedPlace returns the place of a Watch of lockKey, or nil.
func (qs *queues) watchedPlace(lockKey string) *place {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return qs.watched[lockKey]
}

// run follows the key until the follower stops, watching again when the
// watch breaks.
func (f *follower) run() {
	defer f.qs.wg.Done()
	backoff := retryMin
	for f.ctx.Err() == nil {
		err := f.follow()
		f.qs.mu.Lock()
		f.current = false
		for p := range f.places {
			p.q.Wake() // without wake-ups the waiter tries the store itself
		}
		f.qs.mu.Unlock()
		if f.ctx.Err() != nil {
			return
		}
		if err == nil {
			backoff = retryMin
		}
		select {
		case <-f.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, retryMax)
	}
}

// follow watches the lock key and its queue (one prefix) from the store's
// current revision, reads them once etcd confirmed the watch (a watch from
// an older revision waits for etcd's periodic catch-up, a tenth of a
// second), and then applies the events after the read until the watch
// breaks.
func (f *follower) follow() error {
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	cli := f.qs.b.cli
	ch := cli.Watch(ctx, f.lockKey, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	resp, ok := <-ch
	switch {
	case !ok:
		return errors.New("etcd: watch: the watch ended before etcd confirmed it")
	case resp.Err() != nil:
		return fmt.Errorf("etcd: watch: %w", resp.Err())
	case !resp.Created:
		return errors.New("etcd: watch: an event came before the watch was confirmed")
	}
	read, err := cli.Get(ctx, f.lockKey, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	rev := read.Header.Revision
	f.qs.mu.Lock()
	f.lk = kvState{}
	clear(f.records)
	for _, kv := range read.Kvs {
		f.applyLocked(&clientv3.Event{Type: mvccpb.PUT, Kv: kv})
	}
	f.current = true
	f.settleLocked()
	f.qs.mu.Unlock()
	select {
	case <-f.ready:
	default:
		close(f.ready)
	}
	for {
		resp, ok := <-ch
		if !ok {
			return errors.New("etcd: watch: the watch ended")
		}
		if err := resp.Err(); err != nil {
			return err
		}
		f.qs.mu.Lock()
		for _, ev := range resp.Events {
			if ev.Kv.ModRevision > rev {
				f.applyLocked(ev)
			}
		}
		f.settleLocked()
		f.qs.mu.Unlock()
	}
}

// applyLocked applies one event to the view, and tells this backend's
// places what concerns them. qs.mu must be held.
func (f *follower) applyLocked(ev *clientv3.Event) {
	kv := ev.Kv
	key := string(kv.Key)
	if key == f.lockKey {
		if ev.Type == mvccpb.DELETE {
			f.lk = kvState{}
			return
		}
		f.lk = kvState{exists: true, value: string(kv.Value), mod: kv.ModRevision, lease: kv.Lease}
		for p := range f.places {
			p.handedLocked(f.lk)
		}
		return
	}
	if len(key) <= len(f.qprefix) || key[:len(f.qprefix)] != f.qprefix {
		return // not a record of this key's queue
	}
	if ev.Type == mvccpb.DELETE {
		delete(f.records, key)
	} else {
		f.records[key] = record{token: string(kv.Value), create: kv.CreateRevision, mod: kv.ModRevision, lease: kv.Lease}
	}
	for p := range f.places {
		if p.recKey == key {
			p.recordLocked(ev)
		}
	}
}

// settleLocked wakes this backend's place at the head of the queue when
// the key is free: it came to the head, or the key was released or
// expired while it was there; and places not queued yet when the key
// becomes free. qs.mu must be held.
func (f *follower) settleLocked() {
	head, _, ok := f.headLocked()
	for p := range f.places {
		// A place without a record (a Watch before its first attempt)
		// is woken as the key becomes free, as a Notifier's watch is.
		mine := p.create == 0 || ok && head == p.recKey
		if !mine || p.handed || p.took || f.lk.exists {
			p.headWoken = false
			continue
		}
		if !p.headWoken {
			p.headWoken = true
			p.q.Wake()
		}
	}
}

// headLocked returns the record that comes first in the queue. qs.mu must
// be held.
func (f *follower) headLocked() (string, record, bool) {
	var hk string
	var h record
	for k, r := range f.records {
		if hk == "" || r.create < h.create || r.create == h.create && k < hk {
			hk, h = k, r
		}
	}
	return hk, h, hk != ""
}

// head returns the head of lockKey's queue, when this backend follows the
// key and its view is current, and keeps following it a while longer.
func (qs *queues) head(lockKey string) (string, record, bool) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	f := qs.fs[lockKey]
	if f == nil || !f.current {
		return "", record{}, false
	}
	if f.linger != nil && len(f.places) == 0 {
		f.linger.Reset(followerLinger)
	}
	return f.headLocked()
}

// handedLocked reports a handover to p: the lock key now holds a token on
// p's lease. The queue checks that the token is one of p's. qs.mu must be
// held.
func (p *place) handedLocked(lk kvState) {
	if p.closed || p.took || p.handed || lk.lease != int64(p.lease) || p.lease == clientv3.NoLease {
		return
	}
	if p.q.Handoff(lk.value, backend.Grant{Fence: uint64(lk.mod), TTL: time.Duration(p.secs) * time.Second}) {
		p.handed = true
		p.create = 0 // the handover deleted the record
	}
}

// recordLocked follows p's record: a deletion that is not the handover's
// (whose put of the lock key came first in the same transaction) or an
// acquire's of p's (which then reports it) means the record vanished.
// qs.mu must be held.
func (p *place) recordLocked(ev *clientv3.Event) {
	rev := ev.Kv.ModRevision
	if rev <= p.recRev {
		return // p knows a later state
	}
	p.recRev = rev
	if ev.Type == mvccpb.PUT {
		p.create = ev.Kv.CreateRevision
		return
	}
	p.create = 0
	if !p.handed && !p.took {
		p.q.Vanished() // the waiter queues again, at the back
	}
}

// close ends every follower and waits for them and for the revokes of
// leaving waiters.
func (qs *queues) close() {
	qs.mu.Lock()
	qs.closed = true
	for _, f := range qs.fs {
		f.cancel()
		if f.linger != nil {
			f.linger.Stop()
		}
	}
	qs.mu.Unlock()
	qs.wg.Wait()
}
