// Package memory is an in-process lock store with exact semantics, for demos,
// single-process programs and the unit tests of code that uses package lock.
// Application code should use package lock; this package provides the store.
//
//	locks, err := lock.New(memory.New())
//
// A Store holds the locks; each Backend is one independent connection to it
// (its own fault switches), and implements backend.Backend. Several
// lock.Clients over Backends of one Store contend for the same keys, like
// several processes on one Redis.
//
// # Testing lock-loss handling
//
// Give the store and the lock client one *clock.Fake to drive expiry by hand,
// and flip the fault switches to see what your code does when the store
// misbehaves:
//
//   - Store.Pause and Store.Resume: the store stops answering; calls block
//     until it resumes or their context ends.
//   - Backend.Disconnect and Backend.Reconnect: one client is cut off the same
//     way (a partition), the others go on.
//   - Store.Restart: the store restarts, keeping its data or losing it.
//   - Backend.HoldReplies, DeliverReplies and DropReplies: requests take
//     effect but their replies wait, arrive late, or are lost.
//
// These switches are test hooks: they exist for tests of code that uses
// package lock, and for the conformance suite's harnesses (memory's own,
// netstore's), which drive them as faults. A program that only takes locks
// never calls them. The store itself has no deliberate bugs, not even
// switched off: the suite's self-test compiles its flaws into a child test
// binary (see TestSuiteCatchesFlaws).
//
// # Guarantees
//
//	what                     | guarantee
//	-------------------------|------------------------------------------------
//	mutual exclusion         | exact: a lock expires exactly TTL after the
//	                         | request reached the store, on the store's clock
//	fence                    | one counter for the whole store: strictly
//	                         | increasing per key (and across keys)
//	Restart(KeepData)        | locks and fence counter survive
//	Restart(LoseData)        | locks and the fence counter are lost: fences
//	                         | start again from 1 (not durable)
//	wake-ups                 | on release and on restart; expiry is found by
//	                         | the waiter's timer (lock caps it at the TTL)
//	released tokens          | a Release sent again answers as the first did,
//	                         | until the next sweep; with KeepDeadTokens(d)
//	                         | (netstore sets DeadTokenTTL), for d: an Acquire
//	                         | with the token, or a Transfer to it, fails with
//	                         | ErrInvalid
//	transfer                 | Backend.Transfer (backend.Transferer), for
//	                         | servers built on a Store; package lock does not
//	                         | transfer on a store in its own process
//	maximum TTL              | WithMaxTTL (URL parameter maxttl), default
//	                         | DefaultMaxTTL (1m): longer TTLs are refused
//	waiters                  | the store hands no lock to a waiter: a release
//	                         | wakes it, and it takes the key with its own
//	                         | request and TTL (never a longer one); a waiter
//	                         | that gave up or died holds nothing
//
// # URLs
//
// "mem://" opens a fresh private store; "mem://NAME" opens a new client of the
// process-wide store NAME, created on first use, so two Opens of one name
// contend for the same keys. The store NAME lives while a client opened so
// is open: once the last is closed it is freed, and the next Open of NAME
// starts a fresh store (no locks, fences from 1, as Restart(LoseData)).
// Besides the client's own query parameters, one: maxttl, the longest TTL
// the client grants (WithMaxTTL; a Go duration from 1ms to 8760h,
// lock.MaxTTL; default 1m). It is the opened client's: two clients of one
// named store may have different ones, as two clients of one Redis may.
package memory

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
)

// MinTTL is the shortest TTL the store accepts.
const MinTTL = time.Millisecond

// DefaultMaxTTL is the longest TTL a client of a store grants unless
// WithMaxTTL (or a mem:// URL's maxttl) says otherwise: lock.DefaultMaxTTL,
// the default of every backend of this module. A store in the process
// dies with the holders that could crash, so the limit guards less here
// than on a store outside the process (a goroutine that stopped renewing
// without a release still blocks a key for its TTL); it is the same so
// that code whose tests run on this store meets the limit it will meet in
// production, and fails there as it fails here.
const DefaultMaxTTL = lock.DefaultMaxTTL

const shardCount = 64

// Store is an in-process lock store. It is safe for concurrent use.
type Store struct {
	clock   clock.Clock
	maxTTL  time.Duration // its clients' maximum TTL unless their URL says otherwise
	epoch   time.Time
	fence   atomic.Uint64
	deadFor atomic.Int64 // time.Duration; see KeepDeadTokens
	shards  [shardCount]shard
	gate    gate // Pause/Resume
}

type shard struct {
	mu       sync.Mutex
	locks    map[string]entry
	watchers map[string]*list.List // of *watch, in arrival order
	sweepAt  int                   // sweep expired entries when locks grows past this
	released map[string]string     // key -> the token whose release freed it last
	dead     map[deadKey]tomb      // tokens released within the last deadFor (KeepDeadTokens)
	deadQ    []deadAt              // the same, in order of death, for sweeping
	deadHead int                   // deadQ[:deadHead] is swept
}

type entry struct {
	token   string
	fence   uint64
	expires time.Duration // since the store's epoch
	// waited: an Acquire by another token found the lock held. Transfer
	// then refuses to pass it on without a reserved fence, so that the
	// waiter gets its chance at the next release.
	waited bool
	label  string // the holder label of token (backend.Label)
}

// StoreOption configures a Store.
type StoreOption func(*Store)

// WithClock sets the store's clock, which decides expiry. Tests pass a
// *clock.Fake, usually the same one given to lock.WithClock.
func WithStoreClock(c clock.Clock) StoreOption {
	return func(s *Store) {
		if c != nil {
			s.clock = c
		}
	}
}

// WithMaxTTL sets the longest TTL the store's clients grant (default
// DefaultMaxTTL), from MinTTL to lock.MaxTTL. Capabilities reports it, so
// package lock refuses a longer TTL (ErrInvalidTTL) before it calls the
// client, and the client refuses one too (ErrInvalid). NewStore cannot
// refuse a maximum out of range: every call of its clients that takes a
// TTL fails with ErrInvalid instead, saying why.
func WithMaxTTL(d time.Duration) StoreOption {
	return func(s *Store) { s.maxTTL = d }
}

// NewStore returns an empty store.
func NewStore(opts ...StoreOption) *Store {
	s := &Store{clock: clock.Real, maxTTL: DefaultMaxTTL}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	s.epoch = s.clock.Now()
	for i := range s.shards {
		s.shards[i].locks = make(map[string]entry)
		s.shards[i].sweepAt = 64
	}
	return s
}

// New returns a Backend of a new private Store: the shortest way to a backend.
func New(opts ...StoreOption) *Backend {
	return NewStore(opts...).NewBackend()
}

// NewBackend returns a new independent connection to the store, with the
// store's maximum TTL (WithMaxTTL).
func (s *Store) NewBackend() *Backend {
	return &Backend{s: s, maxTTL: s.maxTTL}
}

// now returns the store's time as an offset from its epoch: on the real
// clock a monotonic reading, cheaper than time.Now.
func (s *Store) now() time.Duration { return -s.clock.Until(s.epoch) }

// shard picks the key's shard with FNV-1a: cheaper than a second pass of
// the map's own hash for the short keys locks use.
func (s *Store) shard(key string) *shard {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return &s.shards[h%shardCount]
}

// Pause makes the store stop answering: every call blocks until Resume or the
// end of its context, and then fails with the context's error. Calls already
// inside the store finish. Leases held through it are lost at their client
// deadlines.
func (s *Store) Pause() { s.gate.close() }

// Resume undoes Pause.
func (s *Store) Resume() { s.gate.open() }

// RestartMode says what a restart keeps.
type RestartMode int

const (
	// KeepData: locks (with their expiry times) and the fence counter
	// survive, as with a store that persists every write.
	KeepData RestartMode = iota
	// LoseData: every lock is dropped and the fence counter starts again,
	// as with a store without persistence. Fences repeat after this.
	LoseData
)

// Restart simulates a restart of the store. Waiters are woken, since keys may
// have become free.
func (s *Store) Restart(mode RestartMode) {
	if mode == LoseData {
		s.fence.Store(0)
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if mode == LoseData {
			clear(sh.locks)
			clear(sh.released)
			clear(sh.dead)
			clear(sh.deadQ)
			sh.deadQ, sh.deadHead = sh.deadQ[:0], 0
		}
		for _, ws := range sh.watchers {
			for e := ws.Front(); e != nil; e = e.Next() {
				e.Value.(*watch).notify()
			}
		}
		sh.mu.Unlock()
	}
}

// Evict drops the lock on key, held or not, as its expiry would before its
// time (an eviction, a write a failover lost): its holder's token stays
// alive, so that its renewals find the key free, and the key's waiters are
// woken. Tests use it to see what a client does when a store loses a lock.
// It reports whether a lock was held.
func (s *Store) Evict(key string) bool {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.locks[key]
	delete(sh.locks, key)
	sh.wakeFirst(key)
	return ok && s.now() < e.expires
}

// Len returns the number of unexpired locks in the store.
func (s *Store) Len() int {
	now := s.now()
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, e := range sh.locks {
			if now < e.expires {
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}

// Watchers returns the number of open watches, for leak checks in tests.
func (s *Store) Watchers() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, ws := range sh.watchers {
			n += ws.Len()
		}
		sh.mu.Unlock()
	}
	return n
}

// Backend is one connection to a Store. It implements backend.Backend,
// backend.Notifier, backend.Describer, backend.Inspector and
// backend.Transferer.
type Backend struct {
	s       *Store
	maxTTL  time.Duration
	gate    gate // Disconnect/Reconnect
	replies gate // HoldReplies/DeliverReplies
	dropMu  sync.Mutex
	dropped chan struct{} // closed by DropReplies
	closed  atomic.Bool
	onClose func() // run by the first Close: a named store's release
}

var (
	_ backend.Backend    = (*Backend)(nil)
	_ backend.Notifier   = (*Backend)(nil)
	_ backend.Describer  = (*Backend)(nil)
	_ backend.Inspector  = (*Backend)(nil)
	_ backend.Transferer = (*Backend)(nil)
)

// Store returns the store this client is connected to.
func (c *Backend) Store() *Store { return c.s }

// Disconnect cuts this client off: its calls block until Reconnect or the end
// of their context, as behind a network partition that drops packets.
func (c *Backend) Disconnect() { c.gate.close() }

// Reconnect undoes Disconnect.
func (c *Backend) Reconnect() { c.gate.open() }

// HoldReplies is a test hook that simulates replies held on the network: the client's requests
// still reach the store and take effect, but Acquire, Renew and Release
// return only after DeliverReplies (or their context's end, or
// DropReplies).
func (c *Backend) HoldReplies() {
	c.dropMu.Lock()
	if c.dropped == nil {
		c.dropped = make(chan struct{})
	}
	c.dropMu.Unlock()
	c.replies.close()
}

// DeliverReplies undoes HoldReplies: held replies arrive.
func (c *Backend) DeliverReplies() { c.replies.open() }

// DropReplies loses the held replies: the calls waiting for them return
// ErrReplyLost (their requests took effect), and later replies arrive.
func (c *Backend) DropReplies() {
	c.dropMu.Lock()
	if c.dropped != nil {
		close(c.dropped)
		c.dropped = nil
	}
	c.dropMu.Unlock()
	c.replies.open()
}

// ErrReplyLost is returned by a call whose reply DropReplies lost: the
// request took effect on the store, and the caller cannot know how.
var ErrReplyLost = errors.New("memory: the reply was lost (simulated)")

// replied returns err once the reply may arrive: at once unless replies
// are held.
func (c *Backend) replied(ctx context.Context, err error) error {
	if !c.replies.closed.Load() {
		return err
	}
	c.dropMu.Lock()
	dropped := c.dropped
	c.dropMu.Unlock()
	c.replies.mu.Lock()
	open := c.replies.ch
	c.replies.mu.Unlock()
	if open == nil {
		return err
	}
	select {
	case <-open:
		return err
	case <-dropped:
		return ErrReplyLost
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the client. Locks it holds stay until they expire.
func (c *Backend) Close() error {
	if c.closed.CompareAndSwap(false, true) && c.onClose != nil {
		c.onClose()
	}
	return nil
}

// Capabilities reports the store's guarantees.
func (c *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		MinTTL:       MinTTL,
		MaxTTL:       c.maxTTL,
		ExpiryFactor: 1,
		DurableFence: true, // with Restart(KeepData); see the package doc
		InProcess:    true,
		Labels:       true,
	}
}

// enter waits until the client and the store answer.
func (c *Backend) enter(ctx context.Context) error {
	if c.closed.Load() {
		return backend.ErrClosed
	}
	if err := c.gate.wait(ctx); err != nil {
		return err
	}
	if err := c.s.gate.wait(ctx); err != nil {
		return err
	}
	if c.closed.Load() {
		return backend.ErrClosed
	}
	return nil
}

// checkMaxTTL says what is wrong with a maximum TTL, or nil when nothing
// is.
func checkMaxTTL(d time.Duration) error {
	if d < MinTTL || d > lock.MaxTTL {
		return fmt.Errorf("%w: memory: maximum TTL %v (WithMaxTTL, URL parameter maxttl) must be at least %v and at most %v (lock.MaxTTL)", backend.ErrInvalid, d, MinTTL, lock.MaxTTL)
	}
	return nil
}

func (c *Backend) checkTTL(ttl time.Duration) error {
	if ttl < MinTTL {
		return fmt.Errorf("%w: memory: TTL %v is below the minimum of %v", backend.ErrInvalid, ttl, MinTTL)
	}
	if err := checkMaxTTL(c.maxTTL); err != nil {
		return err
	}
	if ttl > c.maxTTL {
		return fmt.Errorf("%w: memory: TTL %v is above this client's maximum of %v (WithMaxTTL, URL parameter maxttl)", backend.ErrInvalid, ttl, c.maxTTL)
	}
	return nil
}

// Acquire implements backend.Backend.
func (c *Backend) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := c.acquire(ctx, key, token, ttl)
	return g, c.replied(ctx, err)
}

func (c *Backend) acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if err := c.enter(ctx); err != nil {
		return backend.Grant{}, err
	}
	if err := c.checkTTL(ttl); err != nil {
		return backend.Grant{}, err
	}
	s := c.s
	sh := s.shard(key)
	sh.mu.Lock()
	now := s.now()
	if dead, _ := sh.deadToken(key, token, now); dead {
		sh.mu.Unlock()
		return backend.Grant{}, fmt.Errorf("%w: memory: acquire with a token that was released before; a token is for one acquisition", backend.ErrInvalid)
	}
	if e, ok := sh.locks[key]; ok && now < e.expires {
		if e.token != token && !e.waited {
			e.waited = true
			sh.locks[key] = e
		}
		sh.mu.Unlock()
		return backend.Grant{}, backend.Locked(e.expires - now)
	}
	fence := s.nextFence()
	sh.locks[key] = entry{token: token, fence: fence, expires: now + ttl, label: backend.Label(ctx)}
	sh.maybeSweep(now)
	sh.mu.Unlock()
	return backend.Grant{Fence: fence, TTL: ttl}, nil
}

func (s *Store) nextFence() uint64 {
	return s.fence.Add(1)
}

// maybeSweep drops expired entries when the shard has grown, so keys that
// were never released do not pile up. Amortised O(1) per acquisition.
func (sh *shard) maybeSweep(now time.Duration) {
	if len(sh.locks) < sh.sweepAt {
		return
	}
	for k, e := range sh.locks {
		if now >= e.expires {
			delete(sh.locks, k)
		}
	}
	sh.sweepAt = max(64, 2*len(sh.locks))
	clear(sh.released) // releases sent again come at once, if at all, in a process
	sh.sweepDead(now)
}

// Renew implements backend.Backend.
func (c *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	g, err := c.renew(ctx, key, token, ttl)
	return g, c.replied(ctx, err)
}

func (c *Backend) renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if err := c.enter(ctx); err != nil {
		return backend.Grant{}, err
	}
	if err := c.checkTTL(ttl); err != nil {
		return backend.Grant{}, err
	}
	s := c.s
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e, ok := sh.locks[key]
	live := ok && now < e.expires
	if !live || e.token != token {
		return backend.Grant{}, backend.ErrNotHeld
	}
	e.expires = now + ttl
	sh.locks[key] = e
	return backend.Grant{Fence: e.fence, TTL: ttl}, nil
}

// Release implements backend.Backend.
func (c *Backend) Release(ctx context.Context, key, token string) error {
	return c.replied(ctx, c.release(ctx, key, token))
}

func (c *Backend) release(ctx context.Context, key, token string) error {
	if err := c.enter(ctx); err != nil {
		return err
	}
	s := c.s
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e, ok := sh.locks[key]
	if !ok || e.token != token {
		if dead, held := sh.deadToken(key, token, now); dead {
			if held {
				return nil // sent again after it took effect
			}
			return backend.ErrNotHeld
		}
		// Kill it all the same: its acquire may still be on its way.
		sh.kill(s, key, token, false, now)
		return backend.ErrNotHeld
	}
	delete(sh.locks, key)
	if now >= e.expires {
		sh.kill(s, key, token, false, now)
		return backend.ErrNotHeld // it had expired: the caller had lost it
	}
	sh.kill(s, key, token, true, now)
	sh.wakeFirst(key)
	return nil
}

// Transfer implements backend.Transferer. An Acquire that finds the key held
// by another token marks the lock as waited for; a marked lock is not passed
// on without a reserved fence (ErrTransferRefused), nor does it reserve one,
// so that it goes back to the store at the next release and the waiter gets
// its chance. Package lock never transfers on a store in its own process
// (Capabilities.InProcess); servers built on a Store, such as package
// netstore, serve it.
func (c *Backend) Transfer(ctx context.Context, key, from, to string, ttl time.Duration, opt backend.TransferOptions) (backend.Transferred, error) {
	t, err := c.transfer(ctx, key, from, to, ttl, opt)
	return t, c.replied(ctx, err)
}

func (c *Backend) transfer(ctx context.Context, key, from, to string, ttl time.Duration, opt backend.TransferOptions) (backend.Transferred, error) {
	if err := c.enter(ctx); err != nil {
		return backend.Transferred{}, err
	}
	if err := c.checkTTL(ttl); err != nil {
		return backend.Transferred{}, err
	}
	s := c.s
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	if dead, _ := sh.deadToken(key, to, now); dead {
		// A transfer that arrives after the release that undid it.
		return backend.Transferred{}, fmt.Errorf("%w: memory: transfer to a token that was released before; a token is for one acquisition", backend.ErrInvalid)
	}
	e, ok := sh.locks[key]
	switch {
	case !ok || now >= e.expires:
		return backend.Transferred{}, sh.notFrom(key, from, now)
	case e.token == to:
		// Sent again after it took effect: report it, reserve nothing.
		return backend.Transferred{Fence: e.fence, TTL: ttl}, nil
	case e.token != from:
		return backend.Transferred{}, sh.notFrom(key, from, now)
	}
	fence := opt.Fence
	if fence == 0 {
		if e.waited {
			return backend.Transferred{}, backend.ErrTransferRefused
		}
		fence = s.nextFence()
	}
	var next uint64
	if opt.Reserve && !e.waited {
		next = s.nextFence() // above every fence so far, below every later one
	}
	sh.locks[key] = entry{token: to, fence: fence, expires: now + ttl, waited: e.waited, label: backend.Label(ctx)}
	sh.kill(s, key, from, true, now) // from handed its lock on: it died holding it
	return backend.Transferred{Fence: fence, TTL: ttl, Next: next}, nil
}

// notFrom is a transfer's answer when from does not hold the lock:
// ErrNotHeld, unless from handed the lock on (or released it) before. Then
// the transfer was sent again after it took effect, and to's lock has
// ended: from held the lock until it handed it on, so the answer must not
// be "not held" (see backend.Transferer). sh.mu must be held.
func (sh *shard) notFrom(key, from string, now time.Duration) error {
	if dead, held := sh.deadToken(key, from, now); dead && held {
		return backend.ErrHandedOnBefore
	}
	return backend.ErrNotHeld
}

// wakeFirst wakes the longest-waiting watcher of key. Waking one waiter per
// release, in arrival order, instead of all of them keeps a queue of
// thousands of waiters from stampeding at every release; watch.Close passes
// the wake-up on when a waiter leaves while the key is free.
func (sh *shard) wakeFirst(key string) {
	if ws := sh.watchers[key]; ws != nil {
		ws.Front().Value.(*watch).notify()
	}
}

// Inspect implements backend.Inspector.
func (c *Backend) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	if err := c.enter(ctx); err != nil {
		return backend.Holder{}, err
	}
	sh := c.s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := c.s.now()
	e, ok := sh.locks[key]
	if !ok || now >= e.expires {
		return backend.Holder{}, nil
	}
	return backend.Holder{Held: true, Token: e.token, Fence: e.fence, Remaining: max(0, e.expires-now), Label: e.label}, nil
}

// Watch implements backend.Notifier. A release wakes the longest-waiting
// watcher of the key; a watcher that closes while the key is free passes the
// wake-up on to the next; a restart wakes them all. Expiry wakes no one: the
// waiter's own timer, capped by package lock at the holder's remaining TTL,
// finds it.
func (c *Backend) Watch(ctx context.Context, key string) (backend.Watch, error) {
	if err := c.enter(ctx); err != nil {
		return nil, err
	}
	sh := c.s.shard(key)
	w := &watch{s: c.s, sh: sh, key: key, ch: make(chan struct{}, 1)}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.watchers == nil {
		sh.watchers = make(map[string]*list.List)
	}
	ws := sh.watchers[key]
	if ws == nil {
		ws = list.New()
		sh.watchers[key] = ws
	}
	w.elem = ws.PushBack(w)
	return w, nil
}

type watch struct {
	s    *Store
	sh   *shard
	key  string
	ch   chan struct{}
	elem *list.Element // nil once closed
}

func (w *watch) C() <-chan struct{} { return w.ch }

func (w *watch) notify() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

func (w *watch) Close(took bool) error {
	sh := w.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if w.elem == nil {
		return nil
	}
	ws := sh.watchers[w.key]
	ws.Remove(w.elem)
	w.elem = nil
	if ws.Len() == 0 {
		delete(sh.watchers, w.key)
		return nil
	}
	if e, ok := sh.locks[w.key]; !took && (!ok || w.s.now() >= e.expires) {
		sh.wakeFirst(w.key) // the key is free: let the next waiter try
	}
	return nil
}

// gate blocks callers while closed.
type gate struct {
	mu     sync.Mutex
	closed atomic.Bool
	ch     chan struct{} // closed when the gate opens again
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed.Load() {
		g.ch = make(chan struct{})
		g.closed.Store(true)
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed.Load() {
		close(g.ch)
		g.ch = nil
		g.closed.Store(false)
	}
}

func (g *gate) wait(ctx context.Context) error {
	if !g.closed.Load() {
		return nil
	}
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// The stores of mem://NAME URLs, each with the number of its clients
// opened from a URL and not yet closed.
var (
	namedMu sync.Mutex
	named   = map[string]*namedStore{}
)

type namedStore struct {
	s       *Store
	clients int
}

func init() {
	lock.Register("mem", []string{"maxttl"}, func(ctx context.Context, u *url.URL) (backend.Backend, error) {
		q := u.Query()
		maxTTL := DefaultMaxTTL
		if v, ok := q["maxttl"]; ok {
			d, err := time.ParseDuration(v[0])
			if err != nil || checkMaxTTL(d) != nil {
				return nil, fmt.Errorf("%w: mem: maxttl=%q: want a Go duration of at least %v and at most %v (lock.MaxTTL), such as 1m", backend.ErrInvalid, v[0], MinTTL, lock.MaxTTL)
			}
			maxTTL = d
			q.Del("maxttl")
		}
		if len(q) > 0 {
			return nil, fmt.Errorf("%w: mem: unexpected query %q", backend.ErrInvalid, q.Encode())
		}
		if u.User != nil {
			return nil, fmt.Errorf("%w: mem: a memory store takes no user or password; want mem://NAME", backend.ErrInvalid)
		}
		name := u.Host + u.Path
		if u.Opaque != "" {
			name = u.Opaque
		}
		if name == "" {
			c := New()
			c.maxTTL = maxTTL
			return c, nil
		}
		namedMu.Lock()
		defer namedMu.Unlock()
		n := named[name]
		if n == nil {
			n = &namedStore{s: NewStore()}
			named[name] = n
		}
		n.clients++
		c := n.s.NewBackend()
		c.maxTTL = maxTTL
		c.onClose = func() {
			namedMu.Lock()
			defer namedMu.Unlock()
			if n.clients--; n.clients == 0 {
				delete(named, name)
			}
		}
		return c, nil
	})
}
