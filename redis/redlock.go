package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
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
// timeout, and a call returns as soon as the answers so far decide it: a
// majority granted, or too few nodes are left to grant. A dead or hung
// node costs a call nothing while a majority answers; its request goes on
// in the background, bounded by the node timeout, and Close waits for it.
// Acquire fails, and releases whatever it got on every node, when
// fewer than a majority granted it, or when granting took so long that less
// than the drift allowance of the TTL was left. When nobody else holds the
// key and the nodes answered, so that the attempt failed only for a split
// vote or for a majority that came too late, its error wraps
// backend.ErrContended, and package lock tries again. Renew needs a
// majority too.
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
// M_B is the set of nodes whose grants decided the attempt (a majority): B
// reads its fence from exactly those. A node that grants later is raised
// too when it answers in time (raising only upwards where B holds the lock
// is always safe), or its lock is left to the lease, renewed and released
// with it, or released at once when the attempt failed.
//
// With WithSlotFenceCounters the counter is the key's hash slot's (see the
// package doc): the same argument holds for it, since a slot's counter
// also only goes up, and the raise lifts it above a per-key counter left
// by the default mode.
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
	nodes    []Conn
	batch    []*batcher // one per node
	quorum   int
	opts     options
	notify   *notifier
	closed   atomic.Bool
	adopting []atomic.Bool // per node: an adoption of fence counters runs

	bgMu     sync.Mutex
	bgClosed bool           // Close has begun: no more background work
	bg       sync.WaitGroup // background work (see track); Close waits
}

// track counts n goroutines about to start as background work that Close
// waits for, and reports false, counting nothing, once Close has begun.
func (r *Redlock) track(n int) bool {
	r.bgMu.Lock()
	defer r.bgMu.Unlock()
	if r.bgClosed {
		return false
	}
	r.bg.Add(n)
	return true
}

var (
	_ backend.Backend   = (*Redlock)(nil)
	_ backend.Notifier  = (*Redlock)(nil)
	_ backend.Describer = (*Redlock)(nil)
	_ backend.Inspector = (*Redlock)(nil)
)

// NewRedlock returns a Redlock over nodes, independent Redis servers (use an
// odd number, 3 or 5). Fewer than MinNodes are refused unless
// WithAllowFewNodes says otherwise, and so are two go-redis clients of the
// same address (compared as given; lock.Open also resolves host names).
// The node timeout bounds each node's request whatever the clients'
// options; clients with ContextTimeoutEnabled do it without a goroutine
// per request.
func NewRedlock(nodes []Conn, opts ...Option) (*Redlock, error) {
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
	if len(nodes) < MinNodes && !o.fewNodes {
		return nil, fmt.Errorf("%w: redis: a Redlock over %d node(s) survives the loss of none; use 3 or 5 independent servers, or allow it with WithAllowFewNodes (URL parameter allowfewnodes=true)", backend.ErrInvalid, len(nodes))
	}
	if err := distinctClients(nodes); err != nil {
		return nil, err
	}
	if o.nodeTimeout < 0 {
		return nil, fmt.Errorf("%w: redis: node timeout %v must be >= 0 (0: derived from the TTL)", backend.ErrInvalid, o.nodeTimeout)
	}
	if err := checkMaxTTL(o.maxTTL); err != nil {
		return nil, err
	}
	if o.nodeTimeout > o.maxTTL {
		return nil, fmt.Errorf("%w: redis: node timeout %v must be at most the maximum TTL %v (WithMaxTTL): a node's request may not outlast every lease", backend.ErrInvalid, o.nodeTimeout, o.maxTTL)
	}
	batch := make([]*batcher, len(nodes))
	for i, n := range nodes {
		batch[i] = newBatcher(n, o.ownClients)
	}
	return &Redlock{nodes: slices.Clone(nodes), batch: batch, quorum: len(nodes)/2 + 1, opts: o, notify: newNotifier(o.ownClients, subs...), adopting: make([]atomic.Bool, len(nodes))}, nil
}

// distinctClients returns an error wrapping ErrInvalid when two nodes are
// go-redis clients of the same address (compared as given, without
// resolving names: lock.Open resolves them), or the same client.
func distinctClients(nodes []Conn) error {
	seen := map[string]int{}
	for i, n := range nodes {
		c, ok := n.(*goredis.Client)
		if !ok {
			continue // a client kind whose address is not at hand
		}
		o := c.Options()
		if o.Addr == "FailoverClient" {
			continue // go-redis's placeholder for a Sentinel client
		}
		network := o.Network
		if network == "" {
			network = "tcp"
		}
		addr := network + " " + strings.ToLower(o.Addr)
		if j, dup := seen[addr]; dup {
			return fmt.Errorf("%w: redis: Redlock nodes %d and %d are the same server (%s); a Redlock needs independent servers, so that no one server makes a majority", backend.ErrInvalid, j, i, o.Addr)
		}
		seen[addr] = i
	}
	return nil
}

var (
	// redlockAcquireScript: KEYS = lock, fence, dead token, node state,
	// holder key (see label.go)[, the slot's fence counter]; ARGV =
	// token, ttl ms, maximum TTL ms, the label ('' for none). The counter
	// it reports is the higher of the key's and the slot's. On a node that is not ready
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
if KEYS[6] then
  c = math.max(c, tonumber(redis.call('GET', KEYS[6]) or '0'))
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[4] and ARGV[4] ~= '' then
    redis.call('SET', KEYS[5], ARGV[1] .. ' ' .. ARGV[4], 'PX', ARGV[2])
  end
  return {1, c}
end
local v = redis.call('GET', KEYS[1])
local mine = false
if string.byte(v, -1) ~= 43 then
  if v == ARGV[1] then
    mine = true
  else
    redis.call('APPEND', KEYS[1], '+')
  end
else
  v = string.sub(v, 1, -2)
  mine = v == ARGV[1]
end
if mine then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[5], ARGV[2])
  if KEYS[6] then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
end
return {0, redis.call('PTTL', KEYS[1]), c, v}`)

	// raiseScript: KEYS = lock, fence[, the slot's fence counter]; ARGV
	// = token, fence. Raises the counter to the fence if token holds the
	// lock. Returns 1, or 0 when token does not hold the lock. With the
	// slot's counter, it raises that (above a per-key counter left by the
	// default mode, too), and the fence key records the holder's fence,
	// with the lock's expiry.
	raiseScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] and v ~= ARGV[1] .. '+' then
  return 0
end
local f = tonumber(ARGV[2])
if KEYS[3] then
  local top = math.max(f, tonumber(redis.call('GET', KEYS[2]) or '0'))
  if tonumber(redis.call('GET', KEYS[3]) or '0') < top then
    redis.call('SET', KEYS[3], top)
  end
  local p = redis.call('PTTL', KEYS[1])
  if p > 0 then
    redis.call('SET', KEYS[2], f, 'PX', p)
  end
  return 1
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < f then
  redis.call('SET', KEYS[2], f)
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

// errNodeTimeout reports a node that did not answer within the node
// timeout.
var errNodeTimeout = errors.New("no answer within the node timeout")

// errPending stands for a node that had not answered when the outcome of a
// call was decided (or when the caller's context ended).
var errPending = errors.New("no answer yet when the outcome was decided")

// gather runs f on every node in parallel and returns the per-node errors
// as soon as the outcome is known: when decided (given the answers so far,
// and errPending for each node still out) says so, when every node has
// answered, or when ctx ends. A node that has not answered then reads
// errPending: one dead or hung node does not hold up a call that a
// majority has decided. The round tells later what every node answered.
//
// Each node's request is bounded by the node timeout for ttl and is not cut
// short by ctx's end (its context keeps ctx's values): a request already on
// its way may still take effect, so its outcome is still wanted. Requests
// of nodes that had not answered go on in the background; late, if not
// nil, receives each one's outcome there. Close waits for them.
func (r *Redlock) gather(ctx context.Context, ttl time.Duration, f func(ctx context.Context, i int, n *batcher) error, decided func(errs []error) bool, late func(i int, err error)) ([]error, *round) {
	return r.gatherWithin(ctx, r.nodeTimeout(ttl), f, decided, late)
}

// gatherWithin is gather with the node timeout given.
func (r *Redlock) gatherWithin(ctx context.Context, timeout time.Duration, f func(ctx context.Context, i int, n *batcher) error, decided func(errs []error) bool, late func(i int, err error)) ([]error, *round) {
	rd := &round{errs: make([]error, len(r.nodes)), done: make([]chan struct{}, len(r.nodes))}
	errs := make([]error, len(r.nodes))
	if !r.track(len(r.batch)) {
		for i := range errs {
			errs[i] = backend.ErrClosed
			rd.errs[i] = backend.ErrClosed
			rd.done[i] = make(chan struct{})
			close(rd.done[i])
		}
		return errs, rd
	}
	answered := make(chan int, len(r.nodes))
	base := context.WithoutCancel(ctx)
	for i, n := range r.batch {
		rd.done[i] = make(chan struct{})
		go func() {
			defer r.bg.Done()
			nctx, cancel := context.WithTimeout(base, timeout)
			err := f(nctx, i, n)
			cancel()
			if err != nil && nctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
				// The node timeout, not the caller's deadline: say
				// so, without wrapping context.DeadlineExceeded,
				// which tells a caller that its own time ran out.
				err = fmt.Errorf("%w (%v)", errNodeTimeout, timeout)
			}
			rd.errs[i] = err
			close(rd.done[i])
			answered <- i
		}()
	}
	for i := range errs {
		errs[i] = errPending
	}
	pending := len(errs)
wait:
	for pending > 0 && (decided == nil || !decided(errs)) {
		select {
		case i := <-answered:
			errs[i] = rd.errs[i]
			pending--
		case <-ctx.Done():
			break wait
		}
	}
	if pending > 0 && late != nil && r.track(1) {
		go func() {
			defer r.bg.Done()
			for range pending {
				i := <-answered
				late(i, rd.errs[i])
			}
		}()
	}
	return errs, rd
}

// A round is one request to every node (see gather).
type round struct {
	errs []error         // errs[i] is node i's answer, set before done[i] is closed
	done []chan struct{} // closed when node i answered
}

// await returns node i's answer, waiting for it until ctx ends.
func (rd *round) await(ctx context.Context, i int) error {
	select {
	case <-rd.done[i]:
		return rd.errs[i]
	case <-ctx.Done():
		return fmt.Errorf("no answer to the acquire in time: %w", ctx.Err())
	}
}

// count returns how many of errs are nil, match target (with errors.Is),
// and are errPending.
func count(errs []error, target error) (ok, matched, pending int) {
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case err == errPending:
			pending++
		case target != nil && errors.Is(err, target):
			matched++
		}
	}
	return ok, matched, pending
}

// majorityDecided returns the decision rule of a call that succeeds on a
// majority of nodes, fails with notHere (ErrNotHeld, say) on more than a
// minority, and otherwise fails: decided once pending answers cannot
// change which of the three it is.
func (r *Redlock) majorityDecided(notHere error) func(errs []error) bool {
	n, q := len(r.nodes), r.quorum
	return func(errs []error) bool {
		ok, not, pending := count(errs, notHere)
		return ok >= q || not > n-q || (ok+pending < q && not+pending <= n-q)
	}
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

// errExpiredBeforeRaise marks a node that granted an attempt but whose lock
// had expired when the attempt's fence was to be raised there: the grant
// came later than the TTL.
var errExpiredBeforeRaise = errors.New("lock expired before the fence was raised")

// errNotReady marks a node that came back empty and does not vote yet.
var errNotReady = errors.New("node came back empty and does not vote yet")

// nodeKey is the key that records a node's state: "ready", or the
// incarnation (the server time when an acquire first found the node
// empty) while it waits.
func (r *Redlock) nodeKey() string { return r.opts.prefix + "redlock:node" }

func (r *Redlock) tooLong(ttl time.Duration) error {
	return fmt.Errorf("%w: redis: TTL %v is above this Redlock's maximum of %v (WithMaxTTL, URL parameter maxttl)", backend.ErrInvalid, ttl, r.opts.maxTTL)
}

// Acquire implements backend.Backend.
//
// It returns as soon as a majority has decided: a majority granted and then
// confirmed the fence, or too few nodes are left to grant. A majority that
// granted and answered the fence's raise later than the TTL (less drift)
// leaves no validity: Acquire undoes its grants and, once the nodes that
// granted have answered the undo, returns an error wrapping
// backend.ErrContended that says the quorum came too late. A node that
// answers later is handled in the background: a grant that comes too late
// for a failed attempt is released; one that comes after a successful
// attempt belongs to the lease (its renewals and its release go to every
// node), and an empty node's answer still starts its adoption of fence
// counters.
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
	id := releaseID()
	hk := holderKeyOf(lk)
	label := backend.Label(ctx)
	release := func(ctx context.Context, n *batcher) error {
		return n.run(ctx, releaseScript, []string{lk, dk, hk}, token, deadMs, ch, id).Err()
	}

	// The attempt's result, for nodes that answer after it returned.
	result := struct {
		done    chan struct{}
		granted bool // set before done is closed
	}{done: make(chan struct{})}
	defer close(result.done)
	lateGrant := func(i int, err error) {
		if err != nil {
			return
		}
		<-result.done
		if result.granted {
			return // part of the lease
		}
		nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.nodeTimeout(ttl))
		defer cancel()
		_ = release(nctx, r.batch[i])
	}

	acquireKeys, raiseKeys := []string{lk, fk, dk, nk, hk}, []string{lk, fk}
	if sk := r.opts.slotFenceKey(lk); sk != "" {
		acquireKeys, raiseKeys = append(acquireKeys, sk), append(raiseKeys, sk)
	}
	counters := make([]int64, len(r.nodes))
	pttls := make([]int64, len(r.nodes))
	holders := make([]string, len(r.nodes))
	first, firstRound := r.gather(ctx, ttl, func(ctx context.Context, i int, n *batcher) error {
		res, err := n.run(ctx, redlockAcquireScript, acquireKeys, token, ms(ttl), maxMs, label).Slice()
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
	}, func(errs []error) bool {
		ok, _, pending := count(errs, nil)
		if ok >= r.quorum || ok+pending >= r.quorum {
			return ok >= r.quorum // granted, or a majority still possible
		}
		// No majority for this attempt. Another owner holds the key if
		// it has a majority of the answers already; nobody does if no
		// owner can reach one with every node still out. Otherwise the
		// nodes still out decide between the two (one of them may be
		// this attempt's own, which would make it a split vote): wait
		// for them, so that "locked" is not answered for a key nobody
		// holds.
		votes := map[string]int{}
		for i, err := range errs {
			if errors.Is(err, errLockedHere) {
				votes[holders[i]]++
			}
		}
		for _, n := range votes {
			if n >= r.quorum {
				return true
			}
		}
		for _, n := range votes {
			if n+pending >= r.quorum {
				return false
			}
		}
		return true
	}, lateGrant)
	nGranted, unknown := 0, 0
	votes := map[string]int{}
	var fence int64
	var remaining time.Duration
	for i, err := range first {
		switch {
		case err == nil:
			nGranted++
		case errors.Is(err, errLockedHere):
			votes[holders[i]]++
			remaining = max(remaining, time.Duration(pttls[i])*time.Millisecond)
		default:
			unknown++ // a node that did not answer (yet) tells us nothing
			continue
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

	errs := first
	var took time.Duration // the time the quorum took, when it was reached
	tooLate := false       // a majority granted, but later than the TTL
	if nGranted >= r.quorum {
		// Raise the fence on the nodes that granted, including those
		// that grant while this runs: raising a counter is safe on any
		// node where the token holds the lock, and a majority was read
		// for the fence (see "Fencing tokens from a quorum counter").
		rerrs, _ := r.gather(ctx, ttl, func(ctx context.Context, i int, n *batcher) error {
			if err := firstRound.await(ctx, i); err != nil {
				return err
			}
			ok, err := n.run(ctx, raiseScript, raiseKeys, token, fence).Int64()
			if err == nil && ok == 0 {
				err = errExpiredBeforeRaise
			}
			return err
		}, r.majorityDecided(nil), nil)
		raised, expired, _ := count(rerrs, errExpiredBeforeRaise)
		nGranted = raised
		took = time.Since(start)
		validity := ttl - took - ttl/100 - 2*time.Millisecond
		if raised >= r.quorum && validity > 0 {
			result.granted = true
			return backend.Grant{Fence: uint64(fence), TTL: granted(ttl)}, nil
		}
		errs = rerrs
		if validity <= 0 {
			errs = append(errs, fmt.Errorf("quorum took %v of the %v TTL", took.Round(time.Millisecond), ttl))
			// A majority answered the raise (raised, or its lock
			// had expired already): the nodes answer, and granted
			// this attempt, but too late to hold the lock.
			tooLate = raised+expired >= r.quorum
		}
	}

	// No quorum: undo what was taken, on every node (token-checked); the
	// release kills the token, so a grant still on its way is refused when
	// it lands after it (see Dead tokens). Wait for the nodes that granted,
	// which answered moments ago; the others' releases go on in the
	// background, bounded by the node timeout.
	_, _ = r.gather(ctx, ttl, func(ctx context.Context, _ int, n *batcher) error {
		return release(ctx, n)
	}, func(undone []error) bool {
		for i, err := range first {
			if err == nil && undone[i] == errPending {
				return false
			}
		}
		return true
	}, nil)
	switch {
	case heldElsewhere:
		return backend.Grant{}, backend.Locked(remaining)
	case tooLate && ctx.Err() == nil:
		// Nobody else holds the key and the nodes answer: another
		// attempt may well be in time. ErrContended has package lock
		// try again (a TryAcquire for about a TTL).
		return backend.Grant{}, fmt.Errorf("redis: redlock: the quorum came too late: it took %v, longer than the %v TTL less drift, so no validity was left; the grants were undone: %w", took.Round(time.Millisecond), ttl, backend.ErrContended)
	case len(votes) > 0 && ctx.Err() == nil:
		// Nobody has a majority, and concurrent attempts took the
		// nodes we lack: a split vote.
		return backend.Grant{}, fmt.Errorf("redis: redlock: %d of %d nodes granted, %d held by %d other contenders: %w", nGranted, len(r.nodes), len(r.nodes)-nGranted-unknown, len(votes), backend.ErrContended)
	}
	for _, err := range first {
		if err != nil && goredis.HasErrorPrefix(err, "DEAD") {
			// A node knows the token as released: only a release kills a
			// token, so this acquire arrived after the release that undid
			// it (what it took elsewhere is undone above). Bad input, as
			// on one node (see Dead tokens).
			return backend.Grant{}, fmt.Errorf("%w: redis: redlock acquire with a token that was released before; a token is for one acquisition: %w", backend.ErrInvalid, r.quorumErr("acquire", nGranted, errs, ctx))
		}
	}
	return backend.Grant{}, r.quorumErr("acquire", nGranted, errs, ctx)
}

// quorumErr describes a failure to reach a majority; it wraps the nodes'
// errors, and the context's when it ended. A minority of nodes answering
// "not held" is named but not wrapped: the call's answer is unknown, not
// ErrNotHeld (a renew that one node refused while another failed must not
// end a lease that a majority may still hold, nor a release report a lock
// as lost that it may have freed).
func (r *Redlock) quorumErr(op string, ok int, errs []error, ctx context.Context) error {
	var nodeErrs []error
	for i, err := range errs {
		if err != nil && !errors.Is(err, errLockedHere) {
			switch {
			case errors.Is(err, backend.ErrNotHeld):
				err = fmt.Errorf("node %d: not held by this owner", i)
			case i < len(r.nodes):
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
// and extend it. It returns once a majority has decided.
func (r *Redlock) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if err := r.check(); err != nil {
		return backend.Grant{}, err
	}
	if ttl > r.opts.maxTTL {
		return backend.Grant{}, r.tooLong(ttl)
	}
	renewKeys := r.opts.renewKeys(key)
	errs, _ := r.gather(ctx, ttl, func(ctx context.Context, i int, n *batcher) error {
		ok, err := n.run(ctx, renewScript, renewKeys, token, ms(ttl)).Int64()
		if err == nil && ok == 0 {
			return backend.ErrNotHeld
		}
		return err
	}, r.majorityDecided(backend.ErrNotHeld), nil)
	ok, notHeld, _ := count(errs, backend.ErrNotHeld)
	switch {
	case ok >= r.quorum:
		return backend.Grant{TTL: granted(ttl)}, nil
	case notHeld > len(r.nodes)-r.quorum:
		return backend.Grant{}, backend.ErrNotHeld // a majority is gone for good
	}
	return backend.Grant{}, r.quorumErr("renew", ok, errs, ctx)
}

// Release implements backend.Backend: it deletes token's lock on every node.
// It returns once a majority has decided; the other nodes' releases go on in
// the background, bounded by the node timeout.
func (r *Redlock) Release(ctx context.Context, key, token string) error {
	if err := r.check(); err != nil {
		return err
	}
	lk, _ := keys(r.opts.prefix, key)
	ks := []string{lk, deadKeyOf(lk, token), holderKeyOf(lk)}
	ch := channelOf(lk)
	id := releaseID()
	errs, _ := r.gather(ctx, 0, func(ctx context.Context, i int, n *batcher) error {
		k, err := n.run(ctx, releaseScript, ks, token, deadMs, ch, id).Int64()
		if err == nil && k != 1 {
			return backend.ErrNotHeld
		}
		return err
	}, r.majorityDecided(backend.ErrNotHeld), nil)
	released, notHeld, _ := count(errs, backend.ErrNotHeld)
	switch {
	case released >= r.quorum:
		return nil
	case notHeld > len(r.nodes)-r.quorum:
		return backend.ErrNotHeld
	}
	return r.quorumErr("release", released, errs, ctx)
}

// Inspect implements backend.Inspector: the holder is the token that holds a
// majority of nodes, and its label the one most of those nodes report
// (see label.go). It returns once the answers so far decide it.
func (r *Redlock) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	if err := r.check(); err != nil {
		return backend.Holder{}, err
	}
	lk, fk := keys(r.opts.prefix, key)
	holders := make([]backend.Holder, len(r.nodes))
	tally := func(errs []error) (votes map[string][]backend.Holder, ok, pending int) {
		votes = map[string][]backend.Holder{}
		for i, err := range errs {
			switch {
			case err == nil:
				ok++
				if h := holders[i]; h.Held {
					votes[h.Token] = append(votes[h.Token], h)
				}
			case err == errPending:
				pending++
			}
		}
		return votes, ok, pending
	}
	errs, _ := r.gather(ctx, 0, func(ctx context.Context, i int, n *batcher) (err error) {
		holders[i], err = inspect(ctx, n, inspectScript, lk, fk)
		return err
	}, func(errs []error) bool {
		votes, ok, pending := tally(errs)
		most := 0
		for _, hs := range votes {
			most = max(most, len(hs))
		}
		// A holder has a majority, or none can get one and whether
		// the key is free or the nodes failed is settled.
		return most >= r.quorum || (most+pending < r.quorum && (ok >= r.quorum || ok+pending < r.quorum))
	}, nil)
	votes, ok, _ := tally(errs)
	for token, hs := range votes {
		if len(hs) < r.quorum {
			continue
		}
		out := backend.Holder{Held: true, Token: token, Label: redlockLabel(hs)}
		rem := make([]time.Duration, 0, len(hs))
		for _, h := range hs {
			out.Fence = max(out.Fence, h.Fence)
			rem = append(rem, h.Remaining)
		}
		slices.Sort(rem)
		// The lock lasts while a majority of its nodes still hold it
		// (of the nodes that answered: a lower bound).
		out.Remaining = rem[len(rem)-r.quorum]
		return out, nil
	}
	if ok < r.quorum {
		return backend.Holder{}, r.quorumErr("inspect", ok, errs, ctx)
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
	return capabilities(r.opts)
}

// Close stops the subscriptions and waits for the requests still out to
// nodes that had not answered when their call returned (each bounded by the
// node timeout). When the Redlock was opened from a URL it closes the node
// clients, first, which ends those requests at once.
func (r *Redlock) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return nil
	}
	r.notify.close()
	r.bgMu.Lock()
	r.bgClosed = true
	r.bgMu.Unlock()
	var errs []error
	if r.opts.ownClients {
		// Closing the clients first ends the requests still out to
		// slow nodes at once, instead of at the node timeout. They are
		// best effort: a lock one of them would have released expires
		// with its TTL.
		for _, n := range r.nodes {
			if c, ok := n.(interface{ Close() error }); ok {
				errs = append(errs, c.Close())
			}
		}
	}
	r.bg.Wait()
	return errors.Join(errs...)
}
