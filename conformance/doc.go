// Package conformance is the test suite every backend of package lock runs
// against itself, including backends written outside this module. It drives
// the backend through package lock, the way applications use it, against a
// real store, and checks every promise of package lock's documentation:
// mutual exclusion between clients and between goroutines of one client,
// token-checked renew and release, expiry and takeover bounds, fence
// monotonicity, context cancellation, the lost-lock signal, many keys without
// leaks, bad input, and a recorded history checked with a lease-lock model.
// A backend that implements backend.Transferer also runs the Transfer,
// HandoverFails and HandoverLostOnTheWay cases; Transfer checks that
// contract on the store directly.
//
// A backend's whole test wiring is one small test:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, func(t *testing.T) conformance.Harness {
//			return newHarness(t) // starts or connects to a store
//		})
//	}
//
// Cases are subtests, so `go test -run 'TestConformance/Fences'` picks some.
// The suite derives every wait from the TTL bounds the harness declares: its
// short TTL is max(MinTTL, 200ms) rounded up to the granularity, its long
// TTL max(10 x short, 10s).
//
// # Cases
//
// The sections below describe every case, grouped by subject: what it
// does, the promise it checks, what it needs, and how it usually fails,
// quoting its failure message and naming the usual cause in a store. Below,
// "short" and "long" are the TTLs above, "latest expiry" is
// Capabilities.LatestExpiry, and "slack" is the scheduling allowance the
// suite adds to every bound it checks (500ms plus half the short TTL).
// Several cases check package lock's own promises, which every backend
// inherits: a failure there points at package lock, or at the harness's
// hooks, more often than at the store, and its entry says so.
//
// A case that needs a hook or a backend interface the harness lacks is
// skipped; Run prints the skipped cases, and RequireHooks makes them fail
// the run. A case whose check depends on a capability the store does not
// declare passes without checking, and logs why. What each hook, interface
// and capability turns on:
//
//   - backend.Inspector: InspectAfterExpiry, HolderLabel,
//     DeadlineWithinStore, RetriedAcquire, CancelUnderLoad, ReplyLost and
//     ReleaseSentAgain need it; StaleOwner, KeyShapes, ManyKeys and
//     Transfer use it when it is there.
//   - ReplyHolder: DeadlineFromSend, ReplyLost, ReleaseSentAgain,
//     HandoverFails.
//   - Disconnecter: LostSignalWhileRenewalsHang, ReleaseSentAgain;
//     Disconnecter, or else Pauser: LostSignal, CancelWhileStoreHangs.
//   - LinkDelayer, or else Delayer: GiveUpUnderLoad, which also runs
//     without them, with fewer requests overtaking each other.
//   - Restarter: FenceAfterRestart. RequestCounter: HotKeyRequests.
//     Evicter: LockEvicted.
//   - backend.Notifier (a backend.Queuer is one): WakeOnRelease,
//     WatchBeforeRelease, WaiterTTLShorterThanWait,
//     CancelledWaiterRetakes.
//   - backend.Transferer: Transfer, HandoverFails and
//     HandoverLostOnTheWay, which Run adds only then. backend.LossNotifier: LockFreedOutside wants the loss at once
//     instead of by the next renewal.
//   - Capabilities.FIFO: FIFOOrder and HotKeyRequests check only then;
//     DurableFence: FenceAfterRestart checks only then; Labels and
//     FixedTTL change what HolderLabel and Extend expect; with InProcess,
//     HandoverFails checks nothing.
//   - ConnResetter, and Pauser and Restarter beyond the above, serve
//     RunFaults only.
//
// Failures that any case can show:
//
//   - A panic "conformance: case C: backend Acquire ignores its context":
//     a backend call still ran 5s plus four times the slack after its
//     context ended. Every call must return promptly with an error
//     wrapping ctx.Err(): a client library whose own read timeout is
//     longer, or a statement that waits for a row lock with no timeout,
//     breaks this.
//   - "history of N operations is not linearizable under the lease-lock
//     model" (cases that record a history: TryAcquireRace,
//     MutualExclusion, SharedClient, FencesContended, StaleOwner,
//     GiveUpUnderLoad, IdleResourcesExpire): two owners held a key at
//     once, a fence did not increase, or a renew or release succeeded for
//     a token that did not hold the key. An undecided history ("the
//     checker did not decide") fails too.
//   - An error wrapping lock.ErrBackendContract: the backend reported a
//     grant with fence 0, or with a Grant.TTL shorter than the TTL asked
//     for.
//   - "conformance: the harness declares ..., the backend's Capabilities
//     say ..." (before the cases): Harness.Capabilities differs from the
//     backend's backend.Describer.
//   - "harness Disconnect: ..." and the like: a hook of the harness
//     failed, not the store.
//
// # Exclusion, fences, keys and tokens
//
// BadInput:
//   - Does: sends invalid keys, TTLs, options, contexts, a nil function
//     and a nil backend through package lock, then uses a closed client.
//   - Checks: package lock refuses each with the right error
//     (ErrInvalidKey, ErrInvalidTTL, ErrInvalidOption, ErrInvalid,
//     ErrClosed; each message begins with "lock: ") without sending
//     anything to the store, and the key stays free.
//   - Needs: nothing.
//   - Fails: "... sent N requests to the store; want none" and wrong
//     errors point at package lock; "TryAcquire of the key after bad
//     input" at a store that cannot take and release a fresh key.
//
// TryAcquireRace:
//   - Does: 8 clients call TryAcquire on a fresh key at once, 30 times.
//   - Checks: exactly one wins each round; the others get ErrLocked.
//   - Needs: nothing.
//   - Fails: "K of 8 concurrent TryAcquire calls won; want exactly 1": the
//     grant is not one atomic step (a read then a write, two statements
//     under READ COMMITTED, no unique constraint on the key). "TryAcquire:
//     ...; want success or ErrLocked": contention surfaces as another
//     error (a serialization failure or deadlock the backend does not turn
//     into ErrLocked).
//
// MutualExclusion:
//   - Does: 8 clients each take one key 20 times with Acquire, hold it for
//     a yield, and release it.
//   - Checks: at most one holder at a time, every contender gets the key
//     every time, and the history.
//   - Needs: nothing.
//   - Fails: "up to N holders at once": the grant is not atomic, or a
//     release freed another token's lock. "lease lost inside a short
//     section": the store or its loss reports ended a lock that was still
//     held. Fewer sections than wanted: an Acquire failed.
//
// SharedClient:
//   - Does: 8 goroutines of one client each take one key 25 times;
//     package lock may queue them in the process and hand the lock from
//     one to the next (with backend.Transferer, ahead of the store).
//   - Checks: at most one holder among goroutines of one client; fences
//     strictly increasing in holding order.
//   - Needs: nothing.
//   - Fails: "fence F after G in holding order": a handover (a Transfer,
//     or a grant after a release) whose fence is not above the previous
//     holder's.
//
// FencesSequential:
//   - Does: one client takes and releases one key 1000 times.
//   - Checks: every fence is above 0 and above the one before.
//   - Needs: nothing.
//   - Fails: "acquisition N: fence F after G; want > 0 and strictly
//     increasing": the fence counter lives in the lock's record, deleted
//     at release, so it starts again.
//
// FencesContended:
//   - Does: 4 clients each take one key 250 times with Acquire.
//   - Checks: fences above 0 and strictly increasing in holding order,
//     and the history.
//   - Needs: nothing.
//   - Fails: "holder N got fence F after holder M got G": the counter is
//     read and advanced outside the grant's atomic step, or kept per node
//     or per connection.
//
// FenceAfterIdle:
//   - Does: takes and releases a key three times: after an idle gap of
//     twice the latest expiry of the short TTL, and after one of 2.5s
//     at least.
//   - Checks: fences keep increasing across idle gaps with no lock on
//     the key, also longer than a second.
//   - Needs: nothing.
//   - Fails: "fence F after an idle gap of D; the one before was G":
//     the counter expires with the lock (kept in a key or row with the
//     lock's TTL, or purged with it), or is forgotten after a second or
//     two idle (a cache, an eviction). The counter must outlive the lock.
//
// FenceAfterRestart:
//   - Does: takes and releases a key five times, restarts the store
//     keeping its data (Restart(ctx, true)), and takes the key again from
//     a new client.
//   - Checks: fences stay strictly increasing across a restart, when the
//     store declares Capabilities.DurableFence.
//   - Needs: Restarter; without DurableFence it only logs.
//   - Fails: "fence F after a restart that kept data; G before": the
//     counter is not written durably (kept in memory, or not yet flushed),
//     or the store should not declare DurableFence. "Acquire after
//     restart": the harness's Restart returned before the store was
//     ready.
//
// StaleOwner (subtests RenewAfterExpiry, RenewAfterSuccessor,
// ReleaseAfterSuccessor):
//   - Does: a client on a frozen clock, without renewals, takes a key for
//     the short TTL, so that package lock still believes its lease valid
//     and does send its requests; the suite waits out the latest expiry,
//     lets a successor take the key (except in RenewAfterExpiry), and the
//     stale owner renews or releases.
//   - Checks: the store itself refuses a stale owner: renew and release
//     are token-checked, a renew never re-acquires, and the successor's
//     lock is untouched (still held, renewable, and reported by Inspect
//     when the backend has one); fences increase; the history.
//   - Needs: nothing.
//   - Fails: "Renew by the stale owner: ...; want ErrLost from the
//     store's ErrNotHeld" or "TryAcquire after the stale renew ... (a
//     renew must never re-acquire an expired lock)": Renew writes the
//     lock whether or not the token holds it (an upsert), or finds an
//     expired record still there and does not compare its expiry time
//     (lazy expiry). "the successor must still hold the key": a renew or
//     release that checks the key but not the token.
//
// TokenExact:
//   - Does: holds a key, then renews and releases it with tokens that
//     differ from the holder's in the last character, in the first, or in
//     the second half; then renews with the holder's own.
//   - Checks: renew and release compare whole tokens.
//   - Needs: nothing.
//   - Fails: "Renew (or Release) with X, the holder being Y: ...; want
//     ErrNotHeld": the store compares part of the token (a prefix, a
//     truncated column, a hash of part of it). "the holder's Renew after
//     the others' attempts": a release with another token freed the lock.
//
// TokenShape:
//   - Does: takes and releases one key 200 times.
//   - Checks: every owner token is 32 lower-case hex digits (after the
//     prefix of a backend.TokenPrefixer, at most backend.MaxTokenPrefix
//     bytes), all different.
//   - Needs: nothing.
//   - Fails: a package lock promise; a backend fails it only through its
//     TokenPrefixer's prefix.
//
// KeyShapes:
//   - Does: sends keys that look alike to a store that escapes, cleans
//     paths, hashes, folds case or normalises Unicode: the longest key
//     (lock.MaxKeyLen bytes), multi-byte UTF-8 and a NUL byte (each beside
//     a key that differs only in its last character), "." and "..",
//     "%2E" and "%2E%2E", "a/../b" and "b", "./c" and "c", "//d" and "d",
//     "%2F" and "/", "e%2Ff" and "e/f", "g/" and "g", "h/./" and "h/",
//     a key with braces "a{b}" and the
//     hex SHA-1 of it, keys that differ only in case ("Case", "case"), and
//     keys that differ only in Unicode normalisation (é precomposed and
//     decomposed, the Angstrom sign and Å). All but ".", "..", "%2E",
//     "%2E%2E" and the SHA-1 sit under the case's own prefix: those four
//     are the same in every run, so runs against one store at once take
//     turns, each holding the key "conformance/KeyShapes/turn" while it
//     sends them. Each key, held by one client, is refused to
//     another, renews, and is reported by Inspect (when the backend has
//     one); then every two keys are held at once by two clients (in round
//     b, each takes the keys whose index has bit b clear or set).
//   - Checks: the store stores every key package lock accepts, each as a
//     lock of its own (backend doc, keys): it may encode a key, never
//     refuse or merge one.
//   - Needs: nothing.
//   - Fails: "TryAcquire of K, which nobody holds: ...; the store took it
//     for the lock of J": the store's escaping, path cleaning, hashing,
//     case folding (a case-insensitive collation) or normalisation merges
//     two keys. "TryAcquire of a N-byte key K: ...": the store refuses a
//     key (a column too short, a NUL byte refused, a path that is not
//     valid); encode it instead.
//
// # Time, expiry and loss
//
// ExpiryNotEarly:
//   - Does: one backend acquires a key (for the short TTL plus half the
//     granularity, which the store must round up), and another polls for
//     it every 2ms with fresh tokens until it gets it; then the same after
//     a renewal.
//   - Checks: the store never expires a lock earlier than its TTL, or the
//     Grant.TTL it reported, after it received the acquire or renew
//     (measured here from the send, which comes before).
//   - Needs: nothing.
//   - Fails: "after an acquire (or a renewal) ..., another owner took the
//     key D after the request was sent: E early": the TTL is rounded down
//     (to whole seconds, say), the expiry is counted from a moment before
//     the store received the request (a time the client computed, a clock
//     that differs between nodes), a renewal does not set the expiry to
//     ttl from now, or Grant.TTL is longer than what the store enforces.
//     "key never became free": the store holds locks past its declared
//     latest expiry (ExpiryFactor, ExpirySlack too small). "Acquire while
//     waiting for expiry": an error other than ErrLocked or ErrContended
//     while the key is held.
//
// ReleaseAfterExpiry:
//   - Does: holds a key for the short TTL, waits out its latest expiry,
//     and releases it with its own token; then the same through package
//     lock.
//   - Checks: a release after expiry, with no successor, returns
//     ErrNotHeld from the store, and package lock reports the lease lost.
//   - Needs: nothing.
//   - Fails: "the store's Release of its own expired lock: <nil>; want
//     ErrNotHeld": the release deletes an expired record that is still
//     there (lazy expiry) without comparing its expiry time.
//
// Takeover:
//   - Does: a holder takes a key for the short TTL and vanishes (no
//     renewals, no release); another client waits with Acquire.
//   - Checks: the waiter gets the key not before the TTL, and within the
//     latest expiry plus the slack.
//   - Needs: nothing.
//   - Fails: "taken over before expiry": the store expires early (see
//     ExpiryNotEarly). "want within ... (declared latest expiry ...)": the
//     store expires late for what it declares, or, on a backend.Notifier,
//     its ErrLocked reports a remaining TTL (backend.Locked) longer than
//     the real one, which the waiter sleeps out.
//
// SeveralTTLs:
//   - Does: one client, without renewals, holds three keys with TTLs of
//     8, 2 and 1 times the short TTL, taken longest first.
//   - Checks: each lease ends as lost (ErrLost) at its own deadline, within
//     the slack, the short one not held up by the longer ones.
//   - Needs: nothing.
//   - Fails: a package lock promise (its scheduler); a store rarely fails
//     it.
//
// DeadlineFromSend:
//   - Does: with the replies to one backend held back 100ms, acquires a
//     key for max(5 x short, 2s) and renews it; then renews with a
//     context that ends while the reply is held.
//   - Checks: a lease's deadline is at most the send time of its acquire
//     or renew plus its TTL minus the drift allowance that package lock
//     promises by default, 1% of the TTL plus 2ms (written out in the
//     suite, not taken from lock.DefaultDrift, so that a library build
//     that changed it does not agree with itself) (a
//     renewal counting the lease's TTL, not the client's default); a
//     renewal whose reply comes after its caller gave up does not move
//     the deadline.
//   - Needs: ReplyHolder.
//   - Fails: the deadline checks point at package lock. "Renew returned
//     nil while its reply was held past its context": the backend returned
//     nil instead of the context's error, or the harness's HoldReplies did
//     not hold the reply.
//
// DeadlineWithinStore:
//   - Does: acquires a key for the long TTL and renews it, reading the
//     store's expiry with Inspect after each; then two goroutines of the
//     same client queue for the key, the first with the long TTL, the
//     second with the short one and no renewals, and the lock passes to
//     each in turn.
//   - Checks: a lease's deadline is never later than the store's expiry
//     for its token, also after a handoff to a shorter TTL.
//   - Needs: backend.Inspector.
//   - Fails: "the lease is valid for D more, but the store holds the key
//     for ..., not for its token", or "the deadline is later than the
//     store's expiry": the store keeps the lock for less than the TTL
//     asked (rounded down, counted from an earlier moment), a renewal or a
//     transfer does not set the expiry to ttl from now, or Inspect's
//     Remaining is shorter than the store's real expiry. "a lease of TTL
//     short passed on from a holder of TTL long is valid for D": package
//     lock's handoff.
//
// Extend:
//   - Does: calls Lease.Extend with a zero, a negative and a too long TTL
//     (over lock.MaxTTL); then extends a short lease, not renewed, to the
//     long TTL, waits out the short TTL's latest expiry, and has another
//     client try the key.
//   - Checks: a bad TTL is refused (ErrInvalidTTL) and changes nothing. On
//     a store that declares Capabilities.FixedTTL another TTL is refused
//     and the same one renews. Elsewhere the longer TTL moves the deadline
//     and the store keeps the lock that long.
//   - Needs: nothing.
//   - Fails: "another client after the old TTL's latest expiry: ...; want
//     ErrLocked: the store must keep the lock for the new TTL": Renew
//     ignores its ttl and keeps the acquire's; declare FixedTTL, or set
//     the expiry to the new ttl.
//
// RenewAfterLoss:
//   - Does: a lease of the short TTL without renewals runs out; then it is
//     renewed and released, and another client acquires the key.
//   - Checks: Done closes at the deadline, not before; Renew then reports
//     ErrLost without asking the store; Release returns nil and Err keeps
//     the loss; another client gets the key within the latest expiry plus
//     the slack, with a higher fence.
//   - Needs: nothing.
//   - Fails: the first checks point at package lock. "Acquire by another
//     client after the loss: context deadline exceeded": the store holds
//     the lock past its declared latest expiry.
//
// StoreLosesLock:
//   - Does: a client holds a key, renewed automatically with a TTL of
//     max(3 x short, 1s); another backend releases it with the lease's
//     token.
//   - Checks: the next renewal reports the lease lost (ErrLost), never
//     takes the key again, and another client can have it.
//   - Needs: nothing.
//   - Fails: "the store lost the lock, and the lease is still valid after
//     its next renewal": Renew re-creates a missing lock (an upsert), or
//     answers an error other than ErrNotHeld, which package lock takes for
//     an unknown outcome. "Release from outside": the store lets only the
//     client that acquired release (a lock bound to a session or a
//     connection); release is by token.
//
// LockEvicted:
//   - Does: a lease renewed automatically (TTL max(3 x short, 1s)); the
//     harness's Evicter makes the store lose the lock with no release, so
//     that the lease's token stays alive; then another client takes the
//     key and holds it through two more of the lost lease's renewal times.
//   - Checks: a renewal that finds the key free ends the lease as lost
//     (within a third of its TTL plus the slack) and never takes the key
//     again; the other client's fence is greater, and its lock stays.
//     StoreLosesLock cannot see a watchdog that takes the key again: its
//     release kills the token, so the store refuses the new acquire.
//   - Needs: Evicter (what the store's own expiry or eviction does: a DEL
//     of the lock's keys, a delete of its row or entry).
//   - Fails: "the lease is still valid ... after its next renewal": Renew
//     re-creates a missing lock (an upsert), or package lock's watchdog
//     acquires again after ErrNotHeld (flaw watchdog-reacquires). "Renew
//     ... want it still held": something of the lost lease took the key
//     back later.
//
// LockFreedOutside:
//   - Does: a client takes a key, releases it and takes it again, and
//     takes a second key; another backend releases the second key with
//     its lease's token, as an operator deleting the key would.
//   - Checks: the lease of the second key ends as lost: at once (within
//     the slack, with automatic renewal off) on a backend.LossNotifier,
//     by the next renewal (a third of the long TTL) on others; the lease
//     of the first key is left alone and still renews.
//   - Needs: nothing; backend.LossNotifier makes the bound tighter.
//   - Fails: "was not told within D": Renew does not answer ErrNotHeld
//     for a lock freed under it (see StoreLosesLock), or the LossNotifier
//     does not report a deletion. "the lease of the key released and
//     taken again ended with the other key's loss": a loss report that
//     reaches the wrong lease (matched by client or key, not by the lock's
//     token), or a NotifyLoss whose stop function does not stop it.
//
// # Faults and out-of-order requests
//
// LostSignal:
//   - Does: a client holds a key for the short TTL, renewed
//     automatically, and is cut off from the store (Disconnecter: this
//     client only, while another client waits for the key; Pauser: the
//     whole store, and the other client acquires after Resume).
//   - Checks: the holder is told (Done, ErrLost) at or after its deadline
//     and before the store could expire the lock (the deadline plus the
//     drift allowance); the successor holds the key only after that, with
//     a higher fence.
//   - Needs: Disconnecter, or else Pauser.
//   - Fails: "successor held the key D before the holder was told": the
//     store expired the lock early (see ExpiryNotEarly). The timing of the
//     signal itself ("was not told within", "told ... after the store
//     could have expired the lock") is package lock's.
//
// LostSignalWhileRenewalsHang:
//   - Does: a client on a fake clock holds 70 leases renewed
//     automatically and one of the short TTL that is not; it is cut off,
//     and one step of the clock makes every renewal and that lease's
//     deadline fall due at once.
//   - Checks: that lease is told at once that it is lost, not after the
//     hanging renewals give up.
//   - Needs: Disconnecter.
//   - Fails: "its lost signal waits behind N renewals hanging on a
//     cut-off store": package lock's scheduler; a store rarely fails it.
//
// CancelWhileWaiting:
//   - Does: one client holds a key; another waits for it with Acquire,
//     once cancelled after 100ms and once with a 100ms deadline.
//   - Checks: each Acquire returns the context's error within a second;
//     the holder still renews; after its release the key is free at once.
//   - Needs: nothing.
//   - Fails: "Acquire returned D after its context was cancelled": a
//     backend call (Acquire, Watch, Queue.Acquire) that does not return
//     when its context ends. "holder Renew after the waiters gave up": a
//     waiter's undo freed the holder's lock (a release or queue leave that
//     is not token-checked). "TryAcquire after the release: ...; want
//     success (nothing left behind by cancelled waiters)": the store
//     handed the lock to a waiter that had left, or kept its place.
//
// CancelWhileStoreHangs:
//   - Does: cuts a client off the store (Disconnecter, or else Pauser),
//     calls Acquire with a 200ms deadline, heals the cut, closes the
//     client (which waits for its cleanup release), and takes the key from
//     another client.
//   - Checks: Acquire returns DeadlineExceeded within a second of its
//     deadline; an acquire that did reach the store is undone.
//   - Needs: Disconnecter, or else Pauser.
//   - Fails: "Acquire returned D after its deadline": the backend waits
//     for its client library's own timeout instead of its context.
//     "TryAcquire after the abandoned Acquire: ...; want success (nothing
//     left behind)": the held acquire reached the store after its cleanup
//     release and took the lock: the store does not refuse dead tokens
//     (backend doc, dead tokens).
//
// RetriedAcquire (despite its name, it also checks a release sent again):
//   - Does: on the backend directly, acquires a key with a fixed token,
//     sends the same acquire again after the short TTL, then releases
//     twice with that token.
//   - Checks: an acquire sent again with the same token (a client
//     library's retry after a lost reply) either returns ErrLocked or
//     grants again with the store's expiry counted from the second
//     request and a fence not below the first (the contract says the same
//     fence, or a greater one, as Redlock takes); a release sent again after one that took effect returns nil.
//   - Needs: backend.Inspector.
//   - Fails: "the same release sent again: ErrNotHeld...; want nil": the
//     store does not keep released tokens dead, or does not remember that
//     the token died holding the lock; it must answer nil again for
//     MinDeadTokenTTL (backend doc, dead tokens). "the same acquire sent
//     again was granted, but the store expires the lock in D": a
//     re-grant that keeps the first request's expiry (an idempotent
//     success that changes nothing). "want a grant or ErrLocked": another
//     error for a token that already holds the key.
//
// DeadTokens:
//   - Does: on the backend directly, acquires a key and releases it, then
//     sends an acquire with the released token; releases a token that
//     never held the key and sends an acquire with it; checks the key is
//     free after each. A store in the process (Capabilities.InProcess)
//     receives requests in order and is not asked.
//   - Checks: a released token stays dead: an acquire that arrives after
//     its own token's release (its caller gave up, and the undo overtook
//     it) is refused with an error wrapping ErrInvalid, whether the
//     release freed the lock or found nothing; a release sent again after
//     it freed the lock returns nil.
//   - Needs: nothing (backend.Inspector for the free-key checks).
//   - Fails: "an acquire that arrived after the release of its own token,
//     which had freed the lock: <nil>": the store keeps no tombstone of
//     released tokens (backend doc, dead tokens). "..., which had found it
//     not holding the lock: <nil>": a release that finds nothing does not
//     kill the token. Another error than ErrInvalid: the store knows the
//     token is dead but reports an unknown outcome.
//
// CancelUnderLoad (really about requests that arrive out of order):
//   - Does: 16 goroutines of one client, each on a key of its own, call
//     Acquire for a second with timeouts of 0 to 3ms, releasing what they
//     get; then the client is closed (waiting for its cleanup releases)
//     and Inspect reads every key. It runs in real time, also under
//     VirtualTime.
//   - Checks: acquires whose callers gave up leave no lock behind,
//     whatever order their requests and cleanup releases reach the store
//     in.
//   - Needs: backend.Inspector.
//   - Fails: "N of 16 keys still locked after M cancelled acquires and
//     Close": an acquire whose caller gave up reached the store after its
//     cleanup release (on another connection of a pool, or still running
//     on the server after the driver closed its connection) and took the
//     lock. The store does not refuse dead tokens, or does not serialise
//     the tombstone check and the grant per key (backend doc, dead
//     tokens). "Acquire: ...": an error other than the context's under
//     load (too many connections, an unmapped serialization failure).
//
// ReplyLost (subtests ReleaseReplyDropped, ReleaseReplyLate):
//   - Does: ReleaseReplyDropped holds the replies to a client, releases
//     its lease, waits until Inspect shows the key free, and drops the
//     replies (the client's connections are reset, and its library may
//     send the release again). In ReleaseReplyLate, while another
//     goroutine of the same client waits for the key, a lease of max(5 x
//     short, 1s) is released with a context that ends while the reply is
//     held; the reply is delivered, and another client acquires the key.
//   - Checks: a release whose reply is lost after it freed the key never
//     reports the lease lost; after a late release reply, the next
//     goroutine's lease is within the store's expiry and ends as lost
//     before another client holds the key.
//   - Needs: ReplyHolder and backend.Inspector.
//   - Fails: ReleaseReplyDropped, "it must not report the lease as lost":
//     the release sent again found the token released and answered
//     ErrNotHeld; a release of a token that died holding the lock answers
//     nil again (backend doc, dead tokens), and a connection error is
//     not ErrNotHeld. ReleaseReplyLate, "not for its token", "the deadline
//     is later than the store's expiry" or "another client holds the key
//     while the lease reports Err nil": the waiter's lock (transferred,
//     handed over by the store's queue, or acquired after the cleanup)
//     lasts less in the store than its grant said, or a late release freed
//     it (not token-checked).
//
// ReleaseSentAgain:
//   - Does: holds the replies to a client and releases its lease with a
//     context that ends after the store freed the key; the client is cut
//     off before package lock's copy of the release sent again can leave,
//     another client takes the key, and the cut heals, so that the copy
//     reaches the store after the new owner's acquire.
//   - Checks: the copy leaves the new owner's lock alone: a release is
//     token-checked, and a release sent again changes nothing.
//   - Needs: ReplyHolder, Disconnecter and backend.Inspector.
//   - Fails: "after the first owner's release was sent again, the store
//     has ...; want the new owner's lock": the release deletes by key, not
//     by token. "TryAcquire by another client once the store freed the
//     key": a tombstone that blocks the key rather than the released
//     token. "Release returned nil while its reply was held": the backend
//     returned nil instead of the context's error. "the release's deadline
//     passed before its client was cut off": the store or the machine
//     stalled; run again.
//
// GiveUpUnderLoad:
//   - Does: for 8 seconds, 4 clients wait on two busy keys with Acquire
//     and give up after 2 to 120ms, while a fifth client takes and frees
//     the busy keys, and each of the 4 takes, holds and releases a key of
//     its own that the others keep trying. With LinkDelayer, one link of
//     every client is 50ms slow; with Delayer only, all of client 0's.
//   - Checks: attempts that end on their way, and whose undo (a release, a
//     waiter leaving the queue) races the client's next requests, never
//     free a lock under its holder: the busy keys never have two holders,
//     and the own keys' history fits the lease-lock model.
//   - Needs: nothing; LinkDelayer or Delayer make requests overtake each
//     other.
//   - Fails: "the store freed a busy key under its holder", "up to N
//     holders of a busy key at once", or a history that is not
//     linearizable: a late undo of an earlier attempt freed a later lock,
//     or acted on a resource (a session, a lease) that the backend
//     meanwhile reused for another lock; or an acquire that arrived after
//     its undo took the lock (dead tokens). "no waiter gave up, or none
//     got a busy key: the case tested nothing": the load did not happen.
//
// # Queues and handover
//
// WakeOnRelease:
//   - Does: one client holds a key for the long TTL, another waits for it
//     with Acquire, and the holder releases it.
//   - Checks: the waiter takes the key within the slack of the release, not
//     when the holder's TTL runs out.
//   - Needs: backend.Notifier.
//   - Fails: "the waiter was not woken within D of the release": Watch
//     delivers no wake-up for a release. "took the key D after the
//     release": a slow wake-up.
//
// WatchBeforeRelease:
//   - Does: a waiter of another client waits for a key held with the long
//     TTL; the suite releases the key at the moment the waiter starts to
//     wait: just before its Watch is sent (a Notifier), or just after the
//     store queued it (a Queuer's refused Queue.Acquire).
//   - Checks: the waiter takes the key within the slack of the release,
//     not when the holder's TTL would have run out.
//   - Needs: backend.Notifier.
//   - Fails: "a release just before the watch began was missed": package
//     lock does not try again once a watch began (a Notifier reports only
//     what happens after Watch returns; flaw no-recheck-after-watch), or a
//     Queuer neither hands over to nor wakes a waiter it has just queued.
//
// WaiterTTLShorterThanWait:
//   - Does: a key held with the long TTL; two waiters of other clients,
//     each with the short TTL, wait longer than the store's latest expiry
//     of that TTL; then the holder releases, and each waiter in turn takes
//     the key and releases it.
//   - Checks: each waiter takes the key within the slack of the release
//     before it, and holds it (another client is refused).
//   - Needs: backend.Notifier.
//   - Fails: "got the key D after its release": what the store keeps of
//     a waiter (a queue record on a lease or a session of the waiter's
//     TTL, a watch) expired while it waited, and nothing renews it (flaw
//     watch-expires); the waiter then learns of the release only when it
//     tries again, after the holder's TTL.
//
// CancelledWaiterRetakes:
//   - Does: a waiter is cancelled while it waits for a key held by another
//     client; its client at once waits for the key again; the holder
//     releases.
//   - Checks: the new wait takes the key within the slack, and the store
//     holds it for the new wait until near its deadline (another client
//     is refused), while the cancelled wait's cleanup runs in the
//     background.
//   - Needs: backend.Notifier.
//   - Fails: "did not get the key within D": the cancelled wait's queue
//     record or watch stays at the head of the queue and takes the
//     release's wake-up (flaw closed-watch-stays). "another client took
//     the key": the cleanup of the cancelled wait freed a lock by key or
//     by session, not by its own token.
//
// HandoverTTLs:
//   - Does: a holder with a TTL of 2 x short releases with a quarter of it
//     left to a goroutine of its own client waiting with a longer TTL
//     (handed over by the client's Transfer, or acquired); that one
//     releases, close to its deadline, to a waiter of another client with
//     a longer TTL still (a Queuer's handover, or an acquire). Automatic
//     renewal is off.
//   - Checks: each new owner's lease has its own TTL, and the store still
//     holds the lock for it the slack before its deadline (another client
//     is refused); fences increase.
//   - Needs: nothing.
//   - Fails: "another client took the key ... before the lease's
//     deadline": a Transfer, or a Queuer's handover, that keeps the
//     previous holder's expiry or TTL instead of the new owner's (flaw
//     transfer-keeps-expiry-networked).
//
// FIFOOrder:
//   - Does: 5 clients wait for a held key in turn, each starting once the
//     store refused the one before; the holder releases; a newcomer keeps
//     trying the key meanwhile, also right after every release.
//   - Checks: on a store that declares Capabilities.FIFO, waiters are
//     served in the order the store first saw them wait (an acquire of
//     theirs found the key held), and the newcomer never goes first.
//   - Needs: Capabilities.FIFO (without it, it only logs).
//   - Fails: "a newcomer took the key N times while waiters that came
//     before it still waited": a release frees the key and wakes the head
//     waiter, and anyone may take it meanwhile; hand it to the head
//     instead. "waiters served in the order ...": a waiter loses its place
//     when it tries again.
//
// HotKeyRequests:
//   - Does: 8 clients contend for one key for 2 seconds, holding it 1ms per
//     section, counting the requests with the harness's RequestCounter.
//   - Checks: on a store that declares FIFO, at most 4 requests per
//     section, and sections never overlap.
//   - Needs: Capabilities.FIFO and RequestCounter (without them, it only
//     logs).
//   - Fails: "R requests per section ...; a store that queues its waiters
//     should need at most 4": a release wakes every waiter, or waiters
//     poll. "N sections in 2s; want at least 10": handovers are slow.
//
// CancelInQueue:
//   - Does: a goroutine of a client holds a key; two more of the same
//     client wait for it in package lock's per-client queue; the first
//     waiter is cancelled, and the holder releases.
//   - Checks: the cancelled Acquire returns context.Canceled and gives up
//     its place: the one behind gets the key within the slack.
//   - Needs: nothing (on an InProcess store there is no per-client queue).
//   - Fails: a package lock promise (its queue); a store rarely fails it.
//
// Transfer (only on a backend.Transferer):
//   - Does: on the backend directly, with tokens of the shape package
//     lock makes (32 hex digits, named by letters in the messages),
//     transfers a key from
//     token to token: from a token that does not hold it, plainly and with
//     reserved fences, sent again, while an owner of another backend
//     waits, and sent again after the new owner's lock expired.
//   - Checks: the backend.Transferer contract: ErrNotHeld and no change
//     for a token that does not hold the key; new fences above the old,
//     reserved fences exact, and Next above them; the previous owner can
//     no longer renew; a transfer sent again reports the one that took
//     effect with Next 0; ErrTransferRefused for a plain transfer while
//     another owner waits, but not with a reserved fence; the waiter's
//     fence above all; the new owner's TTL counted from the transfer; and
//     after the new owner's lock ended, a transfer sent again fails with
//     neither ErrNotHeld nor ErrTransferRefused (the contract says
//     ErrHandedOnBefore), while the old owner's release returns nil.
//   - Needs: backend.Transferer; Inspect (when there) checks that a
//     reservation does not change the holder's fence.
//   - Fails: each message names the step. Usual causes: the store does not
//     remember a transfer that took effect, so one sent again fails; it
//     does not record an owner that was refused (ErrLocked) as waiting; a
//     reserved fence is not taken into the next grant's count; the
//     transfer keeps the old owner's expiry.
//
// HandoverFails (only on a backend.Transferer):
//   - Does: goroutines of one client hand a key over ahead of the store
//     (A to B, then B to C); the reply to the transfer to C is dropped, so
//     its outcome is unknown. If the transfer lands after all (C still
//     renews), it tries again on a fresh key, up to 3 times.
//   - Checks: C is told at once that it lost the lock (ErrLost), and
//     package lock's cleanup frees the key: another client takes it well
//     before the TTL, with a higher fence.
//   - Needs: backend.Transferer and ReplyHolder; on an InProcess store it
//     only logs.
//   - Fails: "neither lost nor renewable": package lock. "another client
//     after a lost handover: ...; want the key freed": the transfer,
//     sent again by the client library after the reset, reached the
//     store after the cleanup release of C's token and gave C's dead token
//     the lock: the store must refuse a Transfer to a dead token (backend
//     doc, dead tokens).
//
// # Inspection and resources
//
// HandoverLostOnTheWay (only on a backend.Transferer):
//   - Does: three goroutines of one client pass a key on, so that package
//     lock hands it to the third ahead of the store (see HandoverFails);
//     the second hands it on with half its TTL left, and the suite holds
//     that transfer until the second's lock has expired in the store;
//     another client then takes the key, and the transfer goes on.
//   - Checks: the lease handed ahead of the store is valid no later than
//     the previous holder's deadline, and ends lost by then (plus the
//     slack); the other client's lock survives the transfer and the
//     cleanup after it, with a greater fence.
//   - Needs: backend.Transferer; on an InProcess store it checks nothing.
//   - Fails: "valid until D after the previous holder's deadline":
//     package lock gives the next holder its own TTL from the handover
//     (flaw handed-ignores-prev-networked). "the other client's lease
//     after the held transfer went on": a Transfer that does not check
//     that from still holds the key (see Transfer).
//
// InspectAfterExpiry:
//   - Does: takes a key, releases it, takes it again with a new token for
//     the short TTL, and inspects it; then waits out the latest expiry and
//     inspects it again.
//   - Checks: Inspect reports the current holder (its token, when the
//     store reveals it, its fence, a remaining TTL within the latest
//     expiry), not an earlier one, and an expired lock as free.
//   - Needs: backend.Inspector.
//   - Fails: "Inspect of a held lock: ...": Inspect reads a stale copy,
//     reports the fence counter instead of the holder's fence, or a
//     Remaining longer than the latest expiry (a wrong unit, say).
//     "Inspect after the lock expired: ...; want free": an expired record
//     that is still there (lazy expiry) reported as held.
//
// HolderLabel:
//   - Does: takes keys with lock.WithHolder descriptions (per client, per
//     acquisition, the default), lets a waiter take a key at its release,
//     lets one lock expire and renews another past its first TTL, reading
//     each with Client.Inspect from another client; then tries bad
//     descriptions.
//   - Checks: Client.Inspect reports the holder as the store sees it (its
//     fence, a remaining TTL within the latest expiry) and, on a backend
//     that declares Capabilities.Labels, its own description: never the
//     previous holder's after a release, an expiry or a handover, and
//     kept by renewals. Without Labels, no description. A released key
//     reads as the zero Holder; a bad description is refused before
//     anything is sent.
//   - Needs: backend.Inspector (without it, Client.Inspect returns
//     errors.ErrUnsupported and the case skips).
//   - Fails: "after a holder with one expired: ... want ... no
//     description": the label outlives its lock (kept in a record that
//     the next grant, an expiry or a handover does not clear). "Inspect of
//     a lock renewed past its first TTL": a renewal drops the label.
//     "Inspect after the release: ...; want the zero Holder": a released
//     lock reported as held.
//
// ManyKeys:
//   - Does: one client takes 10,000 keys (8 at a time) and releases them,
//     checks that every key is free (with Inspect, or else TryAcquire),
//     and closes. It may take up to 6 minutes.
//   - Checks: released locks leave nothing held, and a closed client
//     leaves no goroutines behind of any package outside the standard
//     library (this module's, the backend's, its client library's).
//   - Needs: nothing (Inspect when the backend has one).
//   - Fails: "key N: still held after release" or "not free after
//     release": a release that does not free the key at once. "G
//     goroutines of the lock or its backend left after ... closing the
//     client", with their stacks: goroutines per lock (a watch, a
//     keep-alive) not stopped at release, or a Close that does not stop
//     the backend's or its client library's.
//
// IdleResourcesExpire:
//   - Does: a burst of acquires of 16 keys at once fills the backend's
//     pools (sessions, leases, connections it keeps idle for its next
//     locks); after waiting out the latest expiry of the short TTL, the
//     client takes 16 keys again, fresh ones and the burst's, holding each
//     until all are taken, while another client tries each.
//   - Checks: every grant after the idle time is real: a fence above 0,
//     and another client's TryAcquire refused while it is held; the
//     history. The backend must bound the sessions or leases it keeps
//     idle as it bounds the locks they carry.
//   - Needs: nothing.
//   - Fails: "another client's TryAcquire of a ... key held by a lease of
//     fence F: ...; want ErrLocked (two holders)" or "Acquire of a ...
//     key: ...": the backend reused a session or lease that the store had
//     expired while it sat in the pool, and granted a lock on it that the
//     store does not hold (or failed). A release that reports ErrLost is
//     accepted: the short TTL can run out under load.
//
// # Writing a harness
//
// NewBackend returns a client with its own connections, as a separate
// process would have; the suite closes every backend it gets, so a harness
// frees per-backend resources (a proxy, a client it built) by returning a
// wrapper whose Close closes them too. Such a wrapper must keep the
// backend's optional interfaces visible (embed the concrete backend type,
// not the backend.Backend interface), or the cases that need them skip.
// The harness's Capabilities must equal the backend's own, when it has a
// backend.Describer: Run checks it. A store expires locks by its own clock;
// ExpiryFactor and ExpirySlack bound how late, from when it received the
// acquire or renew.
//
// The hooks act on the network between the client and the store: run each
// backend's connections through a conformance/faultproxy.Proxy and embed a
// faultproxy.Hooks in the harness: it turns each backend's proxies into
// Disconnect, Reconnect, the ReplyHolder, Delayer and ConnResetter hooks (see
// memory/netstore/conformance_test.go in this module, a whole harness in
// under 100 lines). A client with several links to the store (the
// endpoints of several members, or two proxies to one) registers them all:
// Hooks then also gives LinkDelayer, which slows one of them, so that
// requests overtake each other. Disconnect holds every byte in both
// directions, on the connections open now and on new ones, without closing
// anything, until Reconnect delivers what was held (Proxy.Cut and
// Proxy.Heal). The suite uses Pauser only where the harness has no
// Disconnecter, and calls Restart with keepData true only.
//
// A harness whose backends need client options (a fence epoch, for a
// backend of package migrate) gives them through ClientOptioner.
//
// # Randomized fault runs
//
// RunFaults makes seeded runs in which contenders take and release locks
// while faults drawn from every hook the harness offers (Pauser, Restarter,
// Disconnecter, ReplyHolder, Delayer, ConnResetter; faultproxy.Hooks gives
// the last four) come every 1 to 5 seconds, and then checks that validity
// intervals never overlapped, that a fenced resource never refused a valid
// lease, that lost signals fired by the deadline, and the history; see
// FaultOption.
//
// # Virtual time
//
// A store in the test process can run the suite and the fault runs under
// testing/synctest, where waiting out a TTL costs no wall time: Run with
// VirtualTime, RunFaults with FaultVirtualTime. Each case, each subtest of
// StaleOwner and ReplyLost, and each fault run then runs in a bubble of its
// own, with a harness that newHarness makes in that bubble. The cases,
// their checks and their bounds are the same; a bound measured on the
// clock holds on an exact one. Everything the harness's clients block on
// must be durable in a bubble (channels, timers, sync.Cond; not a TCP
// socket, whose reads would stop the clock): the memory store, or a
// networked store over in-memory connections (net.Pipe) through
// faultproxy.StartOn, with Proxy.Latency so that a round trip takes time
// (memory/netstore/conformance_test.go). CancelUnderLoad keeps to real
// time: its load spins for a second of the clock without blocking. Stores
// in other processes (SIGSTOP, restarts, helper processes) run in real
// time.
package conformance
