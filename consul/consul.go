// Package consul is the Consul backend of package lock: locks are KV
// entries held by Consul sessions, fences are Raft indexes. Application
// code should use package lock; this package provides the store.
//
//	cli, err := api.NewClient(api.DefaultConfig())
//	b, err := consul.New(cli)
//	locks, err := lock.New(b)
//
// or lock.Open(ctx, "consul://127.0.0.1:8500").
//
// # How it works
//
// A lock is the KV entry PREFIX+KEY (default prefix "lock/"; KEY is the key
// path-escaped, with "." and ".." written "%2E" and "%2E%2E", so that
// distinct keys have distinct entries, each one path segment that Consul's
// HTTP API reaches as it is), locked by a session whose TTL is a quarter
// longer than the lock's TTL (see reserveOf) and whose behavior is
// "delete". Acquire takes a session that holds no lock (renewing it unless
// it was renewed lately enough to carry the lock as it is), or creates one,
// and sends one transaction that locks the entry with the owner token (and
// its holder label, see label.go) as its value and reads it back: the fence
// is the entry's ModifyIndex, the Raft index of the write that made this
// owner the holder. Renew renews the session and checks, in the same round
// trip, that the entry is still locked by it. Release deletes the entry in
// a transaction that checks the session first, or hands the lock to the
// first waiter. A holder watches its own entry: when the entry is deleted
// or its session destroyed from outside, the lease is lost at once, not at
// its next renewal.
//
// Waiters queue in Consul (see queue.go for what its primitives guarantee,
// and package backend/waitq for the argument): a waiting Acquire that finds
// the key held puts a record beside the entry, locked by the session its
// lock will be on, and follows only that record with a blocking query. A
// release hands the lock to the oldest record's session in one transaction
// (unlock, lock for the waiter, check and mark the record), so one release
// wakes one waiter, which holds the lock without a request of its own; its
// validity counts from its own latest session renewal. A waiter is never
// handed a lock for longer than it asked for: the handed lock is held by
// the waiter's own session, whose TTL comes from the waiter's TTL (a
// quarter longer, as for a lock it takes itself), and which Consul keeps
// at most twice that after the waiter's latest renewal. A waiter whose
// session went is never handed the lock from its record. Acquires that do
// not wait (TryAcquire) are not queued and may take a free key before the
// queue: the order is not FIFO.
//
// Sessions cost a Raft write to create, so a backend keeps the sessions of
// released locks and reuses them, one lock at a time each (see
// sessionPool): a session never holds two locks, so releasing or losing one
// lock never frees another, and a reuse renews the session in the same
// round trip as the lock, unless its latest renewal leaves it more than the
// lock's TTL (see reserveOf), so the store keeps the lock at least its TTL
// after the acquire was sent.
//
// With WithSessions, the self-renewing locks of one TTL that a backend
// takes with Acquire share one session instead, renewed once per batch
// however many locks it holds; sessions.go has the design and why it keeps
// the promises.
//
// # Guarantees
//
//	fence            | the Raft index of the write that granted the lock:
//	                 | global, strictly increasing, durable with the
//	                 | servers' Raft log (a server restart keeps it)
//	TTL              | from WithMinTTL (the servers' session_ttl_min,
//	                 | default 10s) to WithMaxTTL (default DefaultMaxTTL,
//	                 | 1m; at most 24h, Consul's longest session TTL);
//	                 | not rounded
//	expiry           | a lock's session has a TTL a quarter longer than the
//	                 | lock's; Consul expires a session between its TTL and
//	                 | twice its TTL after the last renewal, and a new
//	                 | leader restarts every session's timer: the lock may
//	                 | outlive its TTL by that much (2.5 x TTL in all) plus
//	                 | the lock-delay; the client's deadline counts the
//	                 | TTL only, from the send
//	lock-delay       | after a session holding a lock is invalidated (it
//	                 | expired, or was destroyed from outside), Consul
//	                 | refuses the key for the lock-delay (default 1s, see
//	                 | WithLockDelay); releases do not invoke it. The
//	                 | leader checks it before the Raft write, so a lock
//	                 | request already on its way when the session is
//	                 | invalidated can still land: a lock-delay narrows
//	                 | the window of a destroyed session, it does not
//	                 | close it (fences do)
//	server restart   | with a data dir, locks and fences survive; sessions'
//	                 | timers restart
//	leader failover  | locks survive (Raft); a session may live up to one
//	                 | more TTL
//
// A holder whose session expires (or is destroyed) frees the key without a
// handover: the waiter that was first in the queue when it queued follows
// the entry too and tries at once (after the lock-delay); the others learn
// it at their next attempt, at most one TTL later.
//
// A waiter killed while queued delays the others only if a release hands
// it the lock before its session is invalidated, which Consul does at most
// 2.5 times its TTL (at most WithMaxTTL) after its last renewal; the key
// is then refused for the lock-delay, and the waiter behind it, which
// follows only its own record, takes it at its next attempt, at most its
// own TTL later. A free key is taken by whoever tries first (waiting is
// not FIFO), so a killed waiter at the head of the queue does not hold up
// a key whose holder expired.
//
// # Guarded writes
//
// Backend.TxnIfHeld runs a Consul transaction only if a lease still holds
// its lock. Before the caller's operations it puts two checks on the lock's
// entry: that it is locked by the lease's session (check-session), and that
// its ModifyIndex is still the lease's fence (check-index). The second is
// needed because sessions are reused: the successor of a released lock may
// hold it on the very same session, so the session check alone could pass
// for a former holder; but every acquisition writes the entry at a new
// index, and nothing else writes it while the lock is held (renewals renew
// the session only). Consul applies checks and operations in one Raft
// write: the operations land only while the lock is the lease's, and
// otherwise nothing is written (an error wrapping backend.ErrNotHeld).
//
// This is stronger than a fence check at the resource: a resource that
// rejects old fences refuses a former holder only once a successor has
// written with a higher fence, whereas the store refuses the guarded
// write the moment the lock is gone (released, expired, its session
// destroyed), even before anyone else acquires it. But it only guards data
// in the same Consul datacenter (a transaction spans one): for anything
// else, send Lease.Fence with every write.
//
// # URLs
//
//	consul://[user:password@]host:port[?params]
//	consuls://[user:password@]host:port[?params]
//
// consul:// speaks HTTP to the agent; consuls:// speaks HTTPS (HTTP/1.1
// over TLS 1.2 or later, to the agent's ports.https). The parameters,
// besides package lock's own (ttl, drift, maxhold, autorenew):
//
//	prefix       key prefix (default DefaultPrefix)
//	minttl       the servers' session_ttl_min, more than 0 to MaxTTL
//	             (default DefaultMinTTL)
//	maxttl       the longest TTL granted, minttl to MaxTTL (default
//	             DefaultMaxTTL, 1m; WithMaxTTL)
//	lockdelay    the sessions' lock-delay, 0 to MaxLockDelay (default
//	             DefaultLockDelay)
//	sessions     true: the self-renewing locks of one TTL share a
//	             session (WithSessions; default false)
//	token        ACL token (a secret: lock.RedactURL and lock.Open's
//	             errors hide it)
//	token_file   path of a file holding the ACL token (surrounding white
//	             space trimmed), for secrets managers that write one;
//	             read once, by Open; not with token
//	ca_file      consuls only: PEM file of the CAs to trust instead of the
//	             system's roots
//	cert_file    consuls only: client certificate (PEM), with key_file,
//	             for agents with tls.https.verify_incoming
//	key_file     consuls only: the client certificate's key (PEM)
//	server_name  consuls only: the name the agent's certificate must
//	             carry, when it is not the host dialled; default the host
//	skip_verify  consuls only: true accepts any certificate, so anyone on
//	             the path can read and change the traffic; for tests
//	             only, and refused with ca_file or server_name
//
// A TLS parameter on consul:// is an error that says to use consuls://.
// user:password@ (or user@) is sent as HTTP basic authentication with
// every request, for a proxy in front of the agent: Consul itself ignores
// it, its ACLs take the token. Every duration is checked against its range
// by Open, before any request.
//
// # Environment
//
// The Consul API client reads CONSUL_* environment variables; a backend
// opened from a URL builds its client so that only these have an effect:
//
//	CONSUL_HTTP_TOKEN_FILE  the ACL token, read from the file, when the URL
//	                        has neither token nor token_file
//	CONSUL_HTTP_TOKEN       the ACL token, when the URL has neither token
//	                        nor token_file and CONSUL_HTTP_TOKEN_FILE is
//	                        unset
//	CONSUL_NAMESPACE        the namespace of every request (Consul
//	                        Enterprise), as with Consul's own tools
//	CONSUL_PARTITION        the admin partition of every request (Consul
//	                        Enterprise)
//
// The token variables are kept because they are the usual way to hand a
// Consul token to a process without putting it in a URL or a command
// line, and Consul's own tools read them; a token in the URL always wins
// over them. The namespace and partition go with the token (an ACL token
// belongs to one), and the API client offers no way to send none when they
// are set. Everything else comes from the URL alone: CONSUL_HTTP_ADDR,
// CONSUL_HTTP_SSL, CONSUL_HTTP_SSL_VERIFY, CONSUL_CACERT, CONSUL_CAPATH,
// CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY, CONSUL_TLS_SERVER_NAME and
// CONSUL_HTTP_AUTH have no effect: in particular CONSUL_HTTP_SSL_VERIFY=false
// does not turn off certificate checks for consuls://. HTTP_PROXY,
// HTTPS_PROXY and NO_PROXY apply, as in every Go HTTP client (loopback
// addresses are never proxied).
//
// A backend made with New uses the client it is given, configured however
// its caller chose (api.DefaultConfig reads all of the CONSUL_* variables).
package consul

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/backend/waitq"
)

// DefaultPrefix is prepended to every key the backend writes.
const DefaultPrefix = "lock/"

// DefaultMinTTL is Consul's default minimum session TTL (the servers'
// session_ttl_min).
const DefaultMinTTL = 10 * time.Second

// MaxTTL is Consul's maximum session TTL.
const MaxTTL = 24 * time.Hour

// DefaultLockDelay is the lock-delay of the sessions the backend creates.
// It is short because package lock never needs it for its own holders: a
// holder's deadline comes before its session can expire. It protects a
// holder whose session is destroyed from outside: the holder learns it
// from its watch within milliseconds, and nobody can take the key for the
// lock-delay meanwhile.
const DefaultLockDelay = time.Second

// MaxLockDelay is Consul's longest lock-delay.
const MaxLockDelay = time.Minute

// A lock's session lives a quarter longer than the lock's TTL (its
// reserve, less near MaxTTL): a session whose latest confirmed creation or
// renewal was sent less than half the reserve before an acquire still has
// more than the lock's TTL left when Consul receives it, so the acquire
// needs no renewal of its own (asIs). Why this keeps the contract (the
// store keeps the lock at least its TTL from the request): Consul keeps a
// session at least its TTL from its latest renewal, which it received
// after the renewal's send time r (a renewal only extends a session, a
// late one too, and a new leader restarts every session's timer); an
// acquire sent at s < r + reserve/2 thus holds the entry until at least
// r + TTL + reserve > s + TTL + reserve/2. The reserve's half left over,
// TTL/8, is far more than the clocks' drift over that interval (package
// lock allows TTL/100). A renewal of unknown outcome is not counted. The
// cost: a holder that stops renewing (it crashed) keeps its lock up to a
// quarter of its TTL longer (twice that, as Consul may wait up to twice a
// session's TTL); see the guarantee table.
func reserveOf(ttl time.Duration) time.Duration { return max(0, min(ttl/4, MaxTTL-ttl)) }

// sessionTTL is the TTL of the session of a lock of ttl.
func sessionTTL(ttl time.Duration) time.Duration { return ttl + reserveOf(ttl) }

// asIs reports whether a session for locks of ttl, whose latest confirmed
// creation or renewal was sent at renewed, can carry a lock acquired with
// a request sent at sent without a renewal of its own.
func asIs(ttl time.Duration, sent, renewed time.Time) bool {
	r := reserveOf(ttl)
	return r > 0 && sent.Sub(renewed) < r/2
}

// deadFor is how long a released token stays dead (see backend.Backend's
// Acquire): far longer than a request can be on its way.
const deadFor = time.Minute

// Option configures a backend.
type Option func(*options)

type options struct {
	prefix    string
	minTTL    time.Duration
	maxTTL    time.Duration
	lockDelay time.Duration
	sessions  bool // WithSessions
	closeCli  func()
}

// WithPrefix sets the prefix of every key the backend writes (default
// DefaultPrefix). New refuses a prefix that Consul's HTTP API would not
// reach as it is: one with a leading '/', a "//", a "." or ".." segment
// before its last '/', or characters that are not printable UTF-8.
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithMinTTL declares the servers' minimum session TTL (session_ttl_min,
// default 10s): package lock rejects shorter TTLs with an error that names
// it.
func WithMinTTL(d time.Duration) Option { return func(o *options) { o.minTTL = d } }

// DefaultMaxTTL is the longest TTL the backend grants unless WithMaxTTL
// says otherwise: lock.DefaultMaxTTL, which says why. (MaxTTL, Consul's
// own limit on a session's TTL, is the most WithMaxTTL takes.)
const DefaultMaxTTL = time.Minute

// WithMaxTTL sets the longest TTL the backend grants (default
// DefaultMaxTTL), from the minimum TTL (WithMinTTL) to MaxTTL, Consul's
// longest session TTL (New refuses others); the URL parameter maxttl sets
// it. Capabilities reports it, so package lock refuses a longer TTL
// (ErrInvalidTTL) before sending anything, and the backend refuses one
// too (ErrInvalid). It bounds how long a holder that crashed, or a waiter
// killed while queued, blocks the key: Consul keeps a session up to twice
// its TTL, a quarter longer than the lock's, so up to 2.5 times the
// maximum, plus the lock-delay (see the guarantee table).
func WithMaxTTL(d time.Duration) Option { return func(o *options) { o.maxTTL = d } }

// WithLockDelay sets the lock-delay of the sessions the backend creates
// (default DefaultLockDelay; 0 allowed, at most 60s).
func WithLockDelay(d time.Duration) Option { return func(o *options) { o.lockDelay = d } }

// Backend is a backend.Backend over a Consul agent or server. It
// implements backend.Queuer (and so backend.Notifier),
// backend.LossNotifier, backend.Inspector and backend.Describer.
type Backend struct {
	cli *api.Client
	o   options

	mu     sync.Mutex
	owned  map[string]*owned    // token -> its session, while it may hold a lock
	dead   map[string]tomb      // released tokens
	deadQ  []string             // dead tokens in order of death
	delays map[string]time.Time // key -> when a lock-delay on it ends, as last seen
	hot    map[string]time.Time // key -> when this backend last found it held or queued
	pool   sessionPool
	// lossWatches holds a slot for each loss watch running (NotifyLoss):
	// each is a blocking query, and so an HTTP connection of its own.
	lossWatches chan struct{}
	// sessionRenewals holds a slot for each session renewal in flight
	// (renew.go): a batch's renewals are HTTP requests, and however many
	// batches run at once they stay within the connections Consul
	// allows one address.
	sessionRenewals chan struct{}

	shared *sharedSessions // nil without WithSessions

	closed  atomic.Bool
	waiters *waitq.Group   // the places of queues, and their leaves
	bg      sync.WaitGroup // background destroys and watches
	ctx     context.Context
	cancel  context.CancelFunc
}

// owned is what the backend knows of a token's attempt.
type owned struct {
	key     string // the entry's name
	session string
	ttl     time.Duration
	fence   uint64    // 0 until granted
	renewed time.Time // send time of the session's latest confirmed creation or renewal
	rec     string    // a lock handed over: the waiter's queue record, deleted by the release
	next    []waiter  // a lock handed over: the waiters known to queue after it
	shared  *shared   // the shared session, when session is one (sessions.go)
}

// tomb says how a token ended.
type tomb struct {
	until time.Time
	held  bool // it held the lock when released: a retried release is fine
}

// New returns a backend over cli, the user's own Consul client. The
// backend does not close anything of cli's.
func New(cli *api.Client, opts ...Option) (*Backend, error) {
	if cli == nil {
		return nil, fmt.Errorf("%w: consul.New: nil client; pass one from api.NewClient", backend.ErrInvalid)
	}
	o := options{prefix: DefaultPrefix, minTTL: DefaultMinTTL, maxTTL: DefaultMaxTTL, lockDelay: DefaultLockDelay}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	switch {
	case o.minTTL <= 0 || o.minTTL > MaxTTL:
		return nil, fmt.Errorf("%w: consul: minimum TTL %v; want more than 0 and at most %v", backend.ErrInvalid, o.minTTL, MaxTTL)
	case o.maxTTL < o.minTTL || o.maxTTL > MaxTTL:
		return nil, fmt.Errorf("%w: consul: maximum TTL %v (WithMaxTTL); want from the minimum TTL %v (WithMinTTL, the servers' session_ttl_min) to %v (Consul's longest session TTL)", backend.ErrInvalid, o.maxTTL, o.minTTL, MaxTTL)
	case o.lockDelay < 0 || o.lockDelay > MaxLockDelay:
		return nil, fmt.Errorf("%w: consul: lock-delay %v; want 0 to %v", backend.ErrInvalid, o.lockDelay, MaxLockDelay)
	}
	if why := prefixProblem(o.prefix); why != "" {
		return nil, fmt.Errorf("%w: consul: prefix %q %s: Consul's HTTP API would read other entries than the transactions write; want printable UTF-8 whose segments before the last '/' are not empty, \".\" or \"..\", such as %q", backend.ErrInvalid, o.prefix, why, DefaultPrefix)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Backend{
		lossWatches:     make(chan struct{}, maxLossWatches),
		sessionRenewals: make(chan struct{}, renewConcurrency),
		cli:             cli,
		o:               o,
		owned:           map[string]*owned{},
		dead:            map[string]tomb{},
		delays:          map[string]time.Time{},
		hot:             map[string]time.Time{},
		waiters:         waitq.NewGroup(),
		ctx:             ctx,
		cancel:          cancel,
	}
	if o.sessions {
		b.shared = newSharedSessions(b)
	}
	return b, nil
}

// Capabilities implements backend.Describer.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		MinTTL: b.o.minTTL,
		MaxTTL: b.o.maxTTL,
		// Consul may wait up to twice a session's TTL, which is a
		// quarter longer than the lock's (see reserveOf).
		ExpiryFactor: 2.5,
		// A new leader restarts the timers; the lock-delay follows an
		// expiry; and the servers' clocks run on.
		ExpirySlack:  b.o.lockDelay + time.Second,
		DurableFence: true,
		// A lock's session keeps the TTL it was created with.
		FixedTTL: true,
		// The entry's value carries the label (label.go).
		Labels: true,
	}
}

// entry is the KV name of key: the prefix, then the key path-escaped
// (see escapeKey). Every call finds a lock's entry, and the queue records
// beside it, by this name.
func (b *Backend) entry(key string) string { return b.o.prefix + escapeKey(key) }

// prefixProblem says what in prefix would make Consul's HTTP API reach an
// entry by another name than the one the transactions write, or "" when
// nothing would: the API client drops a leading '/', the router merges
// empty path segments and resolves "." and "..", the agent refuses a path
// with characters that are not printable, and the transactions' JSON
// replaces bytes that are not UTF-8. The prefix's last segment
// is completed by the escaped key, which is never "." or "..".
func prefixProblem(prefix string) string {
	if !utf8.ValidString(prefix) {
		return "is not valid UTF-8 (the transactions' JSON would replace bytes of it)"
	}
	if i := strings.IndexFunc(prefix, func(r rune) bool { return !unicode.IsPrint(r) }); i >= 0 {
		return fmt.Sprintf("has the character %q, which is not printable", []rune(prefix[i:])[0])
	}
	segs := strings.Split(prefix, "/")
	for _, seg := range segs[:len(segs)-1] {
		switch seg {
		case "":
			return "has an empty path segment (a leading '/' or a \"//\")"
		case ".", "..":
			return fmt.Sprintf("has the path segment %q", seg)
		}
	}
	return ""
}

// escapeKey returns key as Consul names it: url.PathEscape of the key, or
// "%2E" and "%2E%2E" for the keys "." and "..". Consul's HTTP API takes KV
// names in the URL path: a name of printable ASCII with no '/' (PathEscape
// writes '/', '%', controls and non-ASCII bytes as %XX) is one path
// segment, which the API's router leaves alone unless it is "." or "..":
// those it would resolve away (the GET of the entry "lock/." would read
// "lock/"), while the transaction endpoint, which takes names in its body,
// would lock the entry itself. The mapping is injective: url.PathUnescape
// gives every key back from its name.
func escapeKey(key string) string {
	switch e := url.PathEscape(key); e {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	default:
		return e
	}
}

func (b *Backend) check(ttl time.Duration) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	if ttl < b.o.minTTL || ttl > b.o.maxTTL {
		return fmt.Errorf("%w: consul: TTL %v; this backend takes %v (the servers' session_ttl_min; see WithMinTTL) to %v (its maximum: WithMaxTTL, URL parameter maxttl)", backend.ErrInvalid, ttl, b.o.minTTL, b.o.maxTTL)
	}
	return nil
}

// Acquire implements backend.Backend.
func (b *Backend) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if err := b.check(ttl); err != nil {
		return backend.Grant{}, err
	}
	label, err := requestLabel(ctx, token)
	if err != nil {
		return backend.Grant{}, err
	}
	b.mu.Lock()
	if _, ok := b.deadToken(token); ok {
		b.mu.Unlock()
		return backend.Grant{}, fmt.Errorf("%w: consul: token %s was released before; a token is for one attempt", backend.ErrInvalid, token)
	}
	if o := b.owned[token]; o != nil && o.fence != 0 {
		// Sent again after a lost reply: renew the session so that the
		// store keeps the lock ttl from this request.
		b.mu.Unlock()
		if _, err := b.renewSession(ctx, o.session); err != nil {
			return backend.Grant{}, err
		}
		return backend.Grant{Fence: o.fence, TTL: o.ttl}, nil
	}
	b.mu.Unlock()
	if b.shared != nil {
		if s, ok := b.shared.Lookup(token); ok {
			return b.acquireShared(ctx, key, token, label, ttl, s)
		}
	}

	for {
		g, retry, err := b.attempt(ctx, key, token, label, ttl)
		if !retry {
			return g, err
		}
	}
}

// attempt is one try of Acquire, which locks the entry with token and
// label (see label.go); retry is true when it found a reused session
// expired, and changed nothing.
func (b *Backend) attempt(ctx context.Context, key, token, label string, ttl time.Duration) (g backend.Grant, retry bool, err error) {
	name := b.entry(key)
	sess, renewed, reused, err := b.session(ctx, key, ttl)
	if err != nil {
		return backend.Grant{}, false, err
	}
	b.mu.Lock()
	b.owned[token] = &owned{key: name, session: sess, ttl: ttl}
	b.mu.Unlock()

	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: name, Value: entryValue(token, label), Session: sess}},
		{KV: &api.KVTxnOp{Verb: api.KVGet, Key: name}},
	}
	var renewErr error
	var wg sync.WaitGroup
	if reused && !asIs(ttl, time.Now(), renewed) {
		// The session was renewed too long before this call to carry
		// the lock as it is: renew it again, in the same round trip,
		// so that it lives ttl from now at least.
		wg.Go(func() { renewed, renewErr = b.renewAfter(ctx, sess) })
	}
	ok, resp, _, err := b.cli.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	wg.Wait()
	switch {
	case err != nil:
		// The outcome is unknown: package lock releases the token,
		// which destroys the session.
		return backend.Grant{}, false, fmt.Errorf("consul: acquire %q: %w", key, err)
	case ok && renewErr != nil:
		// Locked, but the session may not live ttl from now: give up
		// the lock (destroying the session frees it).
		b.destroyLater(token)
		return backend.Grant{}, false, fmt.Errorf("consul: acquire %q: renewing the session: %w", key, renewErr)
	case ok:
		if len(resp.Results) < 2 || resp.Results[1].KV == nil {
			b.destroyLater(token)
			return backend.Grant{}, false, fmt.Errorf("consul: acquire %q: the transaction returned no entry", key)
		}
		fence := resp.Results[1].KV.ModifyIndex
		b.mu.Lock()
		if o := b.owned[token]; o != nil {
			o.fence, o.renewed = fence, renewed
		}
		b.mu.Unlock()
		return backend.Grant{Fence: fence, TTL: ttl}, false, nil
	}
	// Refused: nothing changed, and no copy of the transaction is on its
	// way. The session holds nothing: it can serve the next attempt, if
	// it is alive.
	b.mu.Lock()
	delete(b.owned, token)
	b.mu.Unlock()
	why := txnErrors(resp)
	alive := renewErr == nil
	switch {
	case strings.Contains(why, "invalid session") && reused:
		return backend.Grant{}, true, nil // it expired while idle
	case !alive:
		b.destroy(sess)
	case strings.Contains(why, "lock delay"), strings.Contains(why, "already held"):
		b.keep(sess, ttl, renewed)
	default:
		b.destroy(sess)
	}
	switch {
	case strings.Contains(why, "lock delay"):
		return backend.Grant{}, false, backend.Locked(b.lockDelayLeft(name))
	case strings.Contains(why, "already held"):
		b.sawHeld(name)
		return backend.Grant{}, false, backend.Locked(0)
	}
	return backend.Grant{}, false, fmt.Errorf("consul: acquire %q: %s", key, why)
}

// renewAfter renews sess for a caller that needs a renewal sent after its
// own send time: one that fails in transit is sent again (any renewal sent
// after the caller began will do), up to 3 times. It returns the send time
// of the renewal that succeeded, or errSessionGone when Consul no longer
// knows the session.
func (b *Backend) renewAfter(ctx context.Context, sess string) (time.Time, error) {
	var err error
	for range 3 {
		sent := time.Now()
		var ok bool
		ok, err = b.renewSession(ctx, sess)
		switch {
		case err == nil && ok:
			return sent, nil
		case err == nil:
			return time.Time{}, errSessionGone
		}
		if ctx.Err() != nil {
			break
		}
	}
	return time.Time{}, err
}

var errSessionGone = errors.New("consul: the session is gone (expired or destroyed)")

// txnErrors joins the errors of a refused transaction.
func txnErrors(resp *api.TxnResponse) string {
	if resp == nil || len(resp.Errors) == 0 {
		return "transaction refused"
	}
	var msgs []string
	for _, e := range resp.Errors {
		msgs = append(msgs, e.What)
	}
	return strings.Join(msgs, "; ")
}

// lockDelayLeft is how long the lock-delay on name may still last: from
// when this backend saw the entry go (its watches note it), or the whole
// lock-delay when it did not.
func (b *Backend) lockDelayLeft(name string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if end, ok := b.delays[name]; ok {
		if left := time.Until(end); left > 0 {
			return left + time.Millisecond
		}
		return time.Millisecond
	}
	return b.o.lockDelay + time.Millisecond
}

// renewSession renews id; ok is false when Consul no longer knows it.
func (b *Backend) renewSession(ctx context.Context, id string) (ok bool, err error) {
	e, _, err := b.cli.Session().Renew(id, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return false, err
	}
	return e != nil, nil
}

// Release implements backend.Backend: it deletes the entry if the token's
// session holds it, and keeps the session for a later lock.
func (b *Backend) Release(ctx context.Context, key, token string) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	b.mu.Lock()
	if t, ok := b.deadToken(token); ok {
		b.mu.Unlock()
		if t.held {
			return nil // sent again after it took effect
		}
		return fmt.Errorf("%w: consul: %q is not held by this token", backend.ErrNotHeld, key)
	}
	o := b.owned[token]
	b.mu.Unlock()
	if o == nil {
		return b.releaseOther(ctx, key, token)
	}
	if o.key != b.entry(key) {
		return fmt.Errorf("%w: consul: %q is not held by this token", backend.ErrNotHeld, key)
	}
	b.mu.Lock()
	fence, rec, next, renewed := o.fence, o.rec, o.next, o.renewed
	b.mu.Unlock()
	if o.shared != nil && fence == 0 {
		return b.releaseDoubtful(ctx, key, token, o)
	}
	held := &api.TxnOp{KV: heldCheck(o)}
	if len(next) > 0 {
		// Hand the lock to the first waiter this backend knows of (see
		// queue.go); when that waiter's record changed, release as
		// usual.
		ops := handoverOps(o.key, next)
		ops = slices.Insert(ops, 0, held, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: o.key, Session: o.session}})
		if rec != "" {
			ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: rec}})
		}
		ok, _, _, err := b.cli.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
		switch {
		case err != nil:
			b.settle(key, token, o, unsettled, renewed)
			return fmt.Errorf("consul: release %q: %w", key, err)
		case ok:
			b.settle(key, token, o, freed, renewed)
			return nil
		}
	}
	ops := api.TxnOps{held, {KV: &api.KVTxnOp{Verb: api.KVDelete, Key: o.key}}}
	if rec != "" {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: rec}})
	}
	ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVGetTree, Key: o.key + queueSep}})
	ok, resp, _, err := b.cli.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	switch {
	case err != nil:
		b.settle(key, token, o, unsettled, renewed)
		return fmt.Errorf("consul: release %q: %w", key, err)
	case !ok:
		b.settle(key, token, o, notHeld, renewed)
		return fmt.Errorf("%w: consul: %q: %s", backend.ErrNotHeld, key, txnErrors(resp))
	}
	b.settle(key, token, o, freed, renewed)
	if ws := waiters(o.key, resp); len(ws) > 0 {
		b.handOverLater(o.key, ws)
	}
	return nil
}

// How a release ended: it freed the lock (or handed it over), found it not
// held by the token, or its outcome is unknown.
type releaseOutcome int

const (
	freed releaseOutcome = iota
	notHeld
	unsettled
)

// settle does what a release's outcome asks of token's attempt and its
// session. A session of one lock is pooled after a release that freed the
// lock; otherwise it is destroyed, which frees the entry if neither the
// release nor a handover landed, and makes a lock transaction still on its
// way fail (the lock was not held: perhaps one is). A shared session holds
// other locks and is left alone: a release of unknown outcome stays
// pending and is sent again after the session's next renewal (its token
// is not killed, so that the resend reaches the store), and a lock still
// on its way cannot be one of a token whose grant this backend saw (a
// doubtful token is buried instead: releaseDoubtful).
func (b *Backend) settle(key, token string, o *owned, how releaseOutcome, renewed time.Time) {
	if o.shared != nil {
		if how != unsettled {
			b.kill(token, how == freed)
		}
		o.shared.pending.Record(key, token, how != unsettled)
		return
	}
	b.kill(token, how == freed)
	if how == freed {
		b.keep(o.session, o.ttl, renewed)
	} else {
		b.destroy(o.session)
	}
}

// keep pools a session that holds no lock, or destroys it when the pool is
// full or the backend closed. renewed is the send time of its latest
// confirmed creation or renewal.
func (b *Backend) keep(id string, ttl time.Duration, renewed time.Time) {
	if b.closed.Load() || !b.pool.put(pooled{id: id, renewed: renewed}, ttl) {
		b.destroy(id)
	}
}

// session returns a session of ttl that holds no lock: an idle one
// (reused: renew it with the lock) or a new one, and the send time of its
// latest confirmed creation or renewal.
func (b *Backend) session(ctx context.Context, key string, ttl time.Duration) (id string, renewed time.Time, reused bool, err error) {
	if e, ok := b.pool.get(ttl); ok {
		return e.id, e.renewed, true, nil
	}
	sent := time.Now()
	id, err = b.createSession(ctx, key, ttl)
	return id, sent, false, err
}

// createSession creates a session of ttl with the backend's lock-delay and
// the delete behavior, tied to no health check.
func (b *Backend) createSession(ctx context.Context, key string, ttl time.Duration) (string, error) {
	body := map[string]any{
		"Name":       "lock " + key,
		"TTL":        sessionTTL(ttl).String(),
		"LockDelay":  fmt.Sprintf("%dms", b.o.lockDelay.Milliseconds()), // 0 is sent too: Consul's default is 15s
		"Behavior":   api.SessionBehaviorDelete,
		"NodeChecks": []string{},
	}
	var out struct{ ID string }
	if _, err := b.cli.Raw().Write("/v1/session/create", body, &out, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return "", fmt.Errorf("consul: acquire %q: creating a session: %w", key, err)
	}
	if out.ID == "" {
		return "", fmt.Errorf("consul: acquire %q: creating a session: no ID in the reply", key)
	}
	return out.ID, nil
}

// releaseOther releases a lock that another client acquired, by its token:
// it deletes the entry if it still holds token, unchanged since it was read.
// The owner's session is left alone: the owner learns of the loss from its
// watch or its next renewal.
func (b *Backend) releaseOther(ctx context.Context, key, token string) error {
	name := b.entry(key)
	kv, _, err := b.cli.KV().Get(name, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("consul: release %q: %w", key, err)
	}
	if kv == nil || kv.Session == "" || tokenOf(kv.Value) != token {
		b.kill(token, false) // a release that finds nothing kills the token too
		return fmt.Errorf("%w: consul: %q is not held by this token", backend.ErrNotHeld, key)
	}
	ok, resp, _, err := b.cli.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: name, Index: kv.ModifyIndex}},
		{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: name}},
	}, (&api.QueryOptions{}).WithContext(ctx))
	switch {
	case err != nil:
		return fmt.Errorf("consul: release %q: %w", key, err)
	case !ok:
		b.kill(token, false)
		return fmt.Errorf("%w: consul: %q changed while it was released: %s", backend.ErrNotHeld, key, txnErrors(resp))
	}
	b.kill(token, true)
	return nil
}

// destroyLater forgets token's attempt and destroys its session in the
// background; a shared session, which holds other locks, is left alone:
// the renewals that call this for one found the lock gone.
func (b *Backend) destroyLater(token string) {
	b.mu.Lock()
	o := b.owned[token]
	b.mu.Unlock()
	if o != nil {
		b.kill(token, false)
		if o.shared == nil {
			b.destroy(o.session)
		}
	}
}

// kill marks token dead and forgets its attempt.
func (b *Backend) kill(token string, held bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.owned, token)
	now := time.Now()
	for len(b.deadQ) > 0 && now.After(b.dead[b.deadQ[0]].until) {
		delete(b.dead, b.deadQ[0])
		b.deadQ = b.deadQ[1:]
	}
	if _, ok := b.dead[token]; !ok {
		b.dead[token] = tomb{until: now.Add(deadFor), held: held}
		b.deadQ = append(b.deadQ, token)
	}
}

// deadToken reports whether token was released within deadFor. b.mu must
// be held.
func (b *Backend) deadToken(token string) (tomb, bool) {
	t, ok := b.dead[token]
	if ok && time.Now().After(t.until) {
		return tomb{}, false
	}
	return t, ok
}

// destroy destroys a session in the background, bounded; Close waits.
func (b *Backend) destroy(id string) {
	b.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b.cli.Session().Destroy(id, (&api.WriteOptions{}).WithContext(ctx))
	})
}

// Inspect implements backend.Inspector.
func (b *Backend) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	if b.closed.Load() {
		return backend.Holder{}, backend.ErrClosed
	}
	kv, _, err := b.cli.KV().Get(b.entry(key), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return backend.Holder{}, fmt.Errorf("consul: inspect %q: %w", key, err)
	}
	if kv == nil || kv.Session == "" {
		return backend.Holder{}, nil
	}
	token, label := parseValue(kv.Value)
	return backend.Holder{Held: true, Token: token, Fence: kv.ModifyIndex, Label: label}, nil
}

// Close implements backend.Backend: it waits for the leaves of waiters
// that gave up (each bounded by waitq.LeaveTimeout), then stops the
// watches and destroys the sessions that hold no lock. Held locks are
// left to expire.
func (b *Backend) Close() error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	b.waiters.Close()
	if b.shared != nil {
		b.shared.Close()
	}
	b.cancel()
	for _, id := range b.pool.drain() {
		b.destroy(id)
	}
	b.bg.Wait()
	if b.o.closeCli != nil {
		b.o.closeCli()
	}
	return nil
}
