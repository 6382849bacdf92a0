// Package backend is the contract a lock store implements. Application code
// should use package lock (github.com/distlock/lock); this package is for
// people writing a backend.
//
// A backend does one atomic step per call and no policy: it never retries,
// never sleeps, never renews on its own schedule and never measures validity.
// Package lock does all of that once, for every backend. Prove a backend with
// package conformance, which drives it through package lock.
//
// # Keys, tokens and TTLs
//
// Package lock validates its input before calling a backend: a key is 1 to
// lock.MaxKeyLen bytes of valid UTF-8, a token is 32 lower-case hex digits
// (128 random bits, unique per acquisition; see TokenPrefixer for the one
// exception), a TTL is positive and at least Capabilities.MinTTL.
//
// A backend must store every valid key, each as a lock of its own: NUL
// bytes, "." and "..", "a//b" beside "a/b", "a/./b", "a/b/", keys that
// differ only in case or in Unicode normalisation, and keys of
// lock.MaxKeyLen bytes are all distinct locks. A store that cannot hold a
// key as it is (a column that refuses NUL, a path that cleans "a//b")
// encodes it (hex, percent-escaping) so that distinct keys stay distinct;
// it never refuses one. The conformance case KeyShapes sends such keys
// (its doc lists them). A backend may reject a TTL outside its
// Capabilities, or a label it cannot store, with an error wrapping
// ErrInvalid, changing nothing.
//
// # Errors
//
// Return ErrLocked (via Locked, to carry the holder's remaining TTL) when the
// key is held by another token, and ErrNotHeld when a renew or release finds
// the key free or held by another token. Any other error means the outcome is
// unknown to the caller (the request may or may not have taken effect); wrap
// the store's error so that errors.As reaches it. When ctx ends, return an
// error that wraps ctx.Err(), promptly: a call that outlives its context
// holds up package lock's cancellation and cleanup.
//
// # Time
//
// A store expires a lock by its own clock, never earlier than the TTL after
// it received the acquire or renew; Capabilities.ExpiryFactor and
// ExpirySlack bound how much later, counted from the same moment. Package
// lock measures validity on the client's monotonic clock from the send
// time, which comes before, and subtracts a drift allowance.
//
// "Received" is any moment from the request's arrival on: the moment the
// store executes it, after waiting for a row lock or a queue, is as good,
// since package lock counts from the send, which comes before both. The
// latest-expiry bounds count from the same moment, so a store whose
// requests may wait long before they run declares that wait in
// ExpirySlack (or counts the expiry from the arrival).
//
// # Requests out of order, and dead tokens
//
// A store receives requests out of order when any of these holds, and
// then must keep released tokens dead (see Acquire and Release):
//   - its client library sends a request again after a lost reply or a
//     timeout (go-redis, etcd's and Consul's clients all can);
//   - a request can still run on the server after the caller's context
//     ended: a SQL driver that closes the connection when the context
//     ends leaves the statement running on the server, and package
//     lock's cleanup release, sent on another connection of the pool,
//     can overtake it;
//   - requests of one client travel over more than one connection (a
//     pool), or to more than one node.
//
// Nearly every networked store is one of these; only a store in the
// process (package memory) is not.
//
// A dead token is one that a Release was sent for, whether that release
// found the lock held by it (it freed it) or not (ErrNotHeld): both kill
// the token. For at least MinDeadTokenTTL after the release, and at least
// as long as a request of the backend's can take to reach the store
// (retries and timeouts of its client library included), the store
// refuses an Acquire, Queue.Acquire or Transfer to a dead token (an error
// wrapping ErrInvalid) and answers a Release of a token that died holding
// the lock with nil again. The check of the tombstone and the grant, and
// the release and the tombstone it leaves, must each be one atomic step
// with respect to the other requests on the same key: run them in one
// script or transaction serialised per key (a row lock taken with SELECT
// ... FOR UPDATE, SERIALIZABLE isolation, a Lua script, a Raft
// transaction). Two statements under READ COMMITTED race: a late acquire
// checks the tombstone before the release writes it, and grants after.
//
// # URLs
//
// A backend package makes itself available to lock.Open by calling
// lock.Register from its init function, with its URL scheme, the query
// parameters it accepts, and a function that builds the backend from the
// URL; unknown parameters are rejected before that function is called.
//
// # Proving a backend
//
// Run package conformance against the real store, with a harness that
// offers its fault hooks (conformance/faultproxy does the network part,
// conformance/serverproc the server process), and
// conformance.RequireHooks so that nothing is skipped unnoticed. The
// repository's internal/sqltest/pgbackend is a worked example on
// PostgreSQL, whose package doc walks through it.
//
// Dead tokens cannot cover every delay: a request held longer than the
// store keeps its tombstones (a partition of TCP that heals after more
// than MinDeadTokenTTL, say) arrives after its tombstone is gone. Keep
// tombstones longer than the longest delay the store's network allows,
// and bound client-side retries and timeouts below it.
package backend

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors of the contract. Package lock re-exports them, so
// errors.Is(err, lock.ErrLocked) holds for a backend's ErrLocked.
var (
	// ErrLocked: the key is held by another token.
	ErrLocked = errors.New("lock: held by another owner")
	// ErrNotHeld: the key is not held by the given token (free, expired, or
	// held by someone else).
	ErrNotHeld = errors.New("lock: not held by this owner")
	// ErrContended: the attempt got no lock, but no other owner holds the
	// key, and the store answered: trying again may succeed. Redlock
	// returns it when concurrent attempts split the nodes so that none got
	// a majority (a split vote), and when a majority granted but later
	// than the TTL, so that no validity was left. The attempt left nothing
	// behind (a multi-node store has undone its partial or late grants);
	// package lock retries it after a random delay, a TryAcquire for at
	// most about a TTL.
	ErrContended = errors.New("lock: contended: the attempt got no lock, but no other owner holds the key")
	// ErrInvalid: the input cannot be accepted. Nothing was changed.
	ErrInvalid = errors.New("lock: invalid argument")
	// ErrClosed: the backend or client was closed.
	ErrClosed = errors.New("lock: closed")
)

// Backend is the contract. Implementations must be safe for concurrent use.
//
// Every method is atomic on the store: another client observes either none or
// all of its effect. Every method should be one round trip where the store
// allows it.
type Backend interface {
	// Acquire takes key for token for ttl if the key is free or its previous
	// holder's TTL has run out.
	//
	// On success it returns a Grant whose Fence is greater than every fence
	// granted before for this key by this store, and whose TTL is the TTL the
	// store will enforce (it may round ttl up to its granularity, never down).
	// The store must not expire the lock earlier than ttl after it received
	// the request.
	//
	// If another token holds the key, it returns an error for which
	// errors.Is(err, ErrLocked) holds; use Locked to report the holder's
	// remaining TTL when it is cheap to know.
	//
	// A store with several nodes that finds nobody holding a majority but
	// cannot get one either, because of concurrent attempts, or that got
	// one too late to hold the lock (later than the TTL), undoes its
	// partial or late grant and returns ErrContended: the store answers
	// and nobody holds the key, so package lock tries again. Package lock
	// sends no release after ErrContended: undo the grants first.
	//
	// A token is used for one acquisition attempt only, and re-entrancy is
	// not part of the contract. If token already holds key (a client
	// library sent the request again after a lost reply), Acquire either
	// returns ErrLocked or grants it again: with the fence it was granted
	// (or a greater one, never granted to another token: Redlock cannot
	// tell whether its raise of the nodes' counters to the first fence
	// landed, and takes the next), and with the store's expiry set to ttl
	// from this request, as for a new grant (the caller counts its
	// deadline from this request's send time).
	//
	// Requests may reach the store out of order: an acquire may arrive
	// after the Release that was sent to undo it (the caller gave up while
	// it was on its way), or twice. A store that can receive requests out
	// of order (see the package doc: nearly every networked store) must
	// keep a released token dead for at least MinDeadTokenTTL: an Acquire
	// with a token released before must not take the lock (return an
	// error wrapping ErrInvalid). Say in the package doc how long.
	Acquire(ctx context.Context, key, token string, ttl time.Duration) (Grant, error)

	// Renew extends the lock that token holds on key to ttl from now and
	// returns the fence it was granted with, or 0 when the store does not
	// keep it at hand (package lock keeps the fence from Acquire). If the key is free, expired,
	// or held by another token, it returns ErrNotHeld and changes nothing: a
	// renew never re-acquires.
	Renew(ctx context.Context, key, token string, ttl time.Duration) (Grant, error)

	// Release frees key if token holds it. Otherwise it returns ErrNotHeld
	// and changes nothing on the lock. Either way the token is dead from
	// then on (see the package doc). A release sent again after it took
	// effect (a client library's retry after a lost reply) returns nil for
	// at least MinDeadTokenTTL after the first: package lock would
	// otherwise report a lease held until its release as lost. Release is
	// also how package lock undoes an acquire whose outcome it does not
	// know: see Acquire about tokens released before.
	Release(ctx context.Context, key, token string) error

	// Close releases the backend's resources. It does not release held locks;
	// they expire. Calls after Close return ErrClosed.
	Close() error
}

// Grant describes a lock the store granted.
type Grant struct {
	// Fence is the fencing token: > 0 and strictly increasing over successive
	// grants of the same key.
	Fence uint64
	// TTL is the time to live the store enforces, >= the requested TTL.
	// Zero means exactly the requested TTL.
	TTL time.Duration
}

// LockedError is the error Acquire returns when another token holds the key.
// errors.Is(err, ErrLocked) holds for it.
type LockedError struct {
	// Remaining is the holder's remaining TTL as the store saw it, or 0 when
	// unknown.
	Remaining time.Duration
}

// Locked returns a *LockedError with the holder's remaining TTL; pass 0 when
// it is unknown.
func Locked(remaining time.Duration) error {
	return &LockedError{Remaining: remaining}
}

func (e *LockedError) Error() string {
	if e.Remaining > 0 {
		return fmt.Sprintf("%v (expires in %v unless renewed)", ErrLocked, e.Remaining)
	}
	return ErrLocked.Error()
}

// Is makes errors.Is(err, ErrLocked) hold.
func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// Notifier is an optional interface: a backend that can tell waiters when a
// key may have become free (released, expired, or deleted) implements it, and
// package lock then waits on it instead of polling.
type Notifier interface {
	// Watch starts watching key; ctx bounds setting the watch up (a
	// subscription, say), not the watch's life, which lasts until Close.
	// The returned Watch's C receives a value
	// (non-blocking, buffered one) when key may have become free, from the
	// moment Watch returns. Package lock retries the acquisition after each
	// wake-up and closes the Watch when it took the key or gave up.
	//
	// The rule a Notifier must keep is progress: after a release, at least
	// one watcher that will still try is woken. Waking every watcher keeps
	// it trivially; waking one (the longest-waiting, to avoid a stampede)
	// keeps it only if a watcher that leaves without the key passes its
	// wake-up on (see Watch.Close). Spurious wake-ups are allowed. Wake-ups on expiry are optional:
	// package lock bounds every wait by the holder's remaining TTL, so a
	// missed expiry costs latency, not progress.
	Watch(ctx context.Context, key string) (Watch, error)
}

// Watch is a subscription returned by Notifier.Watch.
type Watch interface {
	// C receives the wake-ups.
	C() <-chan struct{}
	// Close ends the watch. took reports whether the watcher took the key.
	// A Notifier that wakes one watcher per release wakes the next one when
	// a woken watcher leaves without the key (took is false): it may have
	// consumed the only wake-up of a release.
	Close(took bool) error
}

// Queuer is an optional interface of a Notifier whose store keeps a queue
// of waiters and hands a released lock to the waiter at its head, with no
// request from the waiter: the release that frees the key gives it to the
// head's token in the same step. Package lock uses it for every Acquire
// that waits, instead of Watch.
type Queuer interface {
	Notifier
	// Queue returns a place in key's queue for one caller that waits for
	// it. It sends nothing: the place's Acquire does.
	Queue(key string) (Queue, error)
}

// Queue is one waiter's place in a key's queue (see Queuer).
type Queue interface {
	// Watch's C receives a wake-up when the key may have become free
	// while the waiter is at the head of the queue, when the store handed
	// the lock to it, or when its place was lost (its record expired):
	// the caller then checks Handed, and otherwise tries Acquire again.
	// Close(took) leaves the queue; when took is false, a lock the store
	// handed to the waiter, or hands to it later, is freed, and nothing
	// of the waiter is left in the store.
	Watch
	// Acquire is Backend.Acquire for the waiter: when the key is held or
	// others queue before the waiter, the same request puts the waiter in
	// the queue with token (the place its first refused Acquire took, or
	// the back of the queue when that place was lost) and returns
	// ErrLocked. When the store handed the lock to the waiter and the
	// caller did not take it (Handed came too late to count on), Acquire
	// takes it over for token, as a new grant.
	Acquire(ctx context.Context, token string, ttl time.Duration) (Grant, error)
	// Handed reports the lock the store handed to the waiter: to the token
	// of one of its Acquires that returned ErrLocked. Since is the send
	// time, on this process's monotonic clock (time.Now), of a request
	// of the waiter's after which the store keeps the lock at least
	// Grant.TTL; the caller counts its deadline from there.
	Handed() (Handover, bool)
}

// Handover is a lock the store handed to a waiter (see Queue.Handed).
type Handover struct {
	Token string
	Grant
	Since time.Time
}

// LossNotifier is an optional interface: a backend whose store can say at
// once that a lock is no longer held by its token (the key deleted from
// outside, the session or lease behind it destroyed) implements it, and
// package lock then ends the lease as soon as the store says so, instead of
// at its next renewal or its deadline.
type LossNotifier interface {
	// NotifyLoss starts watching the lock token holds on key, just
	// granted. It calls lost, at most once and from a goroutine of the
	// backend's, when the store says that token no longer holds key, with
	// an error that says what happened; it must never call it while the
	// store holds the lock for token (a stale read must not count: watch
	// from the state that includes the grant). stop ends the watch; it must
	// not wait for a call of lost in progress, and lost may still be called
	// once after stop (package lock ignores it once the lease has ended).
	// Close ends every watch.
	NotifyLoss(key, token string, fence uint64, lost func(error)) (stop func())
}

// Transferer is an optional interface: a backend that can pass a held lock
// from one owner token to another in one atomic step. Package lock uses it
// to hand a released lock straight to the next goroutine of the same client
// waiting for the key.
type Transferer interface {
	// Transfer gives key, held by token from, to token to, with ttl from
	// now. It returns ErrNotHeld, changing nothing, when from does not hold
	// the key.
	//
	// With opt.Fence 0 it takes a new fence for to (greater than every
	// fence granted before), and returns ErrTransferRefused, changing
	// nothing, when an owner outside this client waits for the key: the
	// key must then be released, so that waiters elsewhere get their
	// chance. With opt.Fence > 0, a fence reserved by an earlier transfer
	// (Transferred.Next), it gives to that fence and is not refused: an
	// owner waiting elsewhere stays known to the store, so that to's
	// release wakes it.
	//
	// With opt.Reserve it also reserves a fence for the owner after to,
	// Transferred.Next: greater than every fence granted so far, and less
	// than every fence granted after it; Next is 0 when an owner outside
	// this client waits for the key.
	//
	// A transfer sent again after it took effect (a client library's
	// retry after a lost reply) succeeds with to's fence and Next 0 while
	// to holds the key. Once to's lock has ended, it fails with
	// ErrHandedOnBefore, not ErrNotHeld (from held the lock until it
	// handed it on; the caller cannot know what became of to's lock), and
	// a Release by from returns nil, as after a release of from that took
	// effect.
	Transfer(ctx context.Context, key, from, to string, ttl time.Duration, opt TransferOptions) (Transferred, error)
}

// TransferOptions are the options of one Transfer.
type TransferOptions struct {
	Fence   uint64 // reserved for to; 0: take a new one
	Reserve bool   // reserve a fence for the owner after to
}

// Transferred is what a Transfer granted.
type Transferred struct {
	Fence uint64        // to's fence
	TTL   time.Duration // as Grant.TTL
	Next  uint64        // reserved for the owner after to; 0 when none
}

// MinDeadTokenTTL is the shortest time a store that receives requests out
// of order keeps a released token dead (see the package doc): longer than
// the clients of this module's stores take to send a request again after a
// lost reply (go-redis: three retries of at most 512ms backoff and a 3s
// read timeout each). A backend whose requests can take longer to reach
// the store keeps its tokens dead longer.
const MinDeadTokenTTL = 15 * time.Second

// ErrTransferRefused: Transfer found others waiting for the key.
var ErrTransferRefused = errors.New("lock: transfer refused: others wait for the key")

// ErrHandedOnBefore: Transfer found that from no longer holds the key
// because it handed the lock on (or released it) before: the transfer was
// sent again after it took effect, and to's lock has ended. It is neither
// ErrNotHeld nor a refusal: the caller does not know what became of to's
// lock, as after a lost reply (see Transferer).
var ErrHandedOnBefore = errors.New("lock: the from token handed the lock on (or released it) before: a transfer sent again after it took effect, whose new owner no longer holds the lock")

// TokenPrefixer is an optional interface: a backend whose leases share
// state on the store (a session that many leases of one client keep alive
// together) names that state in the leases' tokens, so that it finds the
// session of a renewal or a release from its token alone, with no state per
// lease in the process.
//
// Package lock asks for the prefix of every token it makes for the
// backend for a lease that renews itself (automatic renewal): each
// acquisition attempt (Acquire and Queue.Acquire) and each goroutine
// waiting for a Transfer. A lease whose token has a prefix and that ends
// lost at its deadline (its renewals failed, or it reached its maximum
// hold time) is released in the background: its lock may live on with its
// session. It fills the token to 32 bytes with
// random hexadecimal digits, so the prefix may be at most 8 bytes long,
// leaves at least 96 random bits, and must not start with a hexadecimal
// digit (a token without a prefix is 32 of them): a prefix "S" followed by
// seven characters, say. The backend must accept tokens without a prefix
// too (those of a lease made before, or by another client).
//
// TokenPrefix does not block: making the session on the store is part of
// the first request that uses it. An error (the backend is closed) ends the
// acquisition with it.
type TokenPrefixer interface {
	TokenPrefix(ttl time.Duration) (string, error)
}

// MaxTokenPrefix is the longest prefix a TokenPrefixer may return.
const MaxTokenPrefix = 8

// Describer is an optional interface reporting what a backend guarantees.
// Package lock uses MinTTL to validate input; the conformance suite uses the
// rest to derive its waits and its checks.
type Describer interface {
	Capabilities() Capabilities
}

// Capabilities describes a backend's limits and guarantees.
type Capabilities struct {
	// MinTTL is the shortest TTL the store accepts. Package lock rejects
	// shorter ones with ErrInvalid before calling the backend.
	MinTTL time.Duration
	// MaxTTL is the longest TTL the store accepts; 0 means no limit.
	// Package lock rejects longer ones with ErrInvalid before calling the
	// backend. Every backend of this module has one (lock.DefaultMaxTTL
	// unless its WithMaxTTL or URL parameter maxttl says otherwise): it
	// bounds how long a crashed holder, or a killed waiter handed the
	// lock, blocks a key. (Redlock needs it besides: a node that comes
	// back empty waits MaxTTL before it votes again, so that every lock it
	// forgot has expired.)
	MaxTTL time.Duration
	// Granularity is the unit the store rounds TTLs up to (1ms for Redis
	// PX, 1s for etcd leases). Zero means exact.
	Granularity time.Duration
	// ExpiryFactor and ExpirySlack bound how late the store may expire a
	// lock: at most ttl*ExpiryFactor + ExpirySlack after it granted or
	// renewed it. A factor of 0 counts as 1.
	ExpiryFactor float64
	ExpirySlack  time.Duration
	// DurableFence is true when fences stay strictly increasing across a
	// restart of the store in its documented safe configuration.
	DurableFence bool
	// FIFO is true when waiters are served in arrival order.
	FIFO bool
	// FixedTTL is true when a lock keeps the TTL it was acquired with:
	// Renew with another TTL is refused (ErrInvalid) or grants the
	// acquired one. Package lock's Lease.Extend then refuses a new TTL
	// before sending anything.
	FixedTTL bool
	// Labels is true when the store keeps the holder label of every lock
	// it grants (see Label) and Inspect reports it in Holder.Label.
	Labels bool
	// InProcess is true when the store lives in this process, so a request
	// costs no round trip. Package lock then skips its per-client queue of
	// goroutines waiting for the same key, which exists to save requests.
	InProcess bool
}

// LatestExpiry returns how long after a grant of ttl the store may still hold
// the lock at the latest.
func (c Capabilities) LatestExpiry(ttl time.Duration) time.Duration {
	f := c.ExpiryFactor
	if f < 1 {
		f = 1
	}
	return time.Duration(float64(ttl)*f) + c.ExpirySlack
}

// Inspector is an optional interface for reading the current holder of a key,
// for tools and tests. It is a read: it never changes the lock.
type Inspector interface {
	// Inspect returns the holder of key, or a Holder with Held false when the
	// key is free.
	Inspect(ctx context.Context, key string) (Holder, error)
}

// Holder describes the current holder of a key.
type Holder struct {
	Held bool
	// Token of the holder. Empty when the store does not reveal it.
	Token string
	// Fence the holder was granted.
	Fence uint64
	// Remaining TTL as the store sees it, or 0 when unknown.
	Remaining time.Duration
	// Label is the holder label stored with the holder's token (see
	// Label), or "" when the store keeps none for it.
	Label string
}
