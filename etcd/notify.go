package etcd

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock/backend"
)

// QueueTTL is the TTL of the lease that keeps a waiter's queue record while
// its watch lasts: the etcd client keeps it alive (every third of it), and
// a waiter whose process dies or stalls longer than this leaves the queue.
// A dead waiter at the head of the queue holds the others up about this
// long (plus up to half a second, the leader's scan for expired leases)
// after a release.
const QueueTTL = 3 * time.Second

// watchSetupTimeout bounds the wait for the queue record; without a watch,
// package lock backs off and retries instead of waiting for wake-ups.
const watchSetupTimeout = 2 * time.Second

// revokeTimeout bounds the revoke of a watch's lease, and so the deletion
// of its queue record, when the watch ends; a lease not revoked expires
// after QueueTTL.
const revokeTimeout = 2 * time.Second

// notifier keeps the waiters' queue of each key this backend waits for.
//
// A waiter's watch puts a queue record for it under the key's queue prefix,
// attached to a lease of the watch's own that the etcd client keeps alive
// and that goes when the watch ends (so that a put still on its way then
// cannot bring the record back: it finds no lease). The
// record's value is the revision at which the store first saw the waiter
// wait (the acquire that found the key held wrote a key of its own, so
// that revision is unique), in fixed-width digits, so that records sort by
// value in arrival order. While a watch lasts, an acquire of this backend
// for the key succeeds only if the waiter's record still exists (the
// Jepsen etcd 3.4.3 finding: a waiter whose record vanished is never
// granted the lock from it) and no record sorts before it, and it deletes
// the record in the same transaction that takes the key; an acquire of a
// backend without a record succeeds only when nobody queues. Each waiter
// follows the queue and the lock key, and wakes its caller only when it is
// at the head and the key is deleted (a release or an expiry), or when it
// comes to the head: one wake-up per release, across processes. A waiter
// that leaves (its watch closed, its process dead, its lease expired)
// deletes its record, which makes the next one the head, and so passes its
// wake-up on. A waiter whose record vanished while it still waits queues
// again, at the back.
type notifier struct {
	cli *clientv3.Client
	wg  sync.WaitGroup // watch goroutines

	mu      sync.Mutex
	closed  bool
	watches map[*watch]struct{}
	queued  map[string]*watch // by lock key: the watch whose record this backend's acquires use
	failed  map[string]int64  // by lock key: the revision of the last acquire that found it held
}

// maxFailed bounds the failed map: entries of keys nobody waited for are
// dropped wholesale when it grows past it.
const maxFailed = 4096

func newNotifier(cli *clientv3.Client) *notifier {
	return &notifier{cli: cli, watches: map[*watch]struct{}{}, queued: map[string]*watch{}, failed: map[string]int64{}}
}

// watch is one waiter's place in a key's queue.
type watch struct {
	n       *notifier
	lockKey string
	qprefix string
	ch      chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	// recKey is the key of the waiter's record, the same each time it
	// queues, so that a put whose reply was lost and the put sent again
	// leave one record, not two.
	recKey string
	// lease keeps the record; alive is its keep-alive, closed when the
	// lease is lost. Used by run only.
	lease clientv3.LeaseID
	alive <-chan *clientv3.LeaseKeepAliveResponse
	lost  bool // alive was closed
	// The fields below are guarded by n.mu.
	gen      int    // counts the waiter's successful puts of its record; 0: none yet
	recValue string // the record's value after put gen
	consumed int    // the put whose record an acquire took the key with; 0: none
}

// queuePrefix returns the prefix of a key's queue records. The key's length
// comes first, so that one key's prefix is never another's.
func (b *Backend) queuePrefix(key string) string {
	return fmt.Sprintf("%sq/%d/%s/", b.opts.prefix, len(key), key)
}

// contentionKeyOf returns the key that a failed acquire writes, so that its
// revision is unique to it (see notifier).
func (b *Backend) contentionKeyOf(key string) string { return b.opts.prefix + "c/" + key }

// revValue formats a revision as a queue record value: fixed width, so that
// etcd's byte order of values is their numeric order.
func revValue(rev int64) string { return fmt.Sprintf("%020d", rev) }

// valueRev parses a queue record value.
func valueRev(v string) int64 {
	rev, _ := strconv.ParseInt(v, 10, 64)
	return rev
}

// queueGuard is what an acquire adds to its transaction for the queue.
type queueGuard struct {
	cmps   []clientv3.Cmp
	ops    []clientv3.Op // when it takes the key
	w      *watch        // the waiter whose record it takes the key with, or nil
	recKey string
	gen    int
}

// acquireGuard returns the conditions an acquire of lockKey adds to its
// transaction for the queue, and the operations it adds when it takes the
// key: with this backend's record, the record must exist and sort first,
// and goes; without one, the queue must be empty.
func (n *notifier) acquireGuard(lockKey, qprefix string) queueGuard {
	n.mu.Lock()
	w := n.queued[lockKey]
	var recKey, recValue string
	var gen int
	if w != nil && w.gen > 0 {
		recKey, recValue, gen = w.recKey, w.recValue, w.gen
	}
	n.mu.Unlock()
	if recKey == "" {
		return queueGuard{cmps: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(qprefix), "=", 0).WithPrefix()}}
	}
	return queueGuard{w: w, recKey: recKey, gen: gen, ops: []clientv3.Op{clientv3.OpDelete(recKey)}, cmps: []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(recKey), "=", recValue),
		// No record sorts before it: every value >= its own, which etcd
		// spells > its own minus one.
		clientv3.Compare(clientv3.Value(qprefix), ">", revValue(valueRev(recValue)-1)).WithPrefix(),
	}}
}

// took records that an acquire took the key with g's record, which went in
// the same transaction.
func (n *notifier) took(g queueGuard) {
	if g.w == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	g.w.consumed = g.gen
}

// tookWith reports whether an acquire took the key with the record of put
// gen, or with any record when gen is 0.
func (w *watch) tookWith(gen int) bool {
	w.n.mu.Lock()
	defer w.n.mu.Unlock()
	return w.consumed != 0 && (gen == 0 || w.consumed == gen)
}

// lockedAt records that an acquire of lockKey found it held at revision
// rev: a watch that follows queues the waiter from there.
func (n *notifier) lockedAt(lockKey string, rev int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.failed) >= maxFailed {
		clear(n.failed)
	}
	n.failed[lockKey] = rev
}

// Watch implements backend.Notifier: it puts the waiter in the key's queue
// (see the package doc) and returns once its record is in the store. The
// watch wakes the waiter once per release or expiry while it is at the
// head of the queue, and when it comes to the head with the key free.
func (b *Backend) Watch(ctx context.Context, key string) (backend.Watch, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	return b.notify.watch(ctx, b.lockKeyOf(key), b.queuePrefix(key))
}

func (n *notifier) watch(ctx context.Context, lockKey, qprefix string) (backend.Watch, error) {
	// The watch outlives ctx, which bounds only its setup.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	var id [8]byte
	crand.Read(id[:])
	w := &watch{n: n, lockKey: lockKey, qprefix: qprefix, recKey: qprefix + hex.EncodeToString(id[:]),
		ch: make(chan struct{}, 1), ctx: wctx, cancel: cancel}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		cancel()
		return nil, backend.ErrClosed
	}
	first, ok := n.failed[lockKey]
	delete(n.failed, lockKey)
	n.watches[w] = struct{}{}
	n.wg.Add(1)
	n.mu.Unlock()

	queued := make(chan error, 1)
	go w.run(first, ok, queued)
	t := time.NewTimer(watchSetupTimeout)
	defer t.Stop()
	var err error
	select {
	case err = <-queued:
	case <-ctx.Done():
		err = fmt.Errorf("etcd: watch: %w", ctx.Err())
	case <-t.C:
		err = errors.New("etcd: watch: the store did not queue the waiter in time")
	}
	if err != nil {
		w.Close(false)
		return nil, err
	}
	return w, nil
}

// run queues the waiter, reports on queued whether that worked, and then
// follows the queue until the watch ends, queueing again whenever the
// record vanishes while the waiter still waits, and watching and queueing
// again, in the same place, when a watch breaks (a leader change, a
// connection lost) or the store fails a request. On its way out it deletes
// the record, unless the acquire that took the key deleted it.
func (w *watch) run(firstRev int64, haveRev bool, queued chan<- error) {
	defer w.n.wg.Done()
	defer w.leave()
	value := ""
	if haveRev {
		value = revValue(firstRev)
	}
	reported := false
	backoff := retryMin
	for {
		if w.tookWith(0) {
			<-w.ctx.Done() // the waiter has the key: nothing to follow
			return
		}
		queue, lock, stop, err := w.watchQueue()
		for err == nil {
			var records map[string]string
			var rev int64
			records, rev, err = w.enqueue(value)
			if err != nil {
				break
			}
			if !reported {
				queued <- nil
				reported = true
			}
			backoff = retryMin
			var again bool
			value, again = w.follow(queue, lock, records, rev)
			if !again {
				break
			}
		}
		if stop != nil {
			stop()
		}
		if w.ctx.Err() != nil {
			return
		}
		if err != nil && !reported {
			queued <- err // Watch fails: package lock backs off instead
			return
		}
		// Not following the queue for a while: the waiter tries the
		// store meanwhile, and again after each retry.
		w.wake()
		select {
		case <-w.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, retryMax)
	}
}

// retryMin and retryMax bound the delay before a watch that lost the queue
// (a watch broke, the store failed a request) follows it again.
const (
	retryMin = 50 * time.Millisecond
	retryMax = time.Second
)

// watchQueue watches the queue and the deletions of the lock key from the
// store's current revision, and returns once etcd confirmed both: etcd
// serves such watches from its stream of new events, while a watch from an
// older revision waits for its periodic catch-up (a tenth of a second). The
// queue is read after, and the events it reflects are skipped.
func (w *watch) watchQueue() (queue, lock clientv3.WatchChan, stop func(), err error) {
	ctx, cancel := context.WithCancel(w.ctx)
	queue = w.n.cli.Watch(ctx, w.qprefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	lock = w.n.cli.Watch(ctx, w.lockKey, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	for _, ch := range []clientv3.WatchChan{queue, lock} {
		resp, ok := <-ch
		switch {
		case !ok:
			err = errors.New("etcd: watch: the watch ended before etcd confirmed it (the watch closed, or its client)")
		case resp.Err() != nil:
			err = fmt.Errorf("etcd: watch: %w", resp.Err())
		case !resp.Created:
			err = errors.New("etcd: watch: an event came before the watch was confirmed")
		}
		if err != nil {
			cancel()
			return nil, nil, nil, err
		}
	}
	return queue, lock, cancel, nil
}

// leave revokes the watch's lease, which deletes the waiter's record, if
// the acquire that took the key did not; a lease it cannot revoke (the
// store does not answer) expires after QueueTTL, its keep-alive ended.
func (w *watch) leave() {
	w.n.forget(w)
	if w.lease == clientv3.NoLease {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
	defer cancel()
	w.n.cli.Revoke(ctx, w.lease)
}

// ensureLease gives the watch a live lease for its record: the one it has,
// or a new one when it has none or lost it.
func (w *watch) ensureLease() error {
	if w.lease != clientv3.NoLease && !w.lost {
		select {
		case _, ok := <-w.alive:
			w.lost = !ok
		default:
		}
	}
	if w.lease != clientv3.NoLease && !w.lost {
		return nil
	}
	if w.lease != clientv3.NoLease {
		w.n.cli.Revoke(w.ctx, w.lease) // lost; revoked in case it was not
		w.lease = clientv3.NoLease
	}
	g, err := w.n.cli.Grant(w.ctx, int64(QueueTTL/time.Second))
	if err != nil {
		return err
	}
	w.lease = g.ID
	alive, err := w.n.cli.KeepAlive(w.ctx, g.ID)
	if err != nil {
		return err
	}
	w.alive, w.lost = alive, false
	return nil
}

// enqueue puts a record for the waiter with value (or the current revision
// when value is empty) under the watch's lease and reads the queue, in one
// transaction. It returns the queue by record key and the revision of the
// read.
func (w *watch) enqueue(value string) (map[string]string, int64, error) {
	cli := w.n.cli
	if err := w.ensureLease(); err != nil {
		return nil, 0, fmt.Errorf("etcd: watch: queue lease: %w", err)
	}
	if value == "" {
		// No acquire saw this waiter wait: to the back of the queue, at
		// the store's revision now (which others may share: a tie lets
		// either take the key first).
		now, err := cli.Get(w.ctx, w.lockKey, clientv3.WithCountOnly())
		if err != nil {
			return nil, 0, fmt.Errorf("etcd: watch: queue record: %w", err)
		}
		value = revValue(now.Header.Revision + 1)
	}
	put := func() (*clientv3.TxnResponse, error) {
		return cli.Txn(w.ctx).Then(
			clientv3.OpPut(w.recKey, value, clientv3.WithLease(w.lease)),
			clientv3.OpGet(w.qprefix, clientv3.WithPrefix()),
		).Commit()
	}
	resp, err := put()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The lease is gone (revoked, or expired while this process
		// stalled) before its keep-alive noticed; the transaction did
		// nothing. Take a new one.
		w.lost = true
		if err := w.ensureLease(); err != nil {
			return nil, 0, fmt.Errorf("etcd: watch: queue lease: %w", err)
		}
		resp, err = put()
	}
	if err != nil {
		return nil, 0, fmt.Errorf("etcd: watch: queue record: %w", err)
	}
	w.n.mu.Lock()
	w.gen++
	w.recValue = value
	if w.ctx.Err() == nil { // not closed meanwhile (Close forgets it under the lock)
		w.n.queued[w.lockKey] = w
	}
	w.n.mu.Unlock()
	kvs := resp.Responses[1].GetResponseRange().Kvs
	records := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		records[string(kv.Key)] = string(kv.Value)
	}
	return records, resp.Header.Revision, nil
}

// follow follows the queue and the lock key with their watches, from the
// queue as records has it at revision rev, and wakes the waiter when it is
// at the head and the key is deleted, or when it comes to the head and the
// key is free. It returns when the watch ends or a watch broke (again
// false), or when the waiter's record vanished while it still waits, with
// the value to queue again with (again true).
func (w *watch) follow(queue, lock clientv3.WatchChan, records map[string]string, rev int64) (next string, again bool) {
	w.n.mu.Lock()
	me, mine, gen := w.recKey, w.recValue, w.gen
	w.n.mu.Unlock()
	head := isHead(records, me)
	alive := w.alive
	if w.lost {
		alive = nil
	}
	for {
		select {
		case <-w.ctx.Done():
			return mine, false
		case _, ok := <-alive:
			if !ok {
				alive, w.lost = nil, true // the record's deletion follows, and a new lease then
			}
		case resp, ok := <-queue:
			if !ok || resp.Err() != nil {
				return mine, false
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision <= rev {
					continue // the queue as read already has it
				}
				key := string(ev.Kv.Key)
				if ev.Type == mvccpb.PUT {
					records[key] = string(ev.Kv.Value)
					if key == me && string(ev.Kv.Value) != mine {
						// A put of an earlier place, late: put
						// the record right again.
						return mine, false
					}
					continue
				}
				delete(records, key)
				if key != me {
					continue
				}
				if w.tookWith(gen) || w.tookKey(ev.Kv.ModRevision) {
					<-w.ctx.Done() // the record went with the acquire that took the key
					return mine, false
				}
				return revValue(ev.Kv.ModRevision), true // vanished: to the back
			}
			if now := isHead(records, me); now && !head {
				// At the head now: the key may be free (the waiter
				// before left without it) or held (it took it).
				if !w.keyHeld() {
					w.wake()
				}
				head = true
			} else {
				head = now
			}
		case resp, ok := <-lock:
			if !ok || resp.Err() != nil {
				return mine, false
			}
			for _, ev := range resp.Events {
				if head && ev.Kv.ModRevision > rev {
					w.wake()
				}
			}
		}
	}
}

// tookKey reports whether the waiter's record was deleted at revision rev
// by an acquire of this backend, which takes the key in the same
// transaction: for when the watch sees the deletion before the acquire's
// reply came (tookWith). If the key changed hands again meanwhile, the
// waiter queues again, and the record goes when the watch closes.
func (w *watch) tookKey(rev int64) bool {
	resp, err := w.n.cli.Get(w.ctx, w.lockKey)
	return err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == rev
}

// keyHeld reports whether the lock key is held: a read that saves the
// waiter an acquire bound to fail when it comes to the head behind a
// waiter that took the key. Any deletion after the read reaches the
// waiter's watch of the key, which is older.
func (w *watch) keyHeld() bool {
	resp, err := w.n.cli.Get(w.ctx, w.lockKey, clientv3.WithCountOnly())
	return err == nil && resp.Count > 0
}

// isHead reports whether me sorts first in the queue, by value and then by
// key.
func isHead(records map[string]string, me string) bool {
	mine, ok := records[me]
	if !ok {
		return false
	}
	for k, v := range records {
		if v < mine || v == mine && k < me {
			return false
		}
	}
	return true
}

func (w *watch) wake() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// C implements backend.Watch.
func (w *watch) C() <-chan struct{} { return w.ch }

// Close implements backend.Watch: the waiter leaves the queue (its record
// is deleted in the background, unless the acquire that took the key
// deleted it), which makes the next waiter the head and wakes it: a waiter
// that leaves without the key passes its wake-up on.
func (w *watch) Close(took bool) error {
	w.cancel()
	w.n.forget(w)
	return nil
}

// forget stops this backend's acquires from using w's record.
func (n *notifier) forget(w *watch) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.watches, w)
	if n.queued[w.lockKey] == w {
		delete(n.queued, w.lockKey)
	}
}

// close ends every watch and waits for their goroutines, which revoke their
// leases, so that no record of this backend is left behind.
func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	for w := range n.watches {
		w.cancel()
	}
	n.mu.Unlock()
	n.wg.Wait()
}
