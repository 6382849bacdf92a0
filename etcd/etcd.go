// Package etcd is the etcd backend of package lock, over an etcd v3 cluster
// through go.etcd.io/etcd/client/v3. Application code should use package
// lock; this package provides the store.
//
//	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
//	b, err := etcd.New(cli)
//	locks, err := lock.New(b)
//
// or, with the client built and owned by the backend:
//
//	locks, err := lock.Open(ctx, "etcd://localhost:2379")
//
// # How it works
//
// Every lock is attached to an etcd lease that carries no other lock.
// Acquire takes a lease (see Raft writes) and runs one transaction guarded
// by "the lock key does not exist and the token is not dead" that puts the
// owner token under the lock key, attached to the lease. The fence is the
// revision of the put that made the owner the holder (the key's mod
// revision): etcd's global revision counter, which Raft replicates and
// every member keeps on disk, so it only grows, across restarts and leader
// changes. A transaction that finds the key held, or others queued for it,
// returns ErrLocked.
//
// Renew refreshes the lease (a keep-alive, not a Raft write) and then reads
// the lock key: only a key still holding this owner's token on this owner's
// lease counts as held, so a key deleted from outside while its lease lives
// is reported as not held, not renewed. Release is one transaction guarded
// by the owner's token (never a delete by key name: see etcd#22082) that
// deletes the key and leaves a tombstone for the token (see Dead tokens).
//
// Waiters queue in the store, first come first served, across processes
// (backend.Queuer; see queue.go for what its primitives guarantee, and
// package backend/waitq for the argument): the acquire transaction of a
// waiter that finds the key held puts a queue record for it in the same
// request, attached to the waiter's lease and ordered by the record's
// create revision. A release by a backend that follows the key (one that
// waited for it in the last few seconds) hands the lock to the head of the
// queue in the release's transaction: the head's token goes under the lock
// key, on the head's lease, and the head learns it from its watch with no
// request, counting its deadline from its own latest keep-alive. A waiter
// is thus never handed a lock for longer than it asked for: the handed
// lock lives on the waiter's own lease, which lives the waiter's TTL
// (rounded up to seconds, plus the lease's extra second from 2s, as for a
// lock it takes itself) after its latest keep-alive. Otherwise
// the release deletes the key, and the head's watch wakes it to take the
// key. The acquire of a queued waiter takes the key only if its own record
// still exists and comes first; anyone else's only when nobody queues. A
// waiter that leaves without the key revokes its lease, which deletes its
// record and any lock handed to it. A waiter whose record vanished while it
// waited (its lease expired) is never handed or granted the key from it
// (the Jepsen etcd 3.4.3 finding): it queues again, at the back.
//
// # Raft writes
//
// A lease grant is a Raft write of its own, as costly as the transaction, so
// the backend reuses leases: a released lock's lease goes back to a pool of
// idle leases of its TTL, and the next acquisition with that TTL takes one.
// A lease lives one second longer than the lock's TTL (rounded up to
// seconds; for TTLs of 2s and more), so a lease refreshed less than half a
// second before the acquire was sent still has more than the lock's TTL
// left and carries it as it is: back-to-back acquisitions send one keep-alive every half
// second, not one each. An older lease is refreshed with a keep-alive,
// which is not a Raft write, sent just before the transaction and answered
// while it runs (one round trip for both). The keep-alives of a backend
// share one long-lived stream (see refresher).
// An acquisition thus costs one Raft write (two when no idle lease is at
// hand: after a pause longer than the TTL, or with more locks held at once
// than ever before), a contended attempt one (it queues the waiter), a
// release one (with the handover to the next waiter, if any), a renewal
// none, and a wait that ends with a handover nothing more; a wait given up
// costs a revoke. Either the lease's latest confirmed refresh left it more
// than the TTL from the request, or the keep-alive is sent after the
// caller's send time and the grant is reported only when it succeeded, so
// the store keeps the lock at least the TTL from the request, however long
// the lease sat idle. A
// waiter's attempt that the backend's view of the key says will queue
// sends no keep-alive when its lease was refreshed less than a third of its
// TTL ago (the record lives, and the waiter keeps its lease alive while it
// waits); should it take the key after all, it refreshes the lease before
// it reports the grant. So a section on a hot key contended by separate
// processes costs two requests: the waiter's attempt and the release that
// hands it the lock.
//
// Without WithSessions, a lease never carries two locks at once: renewing
// one lock would then extend the others, and a lock whose owner stopped
// renewing could outlive its TTL by any amount. WithSessions shares a
// lease among the locks of a client that renew themselves, with the rules
// that bound this (see Sessions in sessions.go). A lease joins the pool
// only when the store confirmed it carries nothing: never after an acquire whose outcome is unknown (its
// transaction may still arrive and attach a key, and the revoke that undoes
// it may arrive after the release that deleted the key, where it would
// delete the lease's next lock; the release revokes the lease instead,
// whatever it found), nor with a refresh in flight or of unknown outcome (a
// late one would extend the next lock). See leases.go for the argument. Idle leases beyond 64
// per TTL are left to expire, as are those of a closed backend.
//
// # Guarantees
//
//	property                  | guarantee
//	--------------------------|---------------------------------------------------------
//	fence                     | the lock key's mod revision: > 0, strictly
//	                          | increasing per key and across keys, durable: etcd
//	                          | commits it through Raft and fsyncs it before replying
//	                          | (unless the cluster runs with --unsafe-no-fsync and a
//	                          | machine, not a process, crashes)
//	TTL granularity, minimum  | leases count whole seconds: a TTL is rounded up
//	                          | (Grant.TTL says what the store enforces); the least is
//	                          | 1s, or the cluster's minimum lease TTL, 1.5 election
//	                          | timeouts rounded up to seconds (2s with etcd's
//	                          | defaults), which the grant then reports
//	earliest expiry           | never before the TTL from when the leader applied the
//	                          | grant or keep-alive, which is after the request left
//	latest expiry             | normally the rounded TTL plus the lease's extra second
//	                          | (TTLs of 2s and more) plus up to 0.5s (the leader looks for expired leases
//	                          | twice a second) plus a Raft commit; a new leader
//	                          | restarts every lease's full TTL plus one election
//	                          | timeout when it takes over. Declared, for one
//	                          | leader change while the lease lives:
//	                          | 2 x TTL + 4s + 3 election timeouts + 0.6s
//	                          | (see WithElectionTimeout). Each further leader
//	                          | change restarts the lease again, and a revoke that
//	                          | fails while the leader stays (it could not confirm
//	                          | its leadership in time) is retried 3s later: a
//	                          | cluster that keeps changing leaders keeps its locks,
//	                          | and their waiters wait, while that lasts (a holder's
//	                          | own deadline still ends on its clock)
//	member failure            | a follower's failure changes nothing; the leader's
//	                          | failure stalls requests for an election, and extends
//	                          | leases as above; a lost quorum stalls everything, and
//	                          | every holder's client deadline then passes (package
//	                          | lock tells it the lock is lost)
//	store restart             | locks, fences and tombstones survive (they are on disk);
//	                          | leases restart their full TTL when the restarted
//	                          | cluster elects a leader
//	FIFO                      | yes, across processes, in the order the store first
//	                          | found each waiter's acquire blocked; a release hands
//	                          | the lock to the head, or wakes it alone. A waiter
//	                          | that died at the head, or was handed the lock, holds
//	                          | the others up until its lease expires: at most its TTL
//	                          | (plus one second from 2s) after its last keep-alive
//	                          | (plus the leader's scan); the next waiter's watch
//	                          | wakes it then
//	maximum TTL               | WithMaxTTL (URL parameter maxttl), default
//	                          | DefaultMaxTTL (1m): longer TTLs are refused, so a
//	                          | crashed holder or a killed waiter blocks a key for at
//	                          | most that (rounded up to seconds, plus one second)
//
// Leases expire by the leader's monotonic clock, so a stepped wall clock
// changes nothing. Locks that expire at once are revoked at up to 1,000 a
// second (etcd's revoke rate), so thousands expiring together can expire
// later than declared.
//
// # Dead tokens
//
// A token is for one acquisition attempt. Release kills it, whether or not
// it held the lock: the release transaction writes a tombstone key for the
// token, under a lease of this backend that keeps it at least
// DeadTokenTTL, and the acquire transaction refuses a token with a
// tombstone (ErrInvalid). etcd runs concurrent requests in any order, and
// package lock undoes an acquire it gave up on with a release that may
// reach the leader first; the tombstone makes that late acquire fail
// instead of taking the lock with nobody to release it, and lets a release
// sent again after it took effect answer nil again. A release that finds
// the key not held also revokes the lease of the token's acquire, if this
// backend made it for that lock alone, so that a late acquire
// transaction finds no lease to attach the key to; for a lock on a
// session's lease, the token's tombstone goes under that lease instead
// (see sessions.go). A request delayed longer than DeadTokenTTL can still
// take the lock; it then expires after its TTL.
//
// # Keys
//
// Under the prefix (DefaultPrefix unless WithPrefix): k/KEY\xff holds the
// owner token of the lock on KEY, attached to its lease (the byte 0xff,
// never part of valid UTF-8, ends it, so that no other lock key starts
// with it); k/KEY\xffq/ID are the waiters' queue records, attached to
// their leases; k/KEY\xffh/TOKEN are holder labels, attached to their
// token's lease and deleted by its release (see label.go); t/TOKEN/KEY
// are tombstones. All go by themselves, with their leases; nothing in the
// store needs cleaning.
//
// # URLs
//
//	etcd://[user:password@]host:port[,host:port...][?params]
//	etcds://[user:password@]host:port[,host:port...][?params]
//
// etcd:// speaks plain gRPC; etcds:// speaks TLS to every endpoint. The
// parameters, besides package lock's own (ttl, drift, maxhold, autorenew):
//
//	prefix           key prefix (default DefaultPrefix)
//	dialtimeout      bound of a connection attempt and of the login,
//	                 MinDialTimeout to MaxDialTimeout (default 5s)
//	electiontimeout  the cluster's --election-timeout, MinElectionTimeout
//	                 to MaxElectionTimeout (default 1s; WithElectionTimeout)
//	maxttl           the longest TTL granted, MinTTL to lock.MaxTTL
//	                 (default DefaultMaxTTL, 1m; WithMaxTTL)
//	sessions         true: the self-renewing locks of one TTL share a
//	                 lease (WithSessions; default false)
//	ca_file          etcds only: PEM file of the CAs to trust instead of
//	                 the system's roots
//	cert_file        etcds only: client certificate (PEM), with key_file,
//	                 for members started with --client-cert-auth
//	key_file         etcds only: the client certificate's key (PEM)
//	server_name      etcds only: the name the members' certificates must
//	                 carry, when it is not the host dialled (an IP
//	                 address, a tunnel); default the endpoint's host
//	skip_verify      etcds only: true accepts any certificate, so anyone
//	                 on the path can read and change the traffic; for
//	                 tests only, and refused with ca_file or server_name
//
// A TLS parameter on etcd:// is an error that says to use etcds://. TLS is
// 1.2 or later. A refused TLS connection (unknown authority, wrong name,
// no client certificate) shows in the error of the request that waited
// for it: clientv3 itself waits until the request's context ends and
// reports only that.
//
// user:password@ logs in to etcd's authentication (the user needs read
// and write permission on the keys under the prefix); both
// are required, and a user name without a password, or the reverse, is an
// error. clientv3 logs in when the client is made, so Open fails at once
// with a wrong password (the error never shows it). The password is a
// secret: lock.RedactURL and every error of lock.Open hide it. To keep it
// out of command lines and process listings, read the whole URL from a
// file or an environment variable of your own (lockctl: LOCK_BACKEND or
// --backend-file).
//
// # Environment
//
// A backend opened from a URL takes its endpoints, TLS and credentials
// from the URL only. go.etcd.io/etcd/client/v3 reads no variable that
// names endpoints, TLS files or credentials: the ETCDCTL_* variables
// (ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, ETCDCTL_USER, ...) are etcdctl's and
// have no effect here. The variables that the client and gRPC do read are
// about logging and debugging: ETCD_CLIENT_DEBUG (the log level of gRPC's
// logger, set when the program starts; the backend's own client logs
// nothing), ETCD_VERIFY (etcd's internal consistency checks, which panic
// when they fail), GRPC_GO_LOG_SEVERITY_LEVEL and
// GRPC_GO_LOG_VERBOSITY_LEVEL, and gRPC's GRPC_* feature switches. gRPC
// honours HTTPS_PROXY and NO_PROXY (through net/http's
// ProxyFromEnvironment; loopback addresses are never proxied): the
// connection to a proxy is plain HTTP CONNECT, and TLS to the member runs
// inside it.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/backend/waitq"
)

// DefaultPrefix is prepended to every key the backend writes.
const DefaultPrefix = "lock/"

// MinTTL is the shortest TTL the backend accepts: etcd leases count whole
// seconds.
const MinTTL = time.Second

// DefaultElectionTimeout is etcd's default election timeout
// (--election-timeout 1000).
const DefaultElectionTimeout = time.Second

// DeadTokenTTL is how long a released token stays dead at least (see Dead
// tokens in the package doc): longer than a request can take on the wire or
// in the leader's queue while its sender still waits for it. Tombstones
// share a lease of twice this, replaced after this, so each lives between
// DeadTokenTTL and twice that.
const DeadTokenTTL = 15 * time.Second

// Option configures a backend.
type Option func(*options)

type options struct {
	prefix          string
	electionTimeout time.Duration
	maxTTL          time.Duration
	closeClient     bool
	tls             *tlsCreds // the client's TLS, when opened from an etcds:// URL
	sessions        bool      // WithSessions
}

func defaultOptions() options {
	return options{prefix: DefaultPrefix, electionTimeout: DefaultElectionTimeout, maxTTL: DefaultMaxTTL}
}

// DefaultMaxTTL is the longest TTL the backend grants unless WithMaxTTL
// says otherwise: lock.DefaultMaxTTL, which says why.
const DefaultMaxTTL = time.Minute

// WithMaxTTL sets the longest TTL the backend grants (default
// DefaultMaxTTL), from MinTTL to lock.MaxTTL (New refuses others); the
// URL parameter maxttl sets it. Capabilities reports it, so package lock
// refuses a longer TTL (ErrInvalidTTL) before sending anything, and the
// backend's Acquire refuses one too (ErrInvalid). It bounds how long a
// holder that crashed, or a waiter killed while queued, blocks the key:
// the TTL, rounded up to whole seconds, plus the lease's extra second
// (see the guarantee table).
func WithMaxTTL(d time.Duration) Option { return func(o *options) { o.maxTTL = d } }

// WithPrefix sets the prefix of every key the backend writes. Default
// DefaultPrefix. Backends that share locks must use the same prefix.
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithElectionTimeout declares the cluster's election timeout (etcd's
// --election-timeout; default DefaultElectionTimeout). It changes nothing
// on the server: Capabilities uses it to bound how late a leader change may
// expire a lock.
func WithElectionTimeout(d time.Duration) Option {
	return func(o *options) { o.electionTimeout = d }
}

// withCloseClient makes Close close the etcd client: for backends opened
// from a URL, which own their client.
func withCloseClient() Option { return func(o *options) { o.closeClient = true } }

// Backend is the etcd backend. It implements backend.Backend,
// backend.Notifier, backend.Describer, backend.Inspector,
// backend.BatchRenewer and backend.TokenPrefixer (a prefix only with
// WithSessions).
type Backend struct {
	cli      *clientv3.Client
	opts     options
	leases   *leases
	ka       refresher
	tombs    tombLease
	queues   *queues
	waiters  *waitq.Group // the places of queues, and their leaves
	sessions *sessions    // nil without WithSessions
	closed   atomic.Bool
}

var (
	_ backend.Backend   = (*Backend)(nil)
	_ backend.Queuer    = (*Backend)(nil)
	_ backend.Describer = (*Backend)(nil)
	_ backend.Inspector = (*Backend)(nil)

	_ backend.TokenPrefixer = (*Backend)(nil)
)

// ErrNoClient is returned by New for a nil client.
var ErrNoClient = fmt.Errorf("%w: etcd: nil *clientv3.Client; pass a client made with clientv3.New", backend.ErrInvalid)

// New returns a backend over cli. The backend does not close cli unless it
// was opened from a URL; close the backend before the client.
func New(cli *clientv3.Client, opts ...Option) (*Backend, error) {
	if cli == nil {
		return nil, ErrNoClient
	}
	o := defaultOptions()
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.electionTimeout <= 0 {
		return nil, fmt.Errorf("%w: etcd: election timeout %v; want a positive duration, the cluster's --election-timeout", backend.ErrInvalid, o.electionTimeout)
	}
	if o.maxTTL < MinTTL || o.maxTTL > lock.MaxTTL {
		return nil, fmt.Errorf("%w: etcd: maximum TTL %v (WithMaxTTL) must be at least %v and at most %v (lock.MaxTTL)", backend.ErrInvalid, o.maxTTL, MinTTL, lock.MaxTTL)
	}
	b := &Backend{cli: cli, opts: o, leases: newLeases()}
	b.tombs.sem = make(chan struct{}, 1)
	b.ka.cli = cli
	b.queues, b.waiters = newQueues(b), waitq.NewGroup()
	if o.sessions {
		b.sessions = newSessions(b)
	}
	return b, nil
}

// lockKeyOf returns the etcd key of a lock: it ends in a byte that valid
// UTF-8 never has, so that the lock key and its queue records
// (queuePrefix) are the only keys with it as their prefix.
func (b *Backend) lockKeyOf(key string) string { return b.opts.prefix + "k/" + key + "\xff" }

// queuePrefix returns the prefix of the queue records of key.
func (b *Backend) queuePrefix(key string) string { return b.lockKeyOf(key) + "q/" }

// tombKeyOf returns the etcd key of a dead token's tombstone.
func (b *Backend) tombKeyOf(key, token string) string {
	return b.opts.prefix + "t/" + token + "/" + key
}

// seconds converts a TTL to whole seconds, rounding up: the store never
// expires a lock before the requested TTL.
func seconds(ttl time.Duration) int64 {
	return max(1, int64((ttl+time.Second-1)/time.Second))
}

// The lease of a lock of 2s or more, and of a waiter's queue record, lives
// one second longer than the lock's TTL in seconds (reserve): a lease whose
// latest confirmed refresh was sent less than unrefreshedWindow before an
// acquire still has more than the lock's TTL left when the store receives
// it, so the acquire needs no refresh of its own (asIs). Why this keeps
// the contract (the store keeps the lock at least its TTL from the
// request): the store keeps a lease at least its TTL from the send time of
// its latest confirmed grant or keep-alive, call it r (a keep-alive only
// extends a lease, a late one too, and a new leader restarts a lease's
// full TTL); an acquire sent at s < r + unrefreshedWindow thus holds the
// key until r + secs + 1s > s + secs + 0.5s. The half second left over is
// more than the clocks' drift over that interval. A refresh whose outcome
// is unknown is not counted (the lease is never reused). The cost: a holder
// that stops renewing (it crashed) keeps its lock up to one second longer;
// see latest expiry in the package doc. Locks of 1s go without: the extra
// second would double how long a crashed holder keeps others out.
const unrefreshedWindow = time.Second / 2

// reserve is how many seconds longer than a lock of secs seconds its lease
// lives.
func reserve(secs int64) int64 {
	if secs >= 2 {
		return 1
	}
	return 0
}

// leaseSecs is the TTL of the leases of locks of secs seconds.
func leaseSecs(secs int64) int64 { return secs + reserve(secs) }

// lockTTL is what a lease of leaseTTL seconds, refreshed after the
// request, promises the lock of secs seconds it carries.
func lockTTL(secs, leaseTTL int64) time.Duration {
	return time.Duration(leaseTTL-reserve(secs)) * time.Second
}

// asIs reports whether a lease for locks of secs seconds, whose latest
// confirmed refresh was sent at refreshed, can carry a lock acquired with a
// request sent at sent without a refresh of its own.
func asIs(secs int64, sent, refreshed time.Time) bool {
	return reserve(secs) > 0 && sent.Sub(refreshed) < unrefreshedWindow
}

func (b *Backend) check() error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	return nil
}

// checkTTL refuses a TTL above the backend's maximum (WithMaxTTL).
func (b *Backend) checkTTL(ttl time.Duration) error {
	if ttl > b.opts.maxTTL {
		return fmt.Errorf("%w: etcd: TTL %v is above this backend's maximum of %v (WithMaxTTL, URL parameter maxttl)", backend.ErrInvalid, ttl, b.opts.maxTTL)
	}
	return nil
}

// storeErr wraps an error from etcd, whose outcome is unknown, so that
// errors.Is reaches ctx's error when ctx ended and errors.As the client's.
// When the backend's client (one opened from an etcds:// URL) saw its
// latest TLS connection refused, the error says why: the client itself
// waits for a connection until ctx ends and reports only that.
func (b *Backend) storeErr(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("etcd: %s: %w (%w)", op, cerr, err)
	} else {
		err = fmt.Errorf("etcd: %s: %w", op, err)
	}
	if b.opts.tls != nil {
		if cerr := b.opts.tls.lastErr(); cerr != nil {
			err = fmt.Errorf("%w (the latest TLS connection failed: %w)", err, cerr)
		}
	}
	return err
}

// errDead is returned for an acquire with a token released before.
var errDead = fmt.Errorf("%w: etcd: acquire with a token that was released before; a token is for one acquisition", backend.ErrInvalid)

// Acquire implements backend.Backend: one transaction on a lease, an idle
// one of this backend refreshed by a keep-alive sent beside the
// transaction, or a new one.
func (b *Backend) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if err := b.check(); err != nil {
		return backend.Grant{}, err
	}
	if err := b.checkTTL(ttl); err != nil {
		return backend.Grant{}, err
	}
	if _, err := requestLabel(ctx); err != nil {
		return backend.Grant{}, err
	}
	if p := b.queues.watchedPlace(b.lockKeyOf(key)); p != nil {
		return p.q.Acquire(ctx, token, ttl) // a waiter of Watch
	}
	secs := seconds(ttl)
	if b.sessions != nil {
		if s, ok := b.sessions.Lookup(token); ok {
			return b.acquireInSession(ctx, key, token, secs, s)
		}
	}
	if id, refreshed := b.leases.take(secs); id != clientv3.NoLease {
		var g backend.Grant
		var err error
		if sent := time.Now(); asIs(secs, sent, refreshed) {
			// Refreshed recently enough to carry the lock as it is
			// (see reserve).
			g, err = b.acquireOn(ctx, key, token, secs, id, sent, refreshed, time.Duration(secs)*time.Second, nil, nil)
		} else {
			g, err = b.acquireOnIdle(ctx, key, token, secs, id)
		}
		if !errors.Is(err, errLeaseGone) {
			return g, err
		}
		// The idle lease expired (or was revoked) meanwhile: take a
		// new one.
	}
	sent := time.Now()
	resp, err := b.cli.Grant(ctx, leaseSecs(secs))
	if err != nil {
		return backend.Grant{}, b.storeErr(ctx, "acquire: lease", err)
	}
	g, err := b.acquireOn(ctx, key, token, secs, resp.ID, sent, sent, lockTTL(secs, resp.TTL), nil, nil)
	if errors.Is(err, errLeaseGone) {
		err = fmt.Errorf("etcd: acquire: lease %x, granted for it, was revoked before the transaction ran (by another client?)", resp.ID)
	}
	return g, err
}

// errLeaseGone: the acquire's lease did not exist, and the transaction did
// nothing.
var errLeaseGone = errors.New("etcd: the lease is gone")

// acquireOnIdle acquires on idle lease id, refreshing it with a keep-alive
// sent before the transaction and answered while it runs, so that the two
// cost one round trip. Why this keeps the contract: the keep-alive is sent
// after the caller's send time, so when it succeeds the store keeps the
// lease at least secs seconds from that time, whichever of the two the
// store handles first; the grant is reported only when both succeeded. A
// keep-alive that failed or whose outcome is unknown makes the acquire's
// outcome unknown: its key, if the transaction attached it, is on a lease
// that may expire earlier, so no grant is reported and the lease is never
// reused (the release that package lock sends revokes it).
func (b *Backend) acquireOnIdle(ctx context.Context, key, token string, secs int64, id clientv3.LeaseID) (backend.Grant, error) {
	sent := time.Now()
	ka, err := b.ka.start(id)
	if err != nil {
		return backend.Grant{}, b.storeErr(ctx, "acquire: keep-alive", err)
	}
	return b.acquireOn(ctx, key, token, secs, id, sent, sent, 0, ka, nil)
}

// acquireOn runs the acquire transaction on lease id, sent at sent: a
// lease whose latest confirmed refresh was sent at refreshed, which
// promises the lock granted, or refreshed by the keep-alive whose answer
// comes on ka (sent after sent). The lease is session s's (see
// sessions.go), or one for this lock alone when s is nil.
func (b *Backend) acquireOn(ctx context.Context, key, token string, secs int64, id clientv3.LeaseID, sent, refreshed time.Time, granted time.Duration, ka <-chan kaAnswer, s *session) (backend.Grant, error) {
	lk, tk := b.lockKeyOf(key), b.tombKeyOf(key, token)
	label := backend.Label(ctx) // checked by Acquire
	attach := func(refreshed time.Time, unknown, tainted bool) {
		b.leases.attachTo(lk, token, &heldLease{id: id, secs: secs, refreshed: refreshed, unknown: unknown, tainted: tainted, session: s, labelled: label != ""})
	}
	// Besides the key and the token, the queue of waiters: an acquire
	// that does not wait (see queue.go for those that do) takes the key
	// only when nobody queues.
	resp, err := b.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(lk), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(tk), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(b.queuePrefix(key)), "=", 0).WithPrefix(),
	).Then(
		// The holder's label, if any, on the lock's lease (see label.go).
		putLabel([]clientv3.Op{clientv3.OpPut(lk, token, clientv3.WithLease(id))}, lk, token, label, id)...,
	).Else(
		clientv3.OpGet(tk, clientv3.WithCountOnly()),
	).Commit()
	reuse := true
	if ka != nil {
		var kerr error
		var kttl int64
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			kerr = rpctypes.ErrLeaseNotFound // the answer does not matter
		} else {
			kttl, kerr = await(ctx, ka)
		}
		switch {
		case errors.Is(kerr, rpctypes.ErrLeaseNotFound) && (errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && !resp.Succeeded)):
			// The lease expired while idle, and the transaction
			// attached nothing to it.
			return backend.Grant{}, errLeaseGone
		case kerr != nil && err == nil && !resp.Succeeded:
			// The transaction attached no lock; the lease's expiry
			// is unknown, so it is not reused: it expires.
			reuse = false
		case kerr != nil:
			// The lease's expiry is unknown: the key, if attached,
			// may go earlier than the TTL from sent.
			attach(refreshed, true, true)
			return backend.Grant{}, b.storeErr(ctx, "acquire: keep-alive", errors.Join(kerr, err))
		}
		granted = lockTTL(secs, kttl)
		if s != nil {
			s.touch(refreshed) // the keep-alive, sent at sent
		}
	} else if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The lease is gone (revoked from outside, say): the
		// transaction did nothing, and nothing can attach to it later.
		return backend.Grant{}, errLeaseGone
	}
	if err != nil {
		// The key may be attached to the lease now or later: the
		// release that package lock sends to undo this attempt finds
		// the lease here and revokes it.
		attach(refreshed, true, false)
		return backend.Grant{}, b.storeErr(ctx, "acquire", err)
	}
	if resp.Succeeded {
		attach(refreshed, false, false)
		return backend.Grant{Fence: uint64(resp.Header.Revision), TTL: granted}, nil
	}
	if reuse && s == nil {
		b.leases.idle(id, secs, refreshed) // the transaction attached nothing to it
	}
	if resp.Responses[0].GetResponseRange().Count > 0 {
		return backend.Grant{}, errDead
	}
	// Held by another token (or by this one, if a client library sent the
	// request again: the contract allows ErrLocked then), or others queue.
	return backend.Grant{}, backend.Locked(0)
}

// revoke revokes lease id, best effort: a lease that is not revoked expires.
func (b *Backend) revoke(ctx context.Context, id clientv3.LeaseID) {
	_, _ = b.cli.Revoke(ctx, id)
}

// Tombstone values: the token released the lock, or did not hold it.
const (
	tombReleased = "1"
	tombNotHeld  = "0"
)

// Release implements backend.Backend: one transaction that deletes the key
// if the token holds it and leaves the token's tombstone either way. The
// lease goes back to the pool, or is revoked when it may still carry
// something: a renewal in flight, or an acquire still on its way.
func (b *Backend) Release(ctx context.Context, key, token string) error {
	if err := b.check(); err != nil {
		return err
	}
	lk, tk := b.lockKeyOf(key), b.tombKeyOf(key, token)
	// Every branch deletes the token's label (see label.go): leases
	// outlive their locks, in the pool or in a session.
	unlabel := clientv3.OpDelete(labelKey(lk, token))
	var resp *clientv3.TxnResponse
	var prev *mvccpb.KeyValue // what the key held when this token let it go
	// A lock this backend acquired, with a known outcome, is most likely
	// still held: first a transaction without the Else branch that kills a
	// token which does not hold the lock (etcd handles a transaction with a
	// nested one markedly slower, even when the branch does not run). When
	// it finds the lock not held it did nothing, and the whole transaction
	// follows.
	fast := b.leases.acquired(lk, token)
	// The tombstone of a token whose acquire on a session's lease had an
	// unknown outcome goes under that lease (see sessions.go).
	sessionTomb := b.leases.doubtfulSession(lk, token)
	// A lock of a session whose release has an unknown outcome is sent
	// again after the session's renewals (see released).
	s := b.leases.sessionOf(lk, token)
	for attempt := 0; ; attempt++ {
		tomb := sessionTomb
		var err error
		if tomb == clientv3.NoLease {
			if tomb, err = b.tombs.get(ctx, b.cli); err != nil {
				if s != nil {
					s.released(key, token, false)
				}
				return b.storeErr(ctx, "release: tombstone lease", err)
			}
		}
		own := []clientv3.Cmp{clientv3.Compare(clientv3.Value(lk), "=", token)}
		release := []clientv3.Op{
			clientv3.OpDelete(lk, clientv3.WithPrevKV()),
			clientv3.OpPut(tk, tombReleased, clientv3.WithLease(tomb)),
			unlabel,
		}
		var notHeld []clientv3.Op
		if !fast {
			// (Without the fast path's Else: a fast transaction that
			// finds the lock not held is followed by this one.)
			notHeld = []clientv3.Op{clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(tk), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(tk, tombNotHeld, clientv3.WithLease(tomb))},
				[]clientv3.Op{clientv3.OpGet(tk)},
			), unlabel}
		}
		var txn clientv3.Txn
		hk, head, handover := b.queues.head(lk)
		handover = handover && head.lease != 0 && head.token != token
		if handover {
			// Hand the lock to the head of the queue (see queue.go);
			// when the head's record changed since this backend saw
			// it, release as usual.
			txn = b.cli.Txn(ctx).If(append(own,
				clientv3.Compare(clientv3.ModRevision(hk), "=", head.mod))...,
			).Then(
				clientv3.OpPut(lk, head.token, clientv3.WithLease(clientv3.LeaseID(head.lease)), clientv3.WithPrevKV()),
				clientv3.OpDelete(hk),
				clientv3.OpPut(tk, tombReleased, clientv3.WithLease(tomb)),
				// The head's label, if its attempt carried one,
				// is beside its record already (see label.go).
				unlabel,
			).Else(clientv3.OpTxn(own, release, notHeld))
		} else {
			txn = b.cli.Txn(ctx).If(own...).Then(release...).Else(notHeld...)
		}
		resp, err = txn.Commit()
		switch {
		case err == nil && handover && resp.Succeeded:
			prev = resp.Responses[0].GetResponsePut().PrevKv
		case err == nil && handover:
			resp = (*clientv3.TxnResponse)(resp.Responses[0].GetResponseTxn())
		}
		if err == nil && resp.Succeeded && prev == nil {
			if kvs := resp.Responses[0].GetResponseDeleteRange().PrevKvs; len(kvs) == 1 {
				prev = kvs[0]
			}
		}
		if err == nil && fast && !resp.Succeeded {
			fast = false
			attempt--
			continue
		}
		if errors.Is(err, rpctypes.ErrLeaseNotFound) && tomb == sessionTomb {
			// The session's lease is gone, and every key on it: an
			// acquire still on its way cannot attach to it. The
			// transaction did nothing; the tombstone goes under the
			// tombstones' lease.
			sessionTomb = clientv3.NoLease
			attempt--
			continue
		}
		if errors.Is(err, rpctypes.ErrLeaseNotFound) && attempt == 0 {
			// The tombstone lease is gone (it expired while this
			// backend stood idle past it, say); the transaction did
			// nothing. Take a new one.
			b.tombs.drop(tomb)
			continue
		}
		if s != nil {
			s.released(key, token, err == nil)
		}
		if err != nil {
			return b.storeErr(ctx, "release", err)
		}
		break
	}
	h, reusable := b.leases.release(lk, token)
	// A lease is revoked only when this backend made it for this lock
	// alone: a lease found under the key may be another client's
	// session's (see sessions.go), and a revoke would take all its locks.
	own := h != nil && h.session == nil
	if resp.Succeeded {
		// The lease holds nothing now: reuse it, or revoke it when a
		// renewal of it is in flight.
		switch {
		case own && reusable && prev != nil && prev.Lease == int64(h.id):
			b.leases.idle(h.id, h.secs, h.refreshed)
		case own && prev != nil && prev.Lease == int64(h.id):
			b.revoke(ctx, h.id)
		}
		return nil
	}
	if own {
		// An acquire transaction still on its way must find no lease
		// to attach the key to. (On a session's lease, the token's
		// tombstone under that lease refuses it.)
		b.revoke(ctx, h.id)
	}
	inner := resp.Responses[0].GetResponseTxn()
	if !inner.Succeeded {
		if kvs := inner.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 && string(kvs[0].Value) == tombReleased {
			return nil // released before: a release sent again
		}
	}
	return backend.ErrNotHeld
}

// tombLease hands out the lease that tombstones are written under: one per
// backend, replaced once it has lived DeadTokenTTL, so that each tombstone
// lives between DeadTokenTTL and twice that.
type tombLease struct {
	sem     chan struct{} // held while granting; a channel so that waiting heeds ctx
	mu      sync.Mutex
	id      clientv3.LeaseID
	granted time.Time // when the grant was sent
}

func (t *tombLease) current() clientv3.LeaseID {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.id != clientv3.NoLease && time.Since(t.granted) < DeadTokenTTL {
		return t.id
	}
	return clientv3.NoLease
}

func (t *tombLease) get(ctx context.Context, cli *clientv3.Client) (clientv3.LeaseID, error) {
	if id := t.current(); id != clientv3.NoLease {
		return id, nil
	}
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return clientv3.NoLease, ctx.Err()
	}
	defer func() { <-t.sem }()
	if id := t.current(); id != clientv3.NoLease {
		return id, nil // granted while this call waited
	}
	sent := time.Now()
	resp, err := cli.Grant(ctx, int64(2*DeadTokenTTL/time.Second))
	if err != nil {
		return clientv3.NoLease, err
	}
	t.mu.Lock()
	t.id, t.granted = resp.ID, sent
	t.mu.Unlock()
	return resp.ID, nil
}

// drop forgets id if it is the current tombstone lease.
func (t *tombLease) drop(id clientv3.LeaseID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.id == id {
		t.id = clientv3.NoLease
	}
}

// Inspect implements backend.Inspector: a read of the lock key with the
// label of its holder's token (see label.go), and of its lease's remaining
// TTL, in whole seconds rounded down.
func (b *Backend) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	if err := b.check(); err != nil {
		return backend.Holder{}, err
	}
	lk := b.lockKeyOf(key)
	// The lock key and, after it, the label keys, in one read.
	resp, err := b.cli.Get(ctx, lk, clientv3.WithRange(labelsEnd(lk)), clientv3.WithLimit(1+inspectLabels))
	if err != nil {
		return backend.Holder{}, b.storeErr(ctx, "inspect", err)
	}
	if len(resp.Kvs) == 0 || string(resp.Kvs[0].Key) != lk {
		return backend.Holder{}, nil
	}
	kv := resp.Kvs[0]
	h := backend.Holder{Held: true, Token: string(kv.Value), Fence: uint64(kv.ModRevision)}
	found := false
	for _, l := range resp.Kvs[1:] {
		if string(l.Key) == labelKey(lk, h.Token) {
			h.Label, found = string(l.Value), true
		}
	}
	if !found && resp.More {
		// More waiters have labels than the first read took: the
		// holder's alone. A label key describes its token only, so a
		// later read cannot show another holder's.
		lr, err := b.cli.Get(ctx, labelKey(lk, h.Token))
		if err != nil {
			return backend.Holder{}, b.storeErr(ctx, "inspect: label", err)
		}
		if len(lr.Kvs) == 1 {
			h.Label = string(lr.Kvs[0].Value)
		}
	}
	if kv.Lease != 0 {
		ttl, err := b.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil {
			return backend.Holder{}, b.storeErr(ctx, "inspect: lease", err)
		}
		h.Remaining = max(0, time.Duration(ttl.TTL)*time.Second)
	}
	return h, nil
}

// Capabilities implements backend.Describer.
func (b *Backend) Capabilities() backend.Capabilities { return capabilities(b.opts) }

func capabilities(o options) backend.Capabilities {
	return backend.Capabilities{
		MinTTL:      MinTTL,
		MaxTTL:      o.maxTTL,
		Granularity: time.Second,
		// A new leader restarts every lease's full TTL (the lock's,
		// rounded up to seconds, plus the reserve second), plus an
		// election timeout, when it takes over, which can be just
		// before the lease would have expired, an election or two after
		// the old leader failed: 2 x the lease's TTL (at most 2 x TTL +
		// 4s), 3 election timeouts, and the leader's half-second scan
		// for expired leases with the revoke's commit. Further leader
		// changes restart the lease again; the bound cannot cover them
		// (see the package doc).
		ExpiryFactor: 2,
		ExpirySlack:  4*time.Second + 3*o.electionTimeout + 600*time.Millisecond,
		// A lock's lease keeps the TTL it was granted with.
		FixedTTL:     true,
		DurableFence: true,
		FIFO:         true,
		// Stored beside the lock, on its lease (see label.go).
		Labels: true,
	}
}

// Close ends the backend's watches and waits for the revokes of waiters
// that left (a few seconds at most for a store that does not answer; a
// waiter's lease not revoked expires after its TTL). It closes the etcd client only when the
// backend was opened from a URL. It does not release held locks: their
// leases expire, as do its idle leases.
func (b *Backend) Close() error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	b.queues.close()
	b.waiters.Close()
	if b.sessions != nil {
		b.sessions.Close()
	}
	b.ka.close()
	if b.opts.closeClient {
		return b.cli.Close()
	}
	return nil
}
