// Package redis is the Redis backend of package lock: a single Redis
// deployment (standalone, Sentinel failover, or Cluster, through any go-redis
// v9 client) with New, and Redlock over several independent Redis nodes with
// NewRedlock. Application code should use package lock; this package provides
// the store.
//
//	rdb := goredis.NewClient(&goredis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
//	locks, err := lock.New(redis.New(rdb))
//
// # How it works
//
// Acquire is one Lua script, one round trip: if the lock key is free it
// increments the key's fence counter and sets the key to the owner token with
// a PX expiry; if not, it returns the holder's remaining PTTL, so waiters
// sleep no longer than needed. The counter key is hash-tagged with the lock
// key ("lock:{KEY}" and "lock:{KEY}:fence"), so Redis Cluster keeps both in
// one slot. Renew and release are compare-by-token scripts.
//
// Waiting Acquires queue in Redis (see queue.go for what its primitives
// guarantee, and package backend/waitq for the argument): one that finds
// the key held puts its place in the key's queue in the same script, and
// the release script hands the lock to the oldest waiter whose place is
// alive, counting the waiter's validity from its own queueing request, and
// publishes the handover to that waiter's process alone. A release wakes
// one waiter, which holds the lock without a request of its own; waiters of
// every process are served in the order they queued (FIFO, declared in
// Capabilities), and TryAcquire does not take a free key ahead of them. A
// waiter is never handed a lock for longer than it asked for: the handed
// lock's expiry is the waiter's record's remaining expiry, and the record
// lives at most the waiter's own TTL (at most WithMaxTTL) after its latest
// attempt or refresh. A waiter whose process dies while queued thus
// delays the one behind it by at most its TTL when the holder releases,
// and by its TTL plus a third of the next waiter's when the holder dies
// too (both bounded by WithMaxTTL). A release hands the dead waiter the lock, which
// expires at most its TTL after its last refresh (before it died), and
// the waiter behind it, first now, learns that expiry from its own
// refresh (every third of its own TTL) and takes the key then: within
// max(the dead waiter's TTL, a third of its own) after the release, plus
// a round trip. If the holder's lock expires instead, nothing is handed
// over: the dead waiter's place stays first until its record expires;
// the one behind it drops it at its next refresh (refreshScript, every
// third of its TTL), finds itself first and takes the key: at most that
// long, plus a round trip, after both the holder's lock and the dead
// waiter's record expired.
// Redlock does not queue: its waiters subscribe to release messages and
// wake at once instead of polling. Scripts run with EVALSHA and fall back
// to EVAL when the server's script cache was flushed. An acquire that
// go-redis retried after a lost reply finds its own token and reports the
// lock as taken.
//
// Concurrent calls share round trips: while four requests are on the wire,
// further calls queue and go out together as one pipeline when a request
// comes back, so the system calls per script fall with the load (Redlock:
// on each node). A single goroutine sends one request per call.
//
// The backend implements backend.Transferer: package lock hands a released
// lock to the next goroutine of the same client waiting for the key, and
// each transfer reserves the fence of the holder after it, so that later
// handoffs start ahead of the store (see lock.Client.Acquire). A waiter in
// another process marks the lock it finds held; a marked lock is not
// transferred without a reserved fence, and its release publishes a
// wake-up.
//
// # Guarantees by server configuration
//
//	configuration              | lock survives restart | fence after restart | safe when
//	---------------------------|-----------------------|---------------------|------------------------
//	no persistence             | no                    | restarts at 1: NOT  | never restarted, or
//	                           |                       | monotonic           | restarts delayed > TTL
//	                           |                       |                     | and fences not relied on
//	AOF, appendfsync everysec  | up to 1s of writes    | may repeat the last | a crash loses no more
//	                           | may be lost           | second's fences     | than 1s: not for fences
//	AOF, appendfsync always    | yes                   | strictly increasing | always (declare it with
//	                           |                       |                     | WithDurableFence)
//	replica + failover         | no: replication is    | may repeat          | never for strict safety;
//	(Sentinel, Cluster)        | asynchronous          |                     | use Redlock or etcd
//
// Redlock has its own safe configuration (see Redlock): every node with
// appendfsync always or with no persistence at all, one node back empty at
// a time, TTLs up to WithMaxTTL.
//
// Redis expires keys by its own wall clock: a server clock stepped forward
// expires locks early. Without persistence, a restarted server forgets every
// lock at once: delay restarts by the longest TTL in use.
//
// # Keys and their footprint
//
// Per lock key, the backend writes the lock "PREFIX{KEY}" (with the
// lease's expiry), "PREFIX{KEY}:h" with the holder's label while a
// holder that gave one holds it (expires with the lock; see label.go),
// "PREFIX{KEY}:next" while a handover reserved a fence (expires with the
// lock), the waiters' queue "PREFIX{KEY}:q" and one
// record "PREFIX{KEY}:w:ID" per waiter while any wait (each expires a TTL
// after its waiter's last refresh), "PREFIX{KEY}:dead:TOKEN" per release (a
// tombstone of about 100 bytes that lives 15 seconds), and the fence
// counter "PREFIX{KEY}:fence", which has no expiry: a fence must be greater
// than every fence granted before for the key, also after the lock itself
// has expired and been forgotten. That is one Redis key per distinct lock
// key, forever (Redis 7's MEMORY USAGE: 88 bytes for
// "lock:{job:nightly-report}:fence", 56 for "lock:{x}:fence": about 40
// plus the name, in allocator size classes). An
// application that locks a bounded set of keys (jobs, accounts) pays that
// once; one that locks unbounded key names (request ids) grows Redis's
// memory without bound.
//
// WithSlotFenceCounters (URL parameter slotfences=true) bounds it: fences
// then come from one counter per Redis Cluster hash slot,
// "PREFIX{T}:slotfence" with T a short tag in the lock key's slot (so that
// a script's keys stay in one slot on Redis Cluster): at most 16,384
// counter keys per prefix, whatever the number of lock keys (72 bytes
// each, 1.2 MB at most),
// and "PREFIX{KEY}:fence" only records the holder's fence, expiring with
// the lock. Fences stay strictly increasing per key because every grant of
// a key takes its fence from its slot's counter, which only grows (other
// keys of the slot make it skip values). It assumes what the default mode
// assumes, that the counters survive (appendfsync always, and a maxmemory
// policy that never evicts keys without expiry), and also that every client
// of a prefix uses the same mode. Switching a deployment on is safe: the
// first grant of a key reads the key's own counter, if the default mode
// left one, and raises the slot's counter above it. Switching back is not.
// A prefix with a '{' that no '}' closes cannot share counters; its keys
// keep one each.
//
// KEY is the lock's key with each '}' written as the byte 0xff, which a
// key of valid UTF-8 never holds: KEY is then the hash tag of every key and
// channel of the lock (Redis Cluster keeps them in one slot), and two
// distinct keys never share one. Earlier versions stored a key with a '{'
// or a '}' under its SHA-1 in hex instead, which was also the plain key
// equal to that hex string: two keys, one lock. On keys with braces, a
// client of an earlier version and one of this version do not see each
// other's locks, and fences start again from the new counter: upgrade
// every client of a deployment at once (or stop the old holders first),
// and have a resource fenced on such keys start its highest-fence record
// again. Keys without braces keep their layout.
//
// # Contexts and failures
//
// Every call returns when its context ends, however the go-redis client was
// built. A client with ContextTimeoutEnabled ends its socket reads at the
// context's deadline on its own; for a client without it (go-redis's
// default), and for a context without a deadline that can be cancelled,
// the request runs on a goroutine of its own and the call returns when the
// context ends (the request goes on until go-redis's read timeout; its
// outcome is unknown, which package lock undoes). Build clients with
// ContextTimeoutEnabled: calls under a deadline then cost no goroutine.
//
// Clients opened from a URL have ContextTimeoutEnabled, dial once per
// attempt instead of go-redis's five (an unreachable server is reported
// in about 0.1s instead of 1.6s), and end a TLS handshake with the
// context.
//
// # Logging
//
// go-redis has one logger for the whole process, which writes to stderr
// by default: several lines per call while a server is unreachable. This
// package leaves it as it is: neither lock.Open nor any other call of this
// package replaces it. A program (a library should leave the choice to
// its program) installs this package's logger explicitly, once, before it
// opens backends:
//
//   - SetQuietGoRedisLogger drops go-redis's messages about the clients
//     this package created (backends opened from a URL: their failures
//     reach the caller as errors) and prints the others to stderr as
//     go-redis does.
//   - SetGoRedisLogger routes all of go-redis's messages, from every
//     client in the process, to a log/slog logger, or drops them.
//
// Either replaces a logger set with goredis.SetLogger before it, and a
// later goredis.SetLogger replaces it: the last call wins. Backends over
// your own clients (New, NewRedlock) log as go-redis does unless you call
// SetGoRedisLogger.
//
// # URLs
//
// redis://[user:password@]host:port[/db], rediss:// (TLS) and
// unix://[user:password@]/path/to/socket?db=N, in go-redis's own format and
// with its options, plus these parameters on every scheme: prefix (key
// prefix, default "lock:"), durablefence (true when the server runs with
// appendfsync always), slotfences (WithSlotFenceCounters) and maxttl (the
// longest TTL granted, WithMaxTTL: a Go duration from 10ms to 8760h,
// lock.MaxTTL; default 1m), and on redis, rediss, unix and the Sentinel
// schemes sessions (WithSessions: the leases of one TTL renewed together,
// see session.go).
//
// redis+cluster://[user:password@]host1:port,host2:port,... (rediss+cluster
// with TLS) opens a Redis Cluster from any of its nodes, with go-redis's
// cluster options (ParseClusterURL: addr, max_redirects, read_timeout,
// ...). Its lock, counter and tombstone keys share the lock key's hash slot,
// so no script crosses slots.
//
// redis+sentinel://[user:password@]sentinel1:26379,...[/db]?master_name=NAME
// (rediss+sentinel with TLS) opens the master that Redis Sentinel names,
// with go-redis's failover options (ParseFailoverURL), except those that
// send commands to replicas. A failover can lose locks (replication is
// asynchronous; see the table).
//
// redlock://host1:port,host2:port,host3:port (redlocks:// with TLS to every
// node) builds a Redlock over those nodes, with parameters prefix,
// durablefence, slotfences, maxttl, username, password, db, nodetimeout and
// allowfewnodes. nodetimeout, the bound of each node's request (default a
// tenth of the TTL, between 10ms and 1s), is a positive Go duration of at
// most maxttl. Opening it fails (ErrInvalid) when two nodes are the same
// server once host names are resolved, and when it names fewer than 3
// nodes unless allowfewnodes=true. It takes no path: the database is db=N.
//
// # Credentials and TLS in URLs
//
// The password is a secret: lock.RedactURL and the errors of lock.Open
// hide it wherever the URL gives it, and no error of this package quotes
// it. Each scheme takes the credentials one way or the other, not both:
//
//	scheme                           credentials (user name, password)
//	redis, rediss, unix              user:password@, or username= and password=
//	redis+cluster, rediss+cluster    the same, for every node
//	redlock, redlocks                the same, for every node
//	redis+sentinel, rediss+sentinel  the master's: username= and password=;
//	                                 the Sentinels': user:password@, or
//	                                 sentinel_username= and sentinel_password=
//
// Secret parameters: password, sentinel_password.
//
// The TLS schemes, rediss, rediss+cluster, rediss+sentinel and redlocks,
// take the TLS parameters that every backend of package lock shares
// (lock.TLSParams):
//
//	ca_file      PEM file of the CAs to trust instead of the system's
//	cert_file    PEM file of a client certificate, for a server with
//	             tls-auth-clients yes (with key_file)
//	key_file     PEM file of the client certificate's key (with cert_file)
//	server_name  the name each server's certificate must carry; default:
//	             the host of each address dialled, so every node of a
//	             Cluster, of a Sentinel set (Sentinels and master) and of a
//	             Redlock is verified under its own host
//	skip_verify  true: no certificate check at all; for tests only
//
// The TLS configuration speaks TLS 1.2 or later and is the same for every
// server of a URL (Sentinels and master alike). The plain schemes refuse
// the TLS parameters (ErrInvalid, naming the parameter and the scheme to
// use instead), and so does unix://.
package redis

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/backend/waitq"
)

// Conn is the narrowest go-redis interface the backend needs: its way to the
// store (named apart from lock.Client, which manages locks). Every go-redis
// v9 client kind satisfies it: *goredis.Client (standalone or Sentinel
// failover), *goredis.ClusterClient, *goredis.Ring and
// goredis.UniversalClient. A Ring shards keys across independent servers
// without failover: each key lives on one server, so it behaves as a single
// node per key.
type Conn interface {
	goredis.Scripter
	Subscriber
}

// DefaultPrefix is prepended to every key the backend writes.
const DefaultPrefix = "lock:"

// MinTTL is the shortest TTL the backend accepts. Redis counts expiry in
// milliseconds; below 10ms a round trip is a large part of the lease.
const MinTTL = 10 * time.Millisecond

// Option configures a backend.
type Option func(*options)

type options struct {
	prefix       string
	durableFence bool
	nodeTimeout  time.Duration
	maxTTL       time.Duration
	ownClients   bool
	fewNodes     bool
	slotFences   bool
	maxWaiters   int  // see WithMaxWaiters, in queue.go
	sessions     bool // see WithSessions, in session.go
}

func defaultOptions() options {
	return options{prefix: DefaultPrefix, maxTTL: DefaultMaxTTL, maxWaiters: DefaultMaxWaiters}
}

// DefaultMaxTTL is the longest TTL a backend of this package grants
// (single node, Cluster, Sentinel and Redlock) unless WithMaxTTL says
// otherwise: lock.DefaultMaxTTL, which says why.
const DefaultMaxTTL = time.Minute

// WithMaxTTL sets the longest TTL the backend grants (default
// DefaultMaxTTL), at least MinTTL and at most lock.MaxTTL; the URL
// parameter maxttl sets it on every scheme. Capabilities reports it, so
// package lock refuses a longer TTL (ErrInvalidTTL) before sending
// anything, and the backend's own calls refuse one too (ErrInvalid). It
// bounds how long a holder that crashed, or a waiter killed while queued
// and then handed the lock, blocks the key. A Redlock's node that comes
// back empty waits this long before it votes again, so that every lock it
// forgot has expired (see Redlock). NewRedlock refuses a value out of
// range; New cannot refuse anything, so the single-node backend's calls
// fail with ErrInvalid, saying why, instead.
func WithMaxTTL(d time.Duration) Option { return func(o *options) { o.maxTTL = d } }

// WithPrefix sets the prefix of every key the backend writes. Default
// DefaultPrefix.
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithDurableFence declares that the server (every node, for Redlock) runs
// with appendonly yes and appendfsync always, so fences stay strictly
// increasing across restarts. It changes nothing on the server; it makes the
// backend's Capabilities say so.
func WithDurableFence(on bool) Option { return func(o *options) { o.durableFence = on } }

// WithNodeTimeout bounds each Redlock node's request. Default: a tenth of the
// TTL, between 10ms and 1s. NewRedlock refuses one above the maximum TTL
// (WithMaxTTL): a node's request may not outlast every lease. Ignored by the single-node backend, where the
// caller's context bounds the request.
func WithNodeTimeout(d time.Duration) Option { return func(o *options) { o.nodeTimeout = d } }

// WithSlotFenceCounters makes fences come from one counter per Redis
// Cluster hash slot instead of one per lock key: at most 16,384 counter
// keys per prefix, however many lock keys an application uses, with fences
// still strictly increasing per key (they skip values). Every client of a
// prefix must use the same setting; switching a deployment on is safe,
// switching it off is not. See "Fence counters and their footprint" in the
// package doc. The URL parameter slotfences=true sets it.
func WithSlotFenceCounters(on bool) Option { return func(o *options) { o.slotFences = on } }

// MinNodes is the fewest nodes NewRedlock accepts without
// WithAllowFewNodes: three nodes are the fewest with which a Redlock
// survives the loss of one.
const MinNodes = 3

// WithAllowFewNodes lets NewRedlock build a Redlock over 1 or 2 nodes. Such
// a Redlock is as safe as one over more nodes, but no node may fail: with 2
// nodes both must answer, so it is less available than one server. The URL
// parameter allowfewnodes=true sets it. Ignored by the single-node backend.
func WithAllowFewNodes(on bool) Option { return func(o *options) { o.fewNodes = on } }

// withOwnClients is for backends opened from a URL, which own their
// go-redis clients: Close closes them, and go-redis's messages about them
// are dropped once the program installed SetQuietGoRedisLogger.
func withOwnClients() Option { return func(o *options) { o.ownClients = true } }

// Backend is the single-deployment Redis backend. It implements
// backend.Backend, backend.Queuer (and so backend.Notifier),
// backend.Transferer, backend.Describer and backend.Inspector.
type Backend struct {
	id     string // names the backend's queue channels (see queue.go)
	rdb    Conn
	batch  *batcher
	opts   options
	notify *notifier
	queues *waitq.Group
	closed atomic.Bool
	// sc is the scripts of the backend's mode; sessions is nil without
	// sessions, and refused says why the backend cannot have the
	// sessions it was asked for (see session.go).
	sc       *scriptSet
	sessions *sessions
	refused  error
}

var (
	_ backend.Backend    = (*Backend)(nil)
	_ backend.Notifier   = (*Backend)(nil)
	_ backend.Describer  = (*Backend)(nil)
	_ backend.Inspector  = (*Backend)(nil)
	_ backend.Transferer = (*Backend)(nil)
	_ backend.Queuer     = (*Backend)(nil)
)

// New returns a backend over rdb. The backend does not close rdb unless it
// was opened from a URL.
func New(rdb Conn, opts ...Option) *Backend {
	o := defaultOptions()
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	var id [8]byte
	crand.Read(id[:])
	b := &Backend{id: hex.EncodeToString(id[:]), rdb: rdb, batch: newBatcher(rdb, o.ownClients), opts: o, notify: newNotifier(o.ownClients, rdb), queues: waitq.NewGroup(), sc: plainScripts}
	if b.refused = sessionsRefused(rdb, o); o.sessions && b.refused == nil {
		b.sc, b.sessions = sessionScripts, newSessions(b)
	}
	return b
}

// keys returns the Redis keys of a lock: the lock key "PREFIX{TAG}" and its
// fence counter "PREFIX{TAG}:fence". Every other key and channel of the
// lock is the lock key with a suffix, made by the functions below (the
// scripts get them as KEYS or ARGV and derive none), so all of them share
// the hash tag TAG: Redis Cluster keeps them in one slot, and no script
// crosses slots.
//
// TAG is the user's key with each '}' written as the byte 0xff: a '}'
// would end the hash tag early, and a '{' inside the tag changes nothing
// (Redis takes the tag from the first '{' to the first '}' after it). The
// mapping is injective: package lock passes only keys of valid UTF-8 (see
// package backend), in which the byte 0xff never occurs, so TAG gives the
// key back; and since TAG holds no '}', the first '}' after "PREFIX{" ends
// it in every key of every lock: two distinct keys share no Redis key
// and no channel (and the suffixes of one lock differ from each other).
//
// Both keys share one allocation.
func keys(prefix, key string) (lockKey, fenceKey string) {
	fenceKey = prefix + "{" + strings.ReplaceAll(key, "}", "\xff") + "}" + fenceSuffix
	return fenceKey[:len(fenceKey)-len(fenceSuffix)], fenceKey
}

// fenceSuffix ends the name of a lock's fence counter.
const fenceSuffix = ":fence"

// fenceKeyOf returns the fence counter of a lock key (see keys).
func fenceKeyOf(lockKey string) string { return lockKey + fenceSuffix }

// slotFenceKey returns the fence counter of lockKey's slot with
// WithSlotFenceCounters (see fence.go), or "" for a counter per key.
func (o *options) slotFenceKey(lockKey string) string {
	if !o.slotFences {
		return ""
	}
	return slotFenceKey(o.prefix, lockKey)
}

// renewKeys returns the keys of renewScript for key: the lock and the keys
// that expire with it (the holder key among them: see label.go).
func (o *options) renewKeys(key string) []string {
	lk, fk := keys(o.prefix, key)
	if o.slotFenceKey(lk) != "" {
		return []string{lk, nextKeyOf(lk), holderKeyOf(lk), fk}
	}
	return []string{lk, nextKeyOf(lk), holderKeyOf(lk)}
}

// nextKeyOf returns the key that records the fence reserved for the next
// holder of a lock (see transferScript).
func nextKeyOf(lockKey string) string { return lockKey + ":next" }

// deadKeyOf returns the tombstone key of a released token (see Dead tokens).
func deadKeyOf(lockKey, token string) string { return lockKey + ":dead:" + token }

// deadTokenTTL is the life of a released token's tombstone: longer than
// go-redis takes to send a request again after a lost reply (three retries
// of at most 512ms backoff and a 3s read timeout each). The price: one key
// of about 100 bytes per release, for that long (at 50,000 releases a
// second, about 75 MB), and the server's work to create and expire it.
const deadTokenTTL = 15 * time.Second

// deadMs is deadTokenTTL in milliseconds, as the release script takes it.
var deadMs = ms(deadTokenTTL)

// channelOf returns the channel a lock's releases are published on.
func channelOf(lockKey string) string { return lockKey + ":released" }

// queueKeyOf returns the key of a lock's queue of waiters (see queue.go).
func queueKeyOf(lockKey string) string { return lockKey + ":q" }

// recordPrefixOf returns the prefix of a lock's waiter records: the
// record of the place ID is the prefix followed by ID.
func recordPrefixOf(lockKey string) string { return lockKey + ":w:" }

// ms converts a TTL to whole milliseconds, rounding up: the store never
// expires a lock before the requested TTL.
func ms(ttl time.Duration) int64 {
	return int64((ttl + time.Millisecond - 1) / time.Millisecond)
}

// A waiter marks the lock it found held by appending "+" to the holder's
// token; the release script publishes a wake-up only for a marked lock, so
// uncontended locks pay nothing for wake-ups. Scripts compare tokens with
// and without the mark.
//
// # Dead tokens
//
// A token is used for one acquisition attempt. Releasing it kills it: the
// release script, whether or not the token held the lock, leaves a tombstone
// key for the token (deadKeyOf) that lives deadTokenTTL. A transfer that
// hands the lock on kills its from token the same way (see
// transferScript). The acquire scripts
// refuse a dead token, and a release of a token that died holding the lock
// answers "released" again. Why: requests are not always executed in the order
// they were sent. go-redis sends a request again on a new connection after a
// lost reply while the first may still be queued; an acquire whose caller gave
// up (context ended while it was in a pipeline, or a Redlock node answered too
// late) is undone by a release sent on another connection, which the server
// may run first. Without the tombstone, such an acquire landing after its undo
// takes the lock for a whole TTL with nobody to release it, and a release
// landing twice reports a lock held until its release as lost. With it, order
// on the wire does not matter while the tombstone lives: the late acquire is
// refused, the second release succeeds. A request delayed on the wire longer
// than the tombstone lives can still take the lock; it then expires after its
// TTL.
var (
	// acquireScript: KEYS = lock, fence, dead token, next (see
	// transferScript), holder key (see label.go)[, the slot's fence
	// counter (see fence.go)]; ARGV = token, ttl ms[, the queue and its
	// record prefix (see queue.go)[, the label ('' for none)]]. Returns the fence (> 0) when it took the lock, or
	// minus the holder's PTTL (<= 0) after marking the lock as waited
	// for, or the error DEAD for a released token. With the queue, a free
	// key is not taken while a place with a live record queues: the
	// script wakes the first such place and returns 0. A request that finds
	// its own token (go-redis sent it again after a lost reply; the first
	// one took the lock) returns the fence the first one got and sets the
	// expiry to the TTL from now, as a new grant would: whoever counts a
	// deadline from this request's send time stays within the store's
	// expiry.
	//
	// One EXISTS of the token's tombstone and the queue answers the common
	// case, a live token and no queue, in one command; only when one of
	// them exists does the script ask which.
	//
	// The search for a live place drops at most scanBound dead ones (see
	// Bounded work in queue.go); past that, the script answers as if
	// others queued (0), and the caller's next attempt goes on.
	//
	// With the slot's counter, the fence is its INCR, raised above the
	// key's own counter if one is left from the default mode; the key's
	// fence key then records the holder's fence, with the lock's expiry.
	// The next key, when there is one, expires with the lock in both
	// modes.
	acquireScript = goredis.NewScript(plainScript(acquireLua))

	// renewScript: KEYS = lock, then the keys that expire with it (the
	// next key, the holder key; with slot counters, the fence key); ARGV
	// = token, ttl ms.
	// Returns 1, or 0 when token does not hold the lock. With sessions, it
	// brings a lock handed to token into its session (see place.confirm).
	renewScript = goredis.NewScript(plainScript(renewLua))

	// transferScript: see transferLua.
	transferScript = goredis.NewScript(plainScript(transferLua))

	// inspectScript: KEYS = lock, fence, next, holder key. Returns {} or
	// {token, pttl, the holder's fence, its label}: the holder key's label
	// when the key names the holder's token, else '' (see label.go).
	inspectScript = goredis.NewScript(plainScript(inspectLua))
)

// The scripts' Lua text, which the helpers of the backend's mode precede
// (sessionLua), or which plainScript writes out (see session.go).
const (
	acquireLua = `
local n
if ARGV[3] then
  n = redis.call('EXISTS', KEYS[3], ARGV[3])
else
  n = redis.call('EXISTS', KEYS[3])
end
if n > 0 and redis.call('EXISTS', KEYS[3]) == 1 or buried(ARGV[1]) then
  return redis.error_reply('DEAD token released before')
end
if not join(ARGV[1], ARGV[2]) then
  return redis.error_reply('ENDED session ended')
end
if n > 0 and not live(KEYS[1]) then
  for i = 1, ` + scanBound + ` do
    local h = redis.call('ZRANGE', ARGV[3], 0, 0)[1]
    if not h then break end
    local r = redis.call('GET', ARGV[4] .. h)
    local sp = r and string.find(r, ' ', 1, true)
    if sp then
      redis.call('PUBLISH', string.sub(r, sp + 1), 'w:' .. h)
      return 0
    end
    redis.call('ZREM', ARGV[3], h)
    if i == ` + scanBound + ` then return 0 end
  end
end
local took = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', span(ARGV[1], ARGV[2]))
local v
if not took then
  v = live(KEYS[1])
  if not v then
    took = redis.call('SET', KEYS[1], ARGV[1], 'PX', span(ARGV[1], ARGV[2]))
  end
end
if took then
  enter(KEYS[1], ARGV[1])
  if ARGV[5] and ARGV[5] ~= '' then
    redis.call('SET', KEYS[5], ARGV[1] .. ' ' .. ARGV[5], 'PX', span(ARGV[1], ARGV[2]))
  end
  if KEYS[6] then
    local f = redis.call('INCR', KEYS[6])
    local old = tonumber(redis.call('GET', KEYS[2]) or '0')
    if old >= f then
      f = old + 1
      redis.call('SET', KEYS[6], f)
    end
    redis.call('SET', KEYS[2], f, 'PX', ARGV[2])
    return f
  end
  return redis.call('INCR', KEYS[2])
end
if v == ARGV[1] or v == ARGV[1] .. '+' then
  redis.call('PEXPIRE', KEYS[1], span(v, ARGV[2]))
  redis.call('PEXPIRE', KEYS[4], span(v, ARGV[2]))
  redis.call('PEXPIRE', KEYS[5], span(v, ARGV[2]))
  if KEYS[6] then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  local c = redis.call('GET', KEYS[2])
  if redis.call('GET', KEYS[4]) == c then
    return tonumber(c) - 1
  end
  return tonumber(c)
end
if string.byte(v, -1) ~= 43 then
  redis.call('APPEND', KEYS[1], '+')
end
local p = pttl(KEYS[1], v)
if p < 0 then p = 0 end
return -p`

	renewLua = `
local v = live(KEYS[1])
if v ~= ARGV[1] and v ~= ARGV[1] .. '+' then
  return 0
end
if not join(v, ARGV[2]) then
  return 0
end
enter(KEYS[1], v)
for i = 2, #KEYS do
  redis.call('PEXPIRE', KEYS[i], span(v, ARGV[2]))
end
return redis.call('PEXPIRE', KEYS[1], span(v, ARGV[2]))`
)

var (

	// releaseNotHeldLua ends the release scripts, for a token that does
	// not hold the lock (KEYS[2]: its tombstone; ARGV[2]: tombstone ms):
	// the answer of a release of it that took effect before (its
	// tombstone's 1), else 0, and the token is dead from now on.
	releaseNotHeldLua = `
local d = redis.call('GET', KEYS[2])
if d then
  return tonumber(d)
end
redis.call('SET', KEYS[2], '0', 'PX', ARGV[2])
return 0`

	// releaseScript (Redlock's): KEYS = lock, dead token, holder key (see
	// label.go); ARGV = token, tombstone ms, the lock's channel, release
	// id. Returns 1 when it deleted the lock (and its holder key) or had
	// deleted it before (the token's tombstone says so), 0 when token did
	// not hold it. It kills the token either
	// way (see Dead tokens). When a waiter marked the lock it publishes
	// the release id on the lock's channel: Redlock sends one id to all
	// nodes, so that waiters wake once per release.
	releaseScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or v == ARGV[1] .. '+' then
  redis.call('DEL', KEYS[1], KEYS[3])
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  if v ~= ARGV[1] then
    redis.call('PUBLISH', ARGV[3], ARGV[4])
  end
  return 1
end
` + releaseNotHeldLua)

	// transferScript: KEYS = lock, fence, next, to's tombstone, from's
	// tombstone, holder key (see label.go)[, the slot's fence counter];
	// ARGV = from token, to token, ttl ms, fence reserved for to (0: take
	// a new one), reserve ('1': reserve a fence for the owner after to),
	// tombstone ms, to's label ('' for none: from's is deleted). Returns {-2},
	// changing nothing, when to is dead (released before: a transfer that
	// arrives after the cleanup of its unknown outcome); {-3} when from
	// does not hold the lock and is dead (it handed the lock on, or
	// released it, before); {0} when from does not hold the lock; {-1}
	// when a waiter marked it and no fence was reserved (the lock is then
	// left alone); otherwise {to's fence, the reserved fence or 0}. A
	// marked lock passed on with a reserved fence stays marked, and
	// nothing is reserved on it.
	//
	// A reservation raises the counter past the holder's fence; the next
	// key records it, with the lock's expiry, so that Inspect can still
	// report the holder's fence (the counter minus one while next equals
	// the counter; any later grant raises the counter past a stale next).
	// With the slot's counter, fences come from it, and the fence key
	// records to's fence, with the lock's expiry (next never equals it).
	//
	// A transfer sent again after it took effect (go-redis retried it
	// after a lost reply) finds to holding the lock and returns to's fence,
	// and reserves nothing. Sent again once to's lock has ended (the copy
	// waited on the wire longer than to's TTL, or to released it), it must
	// not answer "from does not hold the lock": from held it until it
	// handed it on, and its Release would report a lease held until its
	// release as lost. So a transfer kills from as a release does, with a
	// tombstone that says it died holding the lock: that copy then answers
	// {-3} (the caller cannot know what became of to's lock: an unknown
	// outcome, as for a lost reply), and a release of from answers
	// "released".
	transferLua = `
if redis.call('EXISTS', KEYS[4]) == 1 then
  return {-2}
end
local v = live(KEYS[1])
if v == ARGV[2] or v == ARGV[2] .. '+' then
  local f = tonumber(ARGV[4])
  if f == 0 then
    local c = redis.call('GET', KEYS[2])
    f = tonumber(c)
    if redis.call('GET', KEYS[3]) == c then
      f = f - 1
    end
  end
  return {f, 0}
end
local marked = false
if v ~= ARGV[1] then
  if v ~= ARGV[1] .. '+' then
    if redis.call('EXISTS', KEYS[5]) == 1 then
      return {-3}
    end
    return {0}
  end
  marked = true
end
local counter = KEYS[7] or KEYS[2]
local f = tonumber(ARGV[4])
if f == 0 then
  if marked then
    return {-1}
  end
  f = redis.call('INCR', counter)
end
if not join(ARGV[2], ARGV[3]) then
  return {-4}
end
local to = ARGV[2]
if marked then
  to = to .. '+'
end
leave(KEYS[1], v)
redis.call('SET', KEYS[1], to, 'PX', span(to, ARGV[3]))
enter(KEYS[1], to)
if ARGV[7] and ARGV[7] ~= '' then
  redis.call('SET', KEYS[6], ARGV[2] .. ' ' .. ARGV[7], 'PX', span(to, ARGV[3]))
else
  redis.call('DEL', KEYS[6])
end
redis.call('SET', KEYS[5], '1', 'PX', ARGV[6])
if KEYS[7] then
  redis.call('SET', KEYS[2], f, 'PX', ARGV[3])
end
local nxt = 0
if ARGV[5] == '1' and not marked then
  nxt = redis.call('INCR', counter)
  redis.call('SET', KEYS[3], nxt, 'PX', span(to, ARGV[3]))
else
  redis.call('DEL', KEYS[3])
end
return {f, nxt}`

	inspectLua = `
local v = live(KEYS[1])
if not v then
  return {}
end
local c = redis.call('GET', KEYS[2]) or '0'
local f = tonumber(c)
if redis.call('GET', KEYS[3]) == c then
  f = f - 1
end
local l = ''
local h = redis.call('GET', KEYS[4])
if h then
  local t = v
  if string.byte(t, -1) == 43 then t = string.sub(t, 1, -2) end
  if string.sub(h, 1, #t + 1) == t .. ' ' then l = string.sub(h, #t + 2) end
end
return {v, pttl(KEYS[1], v), f, l}`
)

func (b *Backend) check() error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	return nil
}

func storeErr(op string, err error) error {
	return fmt.Errorf("redis: %s: %w", op, err)
}

// acquireErr classifies an acquire script's error for token: a dead token
// is bad input (tokens are for one attempt); a session that ended took
// nothing, and the next attempt joins a new one (see session.go);
// anything else is an unknown outcome.
func (b *Backend) acquireErr(token string, err error) error {
	switch {
	case b.sessions == nil || goredis.HasErrorPrefix(err, "DEAD"):
	case goredis.HasErrorPrefix(err, "ENDED"):
		b.sessions.ended(token)
		return fmt.Errorf("%w: %w", errSessionEnded, backend.ErrContended)
	default:
		b.sessions.doubt(token) // the grant may still arrive
	}
	return acquireErr(err)
}

// acquireErr classifies an acquire script's error: a dead token is bad
// input (tokens are for one attempt), anything else an unknown outcome.
func acquireErr(err error) error {
	if goredis.HasErrorPrefix(err, "DEAD") {
		return fmt.Errorf("%w: redis: acquire with a token that was released before; a token is for one acquisition", backend.ErrInvalid)
	}
	return storeErr("acquire", err)
}

// Acquire implements backend.Backend.
func (b *Backend) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if err := b.check(); err != nil {
		return backend.Grant{}, err
	}
	if err := b.checkTTL(ttl); err != nil {
		return backend.Grant{}, err
	}
	lk, fk := keys(b.opts.prefix, key)
	st := b.stored(token)
	ks := []string{lk, fk, deadKeyOf(lk, st), nextKeyOf(lk), holderKeyOf(lk)}
	if sk := b.opts.slotFenceKey(lk); sk != "" {
		ks = append(ks, sk)
	}
	var sent time.Time // with sessions only: the send the session's touch counts from
	if b.sessions != nil {
		sent = time.Now()
	}
	res, err := b.batch.run(ctx, b.sc.acquire, ks, st, ms(ttl), queueKeyOf(lk), recordPrefixOf(lk), backend.Label(ctx)).Int64()
	if err != nil {
		return backend.Grant{}, b.acquireErr(token, err)
	}
	if b.sessions != nil {
		b.sessions.touch(token, sent) // the script made it live a TTL
	}
	if res <= 0 {
		return backend.Grant{}, backend.Locked(time.Duration(-res) * time.Millisecond)
	}
	return backend.Grant{Fence: uint64(res), TTL: granted(ttl)}, nil
}

// granted is the TTL the store enforces: ttl rounded up to milliseconds.
func granted(ttl time.Duration) time.Duration {
	return time.Duration(ms(ttl)) * time.Millisecond
}

// Renew implements backend.Backend.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if err := b.check(); err != nil {
		return backend.Grant{}, err
	}
	if err := b.checkTTL(ttl); err != nil {
		return backend.Grant{}, err
	}
	if b.sessions != nil && b.sessions.lookup(token) != nil {
		res := make([]backend.RenewResult, 1)
		b.sessions.renew(ctx, []backend.Renewal{{Key: key, Token: token, TTL: ttl}}, res)
		return res[0].Grant, res[0].Err
	}
	return b.renewLock(ctx, key, token, ttl)
}

// renewLock renews token's lock on key by itself (renewScript). With
// sessions it also brings the lock into token's session: a lock handed to
// a waiter of another process is confirmed this way (place.confirm),
// before any renewal of its session counts for it (see session.go).
func (b *Backend) renewLock(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if err := b.check(); err != nil {
		return backend.Grant{}, err
	}
	ok, err := b.batch.run(ctx, b.sc.renew, b.opts.renewKeys(key), b.stored(token), ms(ttl)).Int64()
	if err != nil {
		return backend.Grant{}, storeErr("renew", err)
	}
	if ok == 0 {
		return backend.Grant{}, backend.ErrNotHeld
	}
	return backend.Grant{TTL: granted(ttl)}, nil
}

// Release implements backend.Backend.
func (b *Backend) Release(ctx context.Context, key, token string) error {
	if err := b.check(); err != nil {
		return err
	}
	lk, _ := keys(b.opts.prefix, key)
	n, err := b.releaseWith(ctx, lk, token, "", "")
	if err != nil {
		return storeErr("release", err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	return nil
}

// Transfer implements backend.Transferer: a waiter in another process marks
// the lock, and a marked lock is not transferred without a reserved fence.
func (b *Backend) Transfer(ctx context.Context, key, from, to string, ttl time.Duration, opt backend.TransferOptions) (backend.Transferred, error) {
	if err := b.check(); err != nil {
		return backend.Transferred{}, err
	}
	if err := b.checkTTL(ttl); err != nil {
		return backend.Transferred{}, err
	}
	lk, fk := keys(b.opts.prefix, key)
	reserve := "0"
	if opt.Reserve {
		reserve = "1"
	}
	from, to = b.stored(from), b.stored(to)
	ks := []string{lk, fk, nextKeyOf(lk), deadKeyOf(lk, to), deadKeyOf(lk, from), holderKeyOf(lk)}
	if sk := b.opts.slotFenceKey(lk); sk != "" {
		ks = append(ks, sk)
	}
	res, err := b.batch.run(ctx, b.sc.transfer, ks, from, to, ms(ttl), opt.Fence, reserve, deadMs, backend.Label(ctx)).Int64Slice()
	switch {
	case err != nil:
		return backend.Transferred{}, storeErr("transfer", err)
	case len(res) == 1 && res[0] == 0:
		return backend.Transferred{}, backend.ErrNotHeld
	case len(res) == 1 && res[0] == -1:
		return backend.Transferred{}, backend.ErrTransferRefused
	case len(res) == 1 && res[0] == -4:
		b.sessions.ended(unstored(to))
		return backend.Transferred{}, storeErr("transfer", errSessionEnded)
	case len(res) == 1 && res[0] == -3:
		return backend.Transferred{}, storeErr("transfer", backend.ErrHandedOnBefore)
	case len(res) == 1 && res[0] == -2:
		return backend.Transferred{}, fmt.Errorf("%w: redis: transfer to a token that was released before; a token is for one acquisition", backend.ErrInvalid)
	case len(res) != 2 || res[0] <= 0 || res[1] < 0:
		return backend.Transferred{}, storeErr("transfer", fmt.Errorf("unexpected script reply %v", res))
	}
	return backend.Transferred{Fence: uint64(res[0]), TTL: granted(ttl), Next: uint64(res[1])}, nil
}

// Inspect implements backend.Inspector.
func (b *Backend) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	if err := b.check(); err != nil {
		return backend.Holder{}, err
	}
	lk, fk := keys(b.opts.prefix, key)
	return inspect(ctx, b.batch, b.sc.inspect, lk, fk)
}

func inspect(ctx context.Context, n *batcher, script *goredis.Script, lk, fk string) (backend.Holder, error) {
	res, err := n.run(ctx, script, []string{lk, fk, nextKeyOf(lk), holderKeyOf(lk)}).Slice()
	if err != nil {
		return backend.Holder{}, storeErr("inspect", err)
	}
	if len(res) != 4 {
		return backend.Holder{}, nil
	}
	token, _ := res[0].(string)
	token = unstored(strings.TrimSuffix(token, "+")) // a waiter's mark, a session
	pttl, _ := res[1].(int64)
	fence, _ := res[2].(int64)
	label, _ := res[3].(string)
	return backend.Holder{Held: true, Token: token, Fence: uint64(fence), Remaining: max(0, time.Duration(pttl)*time.Millisecond), Label: label}, nil
}

// Watch implements backend.Notifier with Redis pub/sub.
func (b *Backend) Watch(ctx context.Context, key string) (backend.Watch, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	lk, _ := keys(b.opts.prefix, key)
	ch := channelOf(lk)
	return b.notify.watch(ctx, ch)
}

// Capabilities implements backend.Describer.
func (b *Backend) Capabilities() backend.Capabilities {
	c := capabilities(b.opts)
	c.FIFO = true // see queue.go
	// A session is for locks of one TTL (session.go).
	c.FixedTTL = b.sessions != nil
	return c
}

// capabilities are the same for one deployment and for Redlock: every node
// expires a lock by its own PX, in milliseconds.
func capabilities(o options) backend.Capabilities {
	return backend.Capabilities{
		MinTTL:       MinTTL,
		Granularity:  time.Millisecond,
		ExpiryFactor: 1,
		ExpirySlack:  2 * time.Millisecond, // millisecond expiry resolution
		DurableFence: o.durableFence,
		MaxTTL:       o.maxTTL,
		Labels:       true, // see label.go
	}
}

// Close stops the backend's subscriptions, after waiting for the leaves of
// waiters that gave up (each bounded by waitq.LeaveTimeout). It closes the
// go-redis client only when the backend was opened from a URL.
func (b *Backend) Close() error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	b.queues.Close()
	b.notify.close()
	if b.sessions != nil {
		b.sessions.close()
	}
	if b.opts.ownClients {
		if c, ok := b.rdb.(interface{ Close() error }); ok {
			return c.Close()
		}
	}
	return nil
}
