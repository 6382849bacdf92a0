package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock/backend"
)

// Redlock is the lock over N independent Redis nodes (no replication between
// them): a lock is held when a majority of nodes (N/2+1) granted it within
// its validity. It implements backend.Backend, backend.Notifier,
// backend.Describer and backend.Inspector.
//
// Every request goes to all nodes in parallel, each bounded by the node
// timeout. Acquire fails, and releases whatever it got on every node, when
// fewer than a majority granted it, or when granting took so long that less
// than the drift allowance of the TTL was left. Renew needs a majority too.
// Package lock measures validity from the send time, so a lease's deadline
// already accounts for the time the quorum took.
//
// # Fencing tokens from a quorum counter
//
// Each node keeps a fence counter per key. Acquire reads the counters in the
// same script that takes each node's lock, picks F = 1 + the highest counter
// it read, and raises the counter to F (only upwards, and only where it holds
// the lock) on the nodes; the lock is granted with fence F only when a
// majority confirmed the raise. Why fences then strictly increase: let A be
// granted F_A, and B acquire after A. A raised the counters of a majority M_A
// to F_A while holding their locks. B holds the locks of a majority M_B, and
// on each node of M_B it took the lock after A's lock there was gone, so after
// A's raise. Two majorities share a node; there B read at least F_A, so
// F_B > F_A. This holds while the shared node kept its data.
//
// # A node that comes back empty
//
// A node that lost its data (restarted without persistence) has forgotten
// its locks and counters: the argument above then fails for exclusion and
// for fences alike, with a single node lost under a partial partition. So
// a node without its state key does not vote: it waits MaxTTL (WithMaxTTL)
// from when an acquire first found it so, and then adopts the highest fence
// counters of N-Q+1 other ready nodes before it votes again; see adopt.go
// for the argument. TTLs above MaxTTL are refused.
//
// # Safe configuration
//
// 3 or 5 independent standalone servers; on each, either appendfsync always
// (a restart keeps everything) or no persistence at all (save "" and
// appendonly no: a restart loses everything, which the node detects). Not
// appendfsync everysec or RDB snapshots: a node that comes back with its
// state but without its last writes cannot tell, and may grant a lock twice
// or repeat a fence. At most one node back empty at a time: the next may
// restart once the first votes again. A maxmemory policy that never evicts
// the lock keys (noeviction or volatile-*: the state key has no expiry). On
// a new deployment, call InitNewNodes once; otherwise the first locks wait
// MaxTTL. Node clocks may drift but must not jump forward (a node expires
// locks by its own clock). The peers' Redlock implementations offer no fence
// at all.
type Redlock struct {
	nodes    []Client
	batch    []*batcher // one per node
	quorum   int
	opts     options
	notify   *notifier
	closed   atomic.Bool
	adopting []atomic.Bool // per node: an adoption of fence counters runs
	bg       sync.WaitGroup
}

var (
	_ backend.Backend   = (*Redlock)(nil)
	_ backend.Notifier  = (*Redlock)(nil)
	_ backend.Describer = (*Redlock)(nil)
	_ backend.Inspector = (*Redlock)(nil)
)

// NewRedlock returns a Redlock over nodes, independent Redis servers (use an
// odd number, 3 or 5). Create their clients with ContextTimeoutEnabled, so
// that the node timeout also bounds a hung node's socket reads.
func NewRedlock(nodes []Client, opts ...Option) (*Redlock, error) {
	if len(nodes) == 0 {
		return nil, fmt.Errorf("%w: redis: Redlock needs at least one node; use 3 or 5 independent servers", backend.ErrInvalid)
	}
	subs := make([]Subscriber, len(nodes))
	for i, n := range nodes {
		if n == nil {
			return nil, fmt.Errorf("%w: redis: Redlock node %d is nil", backend.ErrInvalid, i)
		}
		subs[i] = n
	}
	o := defaultOptions()
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.nodeTimeout < 0 {
		return nil, fmt.Errorf("%w: redis: node timeout %v must be >= 0 (0: derived from the TTL)", backend.ErrInvalid, o.nodeTimeout)
	}
	if o.maxTTL < MinTTL {
		return nil, fmt.Errorf("%w: redis: maximum TTL %v must be at least %v", backend.ErrInvalid, o.maxTTL, MinTTL)
	}
	batch := make([]*batcher, len(nodes))
	for i, n := range nodes {
		batch[i] = newBatcher(n)
	}
	return &Redlock{nodes: slices.Clone(nodes), batch: batch, quorum: len(nodes)/2 + 1, opts: o, notify: newNotifier(subs...), adopting: make([]atomic.Bool, len(nodes))}, nil
}

var (
	// redlockAcquireScript: KEYS = lock, fence, dead token, node state;
	// ARGV = token, ttl ms, maximum TTL ms. On a node that is not ready
	// (see "A node that comes back empty") it returns {2, ms left to
	// wait} or, once the wait is over, {3, the node's incarnation}, and
	// changes nothing but the node state.
	// Returns {1, counter} when it took the lock, {0, pttl, counter,
	// holder's token} when another owner holds it (and marks the lock as
	// waited for, as the single-node script does). A request that finds
	// its own token (go-redis sent it again) sets the expiry to the TTL
	// from now, as a new grant would, and reports the token as holder.
	redlockAcquireScript = goredis.NewScript(`
local n = redis.call('GET', KEYS[4])
if n ~= 'ready' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if not n then
    n = t[1] .. '.' .. t[2]
    redis.call('SET', KEYS[4], n)
  end
  local since = tonumber(string.match(n, '^(%d+)')) * 1000 + math.floor(tonumber(string.match(n, '%.(%d+)$')) / 1000)
  local left = since + tonumber(ARGV[3]) - now
  if left > 0 then
    return {2, left}
  end
  return {3, n}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return redis.error_reply('DEAD token released before')
end
local c = tonumber(redis.call('GET', KEYS[2]) or '0')
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, c}
end
local v = redis.call('GET', KEYS[1])
if string.byte(v, -1) ~= 43 then
  if v == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {0, tonumber(ARGV[2]), c, v}
  end
  redis.call('APPEND', KEYS[1], '+')
else
  v = string.sub(v, 1, -2)
  if v == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
end
return {0, redis.call('PTTL', KEYS[1]), c, v}`)

	// raiseScript: KEYS = lock, fence; ARGV = token, fence.
	// Raises the counter to the fence if token holds the lock. Returns 1,
	// or 0 when token does not hold the lock.
	raiseScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] and v ~= ARGV[1] .. '+' then
  return 0
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1`)
)

// nodeTimeout returns the per-node bound for a request about a lock of ttl;
// ttl 0 for requests that do not know it (release, inspect).
func (r *Redlock) nodeTimeout(ttl time.Duration) time.Duration {
	switch {
	case r.opts.nodeTimeout > 0:
		return r.opts.nodeTimeout
	case ttl == 0:
		return 500 * time.Millisecond
	}
	return min(max(ttl/10, 10*time.Millisecond), time.Second)
}

// each runs f on every node in parallel, each call bounded by the node
// timeout for ttl, and returns the per-node errors.
func (r *Redlock) each(ctx context.Context, ttl time.Duration, f func(ctx context.Context, i int, n *batcher) error) []error {
	errs := make([]error, len(r.nodes))
	var wg sync.WaitGroup
	timeout := r.nodeTimeout(ttl)
	for i, n := range r.batch {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			errs[i] = f(nctx, i, n)
		})
	}
	wg.Wait()
	return errs
}

func (r *Redlock) check() error {
	if r.closed.Load() {
		return backend.ErrClosed
	}
	return nil
}

// releaseID returns a random id for one release, published to waiters.
func releaseID() string {
	return strconv.FormatUint(rand.Uint64(), 36)
}

// errLockedHere marks a node where another owner holds the lock.
var errLockedHere = errors.New("held by another owner")

// errNotReady marks a node that came back empty and does not vote yet.
var errNotReady = errors.New("node came back empty and does not vote yet")

// nodeKey is the key that records a node's state: "ready", or the
// incarnation (the server time when an acquire first found the node
// empty) while it waits.
func (r *Redlock) nodeKey() string { return r.opts.prefix + "redlock:node" }

func (r *Redlock) tooLong(ttl time.Duration) error {
	return fmt.Errorf("%w: redis: TTL %v is above this Redlock's maximum of %v (WithMaxTTL)", backend.ErrInvalid, ttl, r.opts.maxTTL)
}

// Acquire implements backend.Backend.
func (r *Redlock) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if err := r.check(); err != nil {
		return backend.Grant{}, err
	}
	start := time.Now()
	if ttl > r.opts.maxTTL {
		return backend.Grant{}, r.tooLong(ttl)
	}
	lk, fk := keys(r.opts.prefix, key)
	dk := deadKeyOf(lk, token)
	nk := r.nodeKey()
	maxMs := ms(r.opts.maxTTL)
	ch := channelOf(lk)
	counters := make([]int64, len(r.nodes))
	pttls := make([]int64, len(r.nodes))
	holders := make([]string, len(r.nodes))
	errs := r.each(ctx, ttl, func(ctx context.Context, i int, n *batcher) error {
		res, err := n.run(ctx, redlockAcquireScript, []string{lk, fk, dk, nk}, token, ms(ttl), maxMs).Slice()
		if err != nil {
			return err
		}
		if len(res) == 2 {
			switch code, _ := res[0].(int64); code {
			case 2:
				return errNotReady
			case 3:
				incarnation, _ := res[1].(string)
				r.adoptInBackground(i, incarnation)
				return errNotReady
			}
		}
		ints := make([]int64, min(len(res), 3))
		for j := range ints {
			ints[j], _ = res[j].(int64)
		}
		switch {
		case len(res) == 2 && ints[0] == 1:
			counters[i] = ints[1]
			return nil
		case len(res) == 4 && ints[0] == 0:
			pttls[i], counters[i] = ints[1], ints[2]
			holders[i], _ = res[3].(string)
			if holders[i] == token {
				return nil // a retry (by go-redis) of a request that took the node
			}
			return errLockedHere
		}
		return fmt.Errorf("unexpected script reply %v", res)
	})
	nGranted, unknown := 0, 0
	votes := map[string]int{}
	var fence int64
	var remaining time.Duration
	for i, err := range errs {
		switch {
		case err == nil:
			nGranted++
		case errors.Is(err, errLockedHere):
			votes[holders[i]]++
			remaining = max(remaining, time.Duration(pttls[i])*time.Millisecond)
		default:
			unknown++
			continue // a node that did not answer tells us nothing
		}
		fence = max(fence, counters[i])
	}
	fence++
	// Another owner may hold the key if it has, or may have, a majority.
	heldElsewhere := false
	for _, n := range votes {
		if n+unknown >= r.quorum {
			heldElsewhere = true
		}
	}

	if nGranted >= r.quorum {
		raised := 0
		rerrs := r.each(ctx, ttl, func(ctx context.Context, i int, n *batcher) error {
			if errs[i] != nil {
				return errs[i]
			}
			ok, err := n.run(ctx, raiseScript, []string{lk, fk}, token, fence).Int64()
			if err == nil && ok == 0 {
				err = errors.New("lock expired before the fence was raised")
			}
			return err
		})
		for _, err := range rerrs {
			if err == nil {
				raised++
			}
		}
		nGranted = raised
		validity := ttl - time.Since(start) - ttl/100 - 2*time.Millisecond
		if raised >= r.quorum && validity > 0 {
			return backend.Grant{Fence: uint64(fence), TTL: granted(ttl)}, nil
		}
		errs = rerrs
		if validity <= 0 {
			errs = append(errs, fmt.Errorf("quorum took %v of the %v TTL", time.Since(start).Round(time.Millisecond), ttl))
		}
	}

	// No quorum: undo what was taken, on every node (token-checked), on a
	// context that outlives ctx's end: nothing may be left behind.
	id := releaseID()
	r.each(context.WithoutCancel(ctx), ttl, func(ctx context.Context, i int, n *batcher) error {
		return n.run(ctx, releaseScript, []string{lk, dk}, token, deadMs, ch, id).Err()
	})
	switch {
	case heldElsewhere:
		return backend.Grant{}, backend.Locked(remaining)
	case len(votes) > 0 && ctx.Err() == nil:
		// Nobody has a majority, and concurrent attempts took the
		// nodes we lack: a split vote.
		return backend.Grant{}, fmt.Errorf("redis: redlock: %d of %d nodes granted, %d held by %d other contenders: %w", nGranted, len(r.nodes), len(r.nodes)-nGranted-unknown, len(votes), backend.ErrContended)
	}
	return backend.Grant{}, r.quorumErr("acquire", nGranted, errs, ctx)
}

func failures(errs []error) int {
	n := 0
	for _, err := range errs {
		if err != nil && !errors.Is(err, errLockedHere) {
			n++
		}
	}
	return n
}

// quorumErr describes a failure to reach a majority; it wraps the nodes'
// errors, and the context's when it ended.
func (r *Redlock) quorumErr(op string, ok int, errs []error, ctx context.Context) error {
	var nodeErrs []error
	for i, err := range errs {
		if err != nil && !errors.Is(err, errLockedHere) {
			if i < len(r.nodes) {
				err = fmt.Errorf("node %d: %w", i, err)
			}
			nodeErrs = append(nodeErrs, err)
		}
	}
	if cerr := ctx.Err(); cerr != nil {
		nodeErrs = append(nodeErrs, cerr)
	}
	return fmt.Errorf("redis: redlock %s: %d of %d nodes agreed, %d needed: %w", op, ok, len(r.nodes), r.quorum, errors.Join(nodeErrs...))
}

// Renew implements backend.Backend: a majority must still hold token's lock
// and extend it.
func (r *Redlock) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if err := r.check(); err != nil {
		return backend.Grant{}, err
	}
	if ttl > r.opts.maxTTL {
		return backend.Grant{}, r.tooLong(ttl)
	}
	lk, _ := keys(r.opts.prefix, key)
	notHeld := 0
	var mu sync.Mutex
	errs := r.each(ctx, ttl, func(ctx context.Context, i int, n *batcher) error {
		ok, err := n.run(ctx, renewScript, []string{lk}, token, ms(ttl)).Int64()
		if err == nil && ok == 0 {
			mu.Lock()
			notHeld++
			mu.Unlock()
			return backend.ErrNotHeld
		}
		return err
	})
	ok := len(r.nodes) - failures(errs) - notHeld
	switch {
	case ok >= r.quorum:
		return backend.Grant{TTL: granted(ttl)}, nil
	case notHeld > len(r.nodes)-r.quorum:
		return backend.Grant{}, backend.ErrNotHeld // a majority is gone for good
	}
	return backend.Grant{}, r.quorumErr("renew", ok, errs, ctx)
}

// Release implements backend.Backend: it deletes token's lock on every node.
func (r *Redlock) Release(ctx context.Context, key, token string) error {
	if err := r.check(); err != nil {
		return err
	}
	lk, _ := keys(r.opts.prefix, key)
	dk := deadKeyOf(lk, token)
	ch := channelOf(lk)
	var released, notHeld atomic.Int64
	id := releaseID()
	errs := r.each(ctx, 0, func(ctx context.Context, i int, n *batcher) error {
		k, err := n.run(ctx, releaseScript, []string{lk, dk}, token, deadMs, ch, id).Int64()
		switch {
		case err != nil:
			return err
		case k == 1:
			released.Add(1)
		default:
			notHeld.Add(1)
		}
		return nil
	})
	switch {
	case int(released.Load()) >= r.quorum:
		return nil
	case int(notHeld.Load()) > len(r.nodes)-r.quorum:
		return backend.ErrNotHeld
	}
	return r.quorumErr("release", int(released.Load()), errs, ctx)
}

// Inspect implements backend.Inspector: the holder is the token that holds a
// majority of nodes.
func (r *Redlock) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	if err := r.check(); err != nil {
		return backend.Holder{}, err
	}
	lk, fk := keys(r.opts.prefix, key)
	holders := make([]backend.Holder, len(r.nodes))
	errs := r.each(ctx, 0, func(ctx context.Context, i int, n *batcher) (err error) {
		holders[i], err = inspect(ctx, n.rdb, lk, fk)
		return err
	})
	votes := map[string][]backend.Holder{}
	for i, h := range holders {
		if errs[i] == nil && h.Held {
			votes[h.Token] = append(votes[h.Token], h)
		}
	}
	for token, hs := range votes {
		if len(hs) < r.quorum {
			continue
		}
		out := backend.Holder{Held: true, Token: token}
		rem := make([]time.Duration, 0, len(hs))
		for _, h := range hs {
			out.Fence = max(out.Fence, h.Fence)
			rem = append(rem, h.Remaining)
		}
		slices.Sort(rem)
		// The lock lasts while a majority of its nodes still hold it.
		out.Remaining = rem[len(rem)-r.quorum]
		return out, nil
	}
	if len(r.nodes)-failures(errs) < r.quorum {
		return backend.Holder{}, r.quorumErr("inspect", len(r.nodes)-failures(errs), errs, ctx)
	}
	return backend.Holder{}, nil
}

// Watch implements backend.Notifier: releases on any node wake waiters, once
// per release.
func (r *Redlock) Watch(ctx context.Context, key string) (backend.Watch, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	lk, _ := keys(r.opts.prefix, key)
	ch := channelOf(lk)
	return r.notify.watch(ctx, ch)
}

// Capabilities implements backend.Describer.
func (r *Redlock) Capabilities() backend.Capabilities {
	c := capabilities(r.opts)
	c.MaxTTL = r.opts.maxTTL
	return c
}

// Close stops the subscriptions; it closes the node clients only when the
// Redlock was opened from a URL.
func (r *Redlock) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return nil
	}
	r.notify.close()
	r.bg.Wait()
	var errs []error
	if r.opts.closeClients {
		for _, n := range r.nodes {
			if c, ok := n.(interface{ Close() error }); ok {
				errs = append(errs, c.Close())
			}
		}
	}
	return errors.Join(errs...)
}
