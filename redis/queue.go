package redis

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/backend/waitq"
)

// The waiters' queue and the handover (backend.Queuer), single deployment
// only. The state machine of a waiter's place, and why it keeps the
// promise, are package waitq's; this file gives it its primitives.
//
// The record. The sorted set "PREFIX{KEY}:q" holds the places' ids in
// arrival order, and each place has a record "PREFIX{KEY}:w:ID" whose value
// is the token of its latest refused attempt and the place's channel, and
// whose expiry is its TTL from the latest attempt or refresh: the record
// is its own carrier.
//
// What the primitives guarantee:
//
//   - Atomicity. Each of placeAcquireScript (Attempt), refreshScript
//     (Refresh) and queueReleaseScript (a release, and Leave) is one Lua
//     script: Redis runs it with nothing in between.
//   - Order. A waiter takes a free key only when no live place is queued
//     before it, and the Acquire and TryAcquire calls that do not queue
//     take a free key only when nobody queues (redis.go); the release
//     hands the key to the oldest place whose record lives and whose
//     token is not dead. A place whose record expired is dropped from the
//     set; its next attempt queues it again, at the back.
//   - The handover's guard. The release script checks the releasing
//     token, and gives the lock key the record's token with the record's
//     remaining expiry and a new fence from the key's counter (or the
//     slot's), and deletes the record, in the same step. It publishes
//     "h:ID:FENCE:TOKEN" on the channel of that place's backend and key
//     (named in the record): that process alone hears it, and the place
//     confirms it with a renewal of the handed lock before it reports it
//     (place.confirm says why the message alone is not enough). A lost message (a
//     pub/sub connection that broke) costs latency: the lock stays the
//     waiter's until its expiry, and its next attempt (a resubscription
//     wakes it) takes it over as a new grant (Attempt.Prev).
//   - Leave is the release script for the record's token: its place goes,
//     and a lock handed to it, even by a release that ran after the
//     waiter gave up, is released to the next waiter. A tombstone of the
//     token keeps a late handover from choosing it again.
//   - The head. A holder that expires hands nothing over and publishes
//     nothing; the place first in the queue learns the lock's expiry from
//     its attempts and refreshes (both scripts return it to the first
//     place) and is woken then (Result.RetryIn). A release that finds the
//     key free with others queued wakes the first of them ("w:ID").
//
// # Bounded work
//
// Every script does a bounded amount of work, however many dead places a
// queue holds (waiters killed while queued leave their entries; their
// records expire). Each search for the first live place drops at most
// scanBound dead ones, about 2 µs each on the server; where it stops:
//
//   - an Acquire or TryAcquire that found the key free answers as if
//     others queued (the key is not taken; the caller tries again, and the
//     next attempt searches on);
//   - a place's attempt queues the place and asks for another attempt at
//     once (Result.RetryIn), which searches on;
//   - a release deletes the lock (no handover) and answers 2; the
//     releasing backend then sweeps the queue with sweepScript, one
//     bounded request at a time, until it wakes the first live place;
//   - a place's refresh drops the dead places before it, so a place
//     behind dead ones becomes first even with nobody else active.
//
// Stopping early only delays: a place is granted or handed the lock only
// by a search that completed, so the order above holds. And since a
// lock is marked whenever a live place queues behind its holder (the
// place marks it, a grant or handover with others queued marks it), the
// release of an unmarked lock skips the search.
//
// Redlock does not queue: a handover would have to be the same on a
// majority of nodes, each choosing the head of its own queue, and nodes
// that disagree (a waiter's record expired on one, a node restarted empty)
// would hand the lock to different waiters, one per minority. Its waiters
// wake on release messages, as before.

// scanBound is the most dead places one script drops (see Bounded work),
// as the scripts' Lua text takes it: 500 keep a script under 2 ms on the
// server.
const scanBound = "500"

var (
	// placeAcquireScript: KEYS = lock, fence, dead token, next, queue,
	// record, holder key (see label.go)[, the slot's fence counter]; ARGV
	// = token, ttl ms, place id, the place's previous token ('' for none),
	// record prefix, the place's channel, the most places that may queue,
	// the label ('' for none). Returns {the fence} (> 0) when it took the lock, or {minus
	// the holder's PTTL (<= 0), 1 when the place is first in the queue,
	// else 0} after queueing the place ({0, 0} when the key is free but
	// others queue first: the script wakes the first of them; {0, 2} when
	// the key is free and the search for the first live place stopped at
	// its bound: try again; {minus the holder's PTTL, 3} when the place is
	// not queued and ARGV[7] places queue already: it neither queues nor
	// writes its record, see WithMaxWaiters), or the
	// error DEAD for a released token. A record's value is the token and
	// the place's channel, separated by a space.
	//
	// A lock held by the place's previous token was handed to the place,
	// which did not take it (it learned of it too late): the script takes
	// it over for token as a new grant, with a new fence and the TTL from
	// this request.
	placeAcquireScript = goredis.NewScript(plainScript(placeAcquireLua))

	// queueReleaseScript: see queueReleaseLua.
	queueReleaseScript = goredis.NewScript(plainScript(queueReleaseLua))

	// refreshScript: see refreshLua.
	refreshScript = goredis.NewScript(plainScript(refreshLua))
)

// The queue's scripts' Lua text, in the helpers of the backend's mode
// (see session.go).
var (
	placeAcquireLua = `
if redis.call('EXISTS', KEYS[3]) == 1 or buried(ARGV[1]) then
  return redis.error_reply('DEAD token released before')
end
if not join(ARGV[1], ARGV[2]) then
  return redis.error_reply('ENDED session ended')
end
local v = live(KEYS[1])
local function grant(marked)
  local val = ARGV[1]
  if marked then val = val .. '+' end
  leave(KEYS[1], v)
  redis.call('SET', KEYS[1], val, 'PX', span(val, ARGV[2]))
  enter(KEYS[1], val)
  if ARGV[8] and ARGV[8] ~= '' then
    redis.call('SET', KEYS[7], ARGV[1] .. ' ' .. ARGV[8], 'PX', span(val, ARGV[2]))
  elseif v then
    redis.call('DEL', KEYS[7])
  end
  redis.call('ZREM', KEYS[5], ARGV[3])
  redis.call('DEL', KEYS[6])
  if KEYS[8] then
    local f = redis.call('INCR', KEYS[8])
    local old = tonumber(redis.call('GET', KEYS[2]) or '0')
    if old >= f then
      f = old + 1
      redis.call('SET', KEYS[8], f)
    end
    redis.call('SET', KEYS[2], f, 'PX', ARGV[2])
    return {f}
  end
  return {redis.call('INCR', KEYS[2])}
end
if v == ARGV[1] or v == ARGV[1] .. '+' then
  redis.call('PEXPIRE', KEYS[1], span(v, ARGV[2]))
  redis.call('PEXPIRE', KEYS[4], span(v, ARGV[2]))
  redis.call('PEXPIRE', KEYS[7], span(v, ARGV[2]))
  if KEYS[8] then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  local c = redis.call('GET', KEYS[2])
  if redis.call('GET', KEYS[4]) == c then
    return {tonumber(c) - 1}
  end
  return {tonumber(c)}
end
if ARGV[4] ~= '' and (v == ARGV[4] or v == ARGV[4] .. '+') then
  return grant(string.byte(v, -1) == 43)
end
local more = false
if not v then
  local head
  more = true
  for i = 1, ` + scanBound + ` do
    local h = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
    if not h or h == ARGV[3] then
      head = h
      more = false
      break
    end
    local r = redis.call('GET', ARGV[5] .. h)
    if r then
      local sp = string.find(r, ' ', 1, true)
      if sp then
        redis.call('PUBLISH', string.sub(r, sp + 1), 'w:' .. h)
      end
      head = h
      more = false
      break
    end
    redis.call('ZREM', KEYS[5], h)
  end
  if not more and (not head or head == ARGV[3]) then
    local n = 0
    if head then n = 1 end
    return grant(redis.call('ZCARD', KEYS[5]) > n)
  end
elseif string.byte(v, -1) ~= 43 then
  redis.call('APPEND', KEYS[1], '+')
end
if not redis.call('ZSCORE', KEYS[5], ARGV[3]) and redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[7]) then
  local p = 0
  if v then p = pttl(KEYS[1], v) end
  if p < 0 then p = 0 end
  return {-p, 3}
end
redis.call('SET', KEYS[6], ARGV[1] .. ' ' .. ARGV[6], 'PX', ARGV[2])
local first = 0
if not redis.call('ZSCORE', KEYS[5], ARGV[3]) then
  local last = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('ZADD', KEYS[5], tonumber(last[2]) + 1, ARGV[3])
    redis.call('PEXPIRE', KEYS[5], ARGV[2], 'GT')
  else
    first = 1
    redis.call('ZADD', KEYS[5], 1, ARGV[3])
    redis.call('PEXPIRE', KEYS[5], ARGV[2])
  end
else
  if redis.call('ZRANK', KEYS[5], ARGV[3]) == 0 then first = 1 end
  redis.call('PEXPIRE', KEYS[5], ARGV[2], 'GT')
end
if more then return {0, 2} end
if not v then return {0, 0} end
local p = pttl(KEYS[1], v)
if p < 0 then p = 0 end
return {-p, first}`

	// queueReleaseScript is the single deployment's release: KEYS = lock,
	// dead token, fence, queue, the releasing place's record, holder key
	// (see label.go)[, the slot's fence counter]; ARGV = token, tombstone
	// ms, the key's channel, record prefix, the releasing place's id ('' for none), the prefix of
	// the key's tombstones (deadKeyOf with no token). Returns as
	// releaseScript, or 2 when it deleted the lock after its search for a
	// waiter stopped at its bound (see Bounded work). It removes the releasing place from the queue, then,
	// when token holds the lock, hands it to the oldest place whose record
	// lives and whose token is not dead (see above), publishing
	// "h:ID:FENCE:TOKEN" on that place's channel; or deletes it
	// (publishing the token on the key's channel when a waiter marked it).
	// A handover marks the new holder's lock when others still queue, or
	// when the released lock was marked: a waiter outside the queue (a
	// plain Acquire and a Watch, as package migrate's backends wait)
	// marked it, and it must hear the next release.
	queueReleaseLua = `
if ARGV[5] ~= '' then
  redis.call('ZREM', KEYS[4], ARGV[5])
  redis.call('DEL', KEYS[5])
end
local v = live(KEYS[1])
if v == ARGV[1] then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  redis.call('DEL', KEYS[1], KEYS[6])
  leave(KEYS[1], v)
  return 1
end
if v == ARGV[1] .. '+' then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  redis.call('DEL', KEYS[6])
  leave(KEYS[1], v)
  local more = 1
  for i = 1, ` + scanBound + ` do
    local hs = redis.call('ZRANGE', KEYS[4], 0, 1)
    local h = hs[1]
    if not h then
      more = 0
      break
    end
    redis.call('ZREM', KEYS[4], h)
    local r = ARGV[4] .. h
    local rv = redis.call('GET', r)
    local sp = rv and string.find(rv, ' ', 1, true)
    local p = 0
    if sp then p = redis.call('PTTL', r) end
    if p > 0 then
      local t = string.sub(rv, 1, sp - 1)
      if redis.call('EXISTS', ARGV[6] .. t) == 0 and alive(t) then
        local val = t
        if hs[2] or v ~= ARGV[1] then val = t .. '+' end
        redis.call('SET', KEYS[1], val, 'PX', p)
        redis.call('DEL', r)
        local f
        if KEYS[7] then
          f = redis.call('INCR', KEYS[7])
          local old = tonumber(redis.call('GET', KEYS[3]) or '0')
          if old >= f then
            f = old + 1
            redis.call('SET', KEYS[7], f)
          end
          redis.call('SET', KEYS[3], f, 'PX', p)
        else
          f = redis.call('INCR', KEYS[3])
        end
        redis.call('PUBLISH', string.sub(rv, sp + 1), 'h:' .. h .. ':' .. f .. ':' .. t)
        return 1
      end
    end
  end
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], ARGV[1])
  return 1 + more
end
` + releaseNotHeldLua

	// refreshScript: KEYS = record, queue, lock; ARGV = ttl ms, place id,
	// record prefix. Returns {0, 0} when the record is gone; else {1, the
	// lock's PTTL} when the place is first in the queue (-2: the lock is
	// free), or {1, -3} when it is not. A place behind others first drops
	// the dead places before it (at most scanBound).
	refreshLua = `
if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 0 then
  return {0, 0}
end
if ARGV[4] and not join(ARGV[4], ARGV[1]) then
  return {0, 0}
end
redis.call('PEXPIRE', KEYS[2], ARGV[1], 'GT')
local r = redis.call('ZRANK', KEYS[2], ARGV[2])
if r and r > 0 then
  for i = 1, ` + scanBound + ` do
    local h = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not h or h == ARGV[2] or redis.call('EXISTS', ARGV[3] .. h) == 1 then
      break
    end
    redis.call('ZREM', KEYS[2], h)
  end
  r = redis.call('ZRANK', KEYS[2], ARGV[2])
end
if r == 0 then
  return {1, pttl(KEYS[3], live(KEYS[3]))}
end
return {1, -3}`
)

var (

	// sweepScript: KEYS = queue; ARGV = record prefix, the prefix of the
	// key's tombstones. It drops at most scanBound dead places from the
	// head of the queue (a record gone, or its token dead) and wakes the
	// first live one ("w:ID" on its channel). Returns 1 when it woke one
	// or the queue is empty, 0 when dead places may remain.
	sweepScript = goredis.NewScript(`
for i = 1, ` + scanBound + ` do
  local h = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if not h then return 1 end
  local rv = redis.call('GET', ARGV[1] .. h)
  local sp = rv and string.find(rv, ' ', 1, true)
  if sp and redis.call('EXISTS', ARGV[2] .. string.sub(rv, 1, sp - 1)) == 0 then
    redis.call('PUBLISH', string.sub(rv, sp + 1), 'w:' .. h)
    return 1
  end
  redis.call('ZREM', KEYS[1], h)
end
return 0`)
)

// DefaultMaxWaiters is how many places may queue for one key unless
// WithMaxWaiters says otherwise.
const DefaultMaxWaiters = 65536

// WithMaxWaiters caps the places queued for one key (default
// DefaultMaxWaiters; a value below 1 counts as 1). A waiter that finds the queue full does not queue and is
// not woken by releases: it polls, trying again when the holder's lock
// expires, at most every second and at least 10ms apart, until it finds
// room in the queue (and then queues) or the key free with nobody queued.
// The cap bounds the store's memory per key (a place costs about 150
// bytes: its queue entry and record); each request's work is bounded
// whatever the queue holds (see Bounded work). Redlock does not queue.
func WithMaxWaiters(n int) Option {
	return func(o *options) { o.maxWaiters = max(n, 1) }
}

// overFullPoll is when a waiter that found the queue full tries again:
// at the holder's expiry (left), within 10ms to 1s.
func overFullPoll(left time.Duration) time.Duration {
	return min(max(left+time.Millisecond, 10*time.Millisecond), time.Second)
}

// Queue implements backend.Queuer. It sends nothing: the place's Acquire
// does.
func (b *Backend) Queue(key string) (backend.Queue, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	var id [8]byte
	crand.Read(id[:])
	lk, fk := keys(b.opts.prefix, key)
	p := &place{b: b, key: key, lk: lk, fk: fk, id: hex.EncodeToString(id[:])}
	p.rec = recordPrefixOf(lk) + p.id
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.q = b.queues.New(p)
	return p.q, nil
}

// place is the store side of one waiter's place in a key's queue
// (waitq.Store): the scripts above, and the subscription that carries its
// messages.
type place struct {
	b               *Backend
	q               *waitq.Place
	key, lk, fk, id string
	rec             string
	ctx             context.Context // ends at Stop: bounds the confirmations
	cancel          context.CancelFunc

	mu     sync.Mutex
	w      *watch // the subscription to the place's channel, once queued
	closed bool
	token  string // as stored: the token of the latest attempt
}

func (p *place) acquireKeys(token string) []string {
	ks := []string{p.lk, p.fk, deadKeyOf(p.lk, token), nextKeyOf(p.lk), queueKeyOf(p.lk), p.rec, holderKeyOf(p.lk)}
	if sk := p.b.opts.slotFenceKey(p.lk); sk != "" {
		ks = append(ks, sk)
	}
	return ks
}

// Attempt implements waitq.Store: placeAcquireScript. The record, written
// with the attempt's TTL, is the place's carrier: a refusal's send time is
// its confirmed refresh.
func (p *place) Attempt(ctx context.Context, a waitq.Attempt) (waitq.Result, error) {
	b := p.b
	if err := b.check(); err != nil {
		return waitq.Result{}, err
	}
	if err := b.checkTTL(a.TTL); err != nil {
		return waitq.Result{}, err
	}
	ch := p.channel()
	p.mu.Lock()
	subscribed := p.w != nil
	p.mu.Unlock()
	if !subscribed && b.notify.subscribed(ch) {
		// The key's channel is subscribed already (a hot key): join it
		// before queueing, so that no handover message is missed. This
		// sends nothing.
		if err := p.subscribe(ctx, ch); err != nil {
			return waitq.Result{}, err
		}
		subscribed = true
	}
	sent := time.Now()
	st, prev := b.stored(a.Token), a.Prev
	if prev != "" {
		prev = b.stored(prev)
	}
	p.mu.Lock()
	p.token = st
	p.mu.Unlock()
	out, err := b.batch.run(ctx, b.sc.placeAcquire, p.acquireKeys(st), st, ms(a.TTL), p.id, prev, recordPrefixOf(p.lk), ch, b.opts.maxWaiters, backend.Label(ctx)).Int64Slice()
	if err == nil && (len(out) == 0 || len(out) > 2 || (out[0] <= 0) != (len(out) == 2)) {
		err = fmt.Errorf("unexpected script reply %v", out)
	}
	if err != nil {
		return waitq.Result{Queued: true}, b.acquireErr(a.Token, err)
	}
	if out[0] > 0 {
		return waitq.Result{Grant: backend.Grant{Fence: uint64(out[0]), TTL: granted(a.TTL)}}, nil
	}
	left := time.Duration(-out[0]) * time.Millisecond
	if out[1] == 3 {
		// The queue is full: poll, until there is room (see
		// WithMaxWaiters). Refused without queueing, the place is as it
		// was.
		return waitq.Result{RetryIn: overFullPoll(left)}, backend.Locked(left)
	}
	res := waitq.Result{Queued: true, Refreshed: sent}
	switch {
	case out[1] == 1 && out[0] < 0:
		// First in the queue: a holder that expires hands nothing over
		// and publishes nothing; try again when its expiry comes.
		res.RetryIn = left + time.Millisecond
	case out[1] == 2:
		// The search for the first live place stopped at its bound:
		// the next attempt goes on from there.
		res.RetryIn = time.Millisecond
	}
	if !subscribed {
		// Join the key's channel, then check once more: a handover
		// published before the subscription was not heard.
		if err := p.subscribe(ctx, ch); err == nil {
			if h, err := inspect(ctx, b.batch, b.sc.inspect, p.lk, p.fk); err == nil && h.Held && h.Token == a.Token {
				p.confirm(a.Token, h.Fence)
			}
		}
	}
	return res, backend.Locked(left)
}

// Refresh implements waitq.Store: refreshScript, which also tells the
// place first in the queue when the holder's lock expires.
func (p *place) Refresh(ctx context.Context, ttl time.Duration) (waitq.Refreshed, error) {
	args := []any{ms(ttl), p.id, recordPrefixOf(p.lk)}
	p.mu.Lock()
	if p.token != "" {
		args = append(args, p.token) // its session lives on while it waits
	}
	p.mu.Unlock()
	out, err := p.b.batch.run(ctx, p.b.sc.refresh, []string{p.rec, queueKeyOf(p.lk), p.lk}, args...).Int64Slice()
	if err == nil && len(out) != 2 {
		err = fmt.Errorf("unexpected script reply %v", out)
	}
	switch {
	case err != nil:
		return waitq.Refreshed{}, err
	case out[0] == 0:
		return waitq.Refreshed{Gone: true}, nil
	case out[1] != -3:
		// First in the queue: try when the lock expires (a holder that
		// dies hands nothing over), or now when it is free.
		return waitq.Refreshed{RetryIn: time.Duration(max(out[1], 0))*time.Millisecond + time.Millisecond}, nil
	}
	return waitq.Refreshed{}, nil
}

// Leave implements waitq.Store: the release script for the record's token
// takes the record and its queue entry, and releases a lock handed to it
// to the next waiter; a handover to another token is released too.
func (p *place) Leave(ctx context.Context, l waitq.Leaving) error {
	var err error
	if l.Token != "" && (l.Queued || l.Handed != nil) {
		_, err = p.b.releaseWith(ctx, p.lk, l.Token, p.rec, p.id)
	}
	if l.Handed != nil && l.Handed.Token != l.Token {
		_, herr := p.b.releaseWith(ctx, p.lk, l.Handed.Token, "", "")
		err = errors.Join(err, herr)
	}
	return err
}

// Stop implements waitq.Store: the place's subscription ends.
func (p *place) Stop(took bool, _ *backend.Handover) {
	p.cancel()
	p.mu.Lock()
	p.closed = true
	w := p.w
	p.mu.Unlock()
	if w != nil {
		w.Close(took)
	}
}

// confirm confirms a handover that a message reported (the message
// "h:ID:FENCE:TOKEN"), or that the check after a place's first
// subscription found, in the background: a renewal of the handed lock for
// token with the place's TTL, whose send time starts the handover's
// deadline (waitq.Place.Confirmed).
//
// Why a message is not counted from the place's refreshes (waitq.Handoff):
// the release gave the lock the record's remaining expiry once and deleted
// the record, so only refreshes that reached that record bound the lock.
// A message can come late (its connection stalled), after the lock expired
// and another client took the key, and after the place's record was
// written again: by an attempt whose reply was lost (the place still
// names the earlier token as its record's) or by a duplicate of the
// attempt that queued the token. The place's refreshes of that new record
// say nothing of the handed lock's expiry. The renewal does: it runs only
// while token holds the lock, and sets its expiry to the TTL after its
// arrival, which is after its send. A lock it does not find (gone, or
// held by another), and a renewal of unknown outcome, are not handed to
// the waiter: it is woken, and its next attempt takes over a lock still
// handed to its token (Attempt.Prev) or queues again. The renewal is
// bounded by the TTL and by waitq.LeaveTimeout (so that the backend's Close,
// which waits for it, waits no longer than for a leave), and ends when the
// place stops; a lock it extended for
// a waiter that gave up is freed by the place's Leave, as any handed lock.
func (p *place) confirm(token string, fence uint64) {
	ttl := p.q.TTL()
	if ttl <= 0 || !p.q.Expects(token) {
		// Not the token of the place's record or attempt: a lock handed
		// to an earlier record expires with it, unrenewed (see
		// waitq.Place.Handoff).
		return
	}
	started := p.b.queues.Go(func() {
		ctx, cancel := context.WithTimeout(p.ctx, min(ttl, waitq.LeaveTimeout))
		defer cancel()
		sent := time.Now()
		g, err := p.b.renewLock(ctx, p.key, token, ttl)
		if err == nil && p.q.Confirmed(token, backend.Grant{Fence: fence, TTL: g.TTL}, sent) {
			return
		}
		p.q.Wake()
	})
	if !started {
		p.q.Wake()
	}
}

// subscribe joins the key's channel as the place's watch.
func (p *place) subscribe(ctx context.Context, ch string) error {
	w, err := p.b.notify.watchPlace(ctx, ch, p)
	if err != nil {
		return err
	}
	p.mu.Lock()
	closed, had := p.closed, p.w != nil
	if !closed && !had {
		p.w = w
	}
	p.mu.Unlock()
	switch {
	case closed:
		w.Close(false)
		return backend.ErrClosed
	case had:
		w.Close(false)
	}
	return nil
}

// releaseWith runs the single deployment's release script for token, and
// for the place id with record rec when id is not "". It returns the
// script's answer: 1 released (now or before), 0 not held.
func (b *Backend) releaseWith(ctx context.Context, lk, token, rec, id string) (int64, error) {
	n, err := b.releaseOnce(ctx, lk, b.stored(token), rec, id)
	if b.sessions != nil {
		b.sessions.released(ctx, lk, token, err == nil)
	}
	return n, err
}

// releaseOnce is releaseWith for token as the store holds it (stored).
func (b *Backend) releaseOnce(ctx context.Context, lk, token, rec, id string) (int64, error) {
	ks := []string{lk, deadKeyOf(lk, token), fenceKeyOf(lk), queueKeyOf(lk), rec, holderKeyOf(lk)}
	if rec == "" {
		ks[4] = recordPrefixOf(lk) // a key of the slot; unused without an id
	}
	if sk := b.opts.slotFenceKey(lk); sk != "" {
		ks = append(ks, sk)
	}
	n, err := b.batch.run(ctx, b.sc.queueRelease, ks, token, deadMs, channelOf(lk), recordPrefixOf(lk), id, deadKeyOf(lk, "")).Int64()
	if err == nil && n == 2 {
		// Released, but the search for a waiter stopped at its bound:
		// sweep the rest of the dead places, a bounded step per request.
		b.sweep(ctx, lk)
		n = 1
	}
	return n, err
}

// maxSweeps bounds the requests one release spends on sweeping a queue:
// scanBound dead places each. A queue with more dead places than that is
// swept on by later attempts and by the live places' refreshes.
const maxSweeps = 1000

// sweep runs sweepScript on lk's queue until it woke the first live place
// or emptied the queue, or until maxSweeps requests, an error or the end
// of ctx. The release it follows has taken effect either way.
func (b *Backend) sweep(ctx context.Context, lk string) {
	q := []string{queueKeyOf(lk)}
	for range maxSweeps {
		done, err := b.batch.run(ctx, sweepScript, q, recordPrefixOf(lk), deadKeyOf(lk, "")).Int64()
		if err != nil || done == 1 {
			return
		}
	}
}

// channel returns the channel the place's messages come on: one per key
// and backend, so that a handover wakes the waiter's process alone.
func (p *place) channel() string { return channelOf(p.lk) + ":" + p.b.id }

// parseHandover parses a handover message "h:ID:FENCE:TOKEN": the place ID
// got the lock for TOKEN at FENCE.
func parseHandover(msg string) (id string, fence uint64, token string, ok bool) {
	rest, ok := strings.CutPrefix(msg, "h:")
	if !ok {
		return "", 0, "", false
	}
	parts := strings.SplitN(rest, ":", 3)
	if len(parts) != 3 {
		return "", 0, "", false
	}
	f, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil || f == 0 {
		return "", 0, "", false
	}
	return parts[0], f, unstored(parts[2]), true
}
