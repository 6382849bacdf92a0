// Package lock provides distributed locks with one portable API over several
// stores: Redis, etcd, Consul and an in-process memory store.
//
// A Client wraps one backend. TryAcquire makes one attempt and fails fast with
// ErrLocked; Acquire waits until the lock is held or its context ends (or
// WithWait's bound); Do and TryDo run a function under the lock with a
// context that ends the moment the lock is lost. A Lease is one held lock:
// Renew and Extend (with a new TTL) renew it, Release frees it, Done and Err
// report its loss. Client.Inspect says who holds a key: the description
// its holder stored with the lock (WithHolder; host, pid and program by
// default), its fence and its time left. WithObserver and WithLogger report
// what a Client does, for metrics, traces and logs (module lockotel for
// OpenTelemetry).
//
//	locks, err := lock.New(memory.New())
//	...
//	err = locks.Do(ctx, "invoice:7", func(ctx context.Context, l *lock.Lease) error {
//		return chargeOnce(ctx, l.Fence())
//	})
//
// # Promises
//
//   - Mutual exclusion by lease: at most one Lease for a key is valid at any
//     moment, given client and store clocks whose rates differ by less than
//     the drift allowance.
//   - Every acquisition gets a fresh owner token of 128 random bits; the store
//     checks it on renew and release, so a stale holder can never extend or
//     delete its successor's lock.
//   - Lease.Fence is > 0 and strictly increasing over successive holders of a
//     key. A lease alone cannot guarantee exclusion when a holder pauses (GC,
//     swap, a stopped VM) for longer than its TTL: pass the fence to the
//     protected resource and have it reject fences lower than the highest it
//     has seen.
//   - Validity is a client-side deadline measured on the monotonic clock from
//     when the acquire or renew request was sent: sent + TTL - drift. At the
//     deadline the lease is lost even if the store cannot be reached: Done is
//     closed and Err reports ErrLost, before the store can grant the key to
//     anyone else.
//   - The watchdog renews every lease about every TTL/3 unless turned off
//     (WithAutoRenew), retries failed renewals while the lease is valid,
//     never re-acquires a lost lock, and can be capped (WithMaxHold).
//   - Acquire waits on the backend's wake-up when it offers one (a release
//     notification), otherwise backs off with jitter; it never sleeps longer
//     than the holder's remaining TTL where the store reports it. When its
//     context ends it returns the context's error and leaves nothing behind.
//   - Bad input (empty or oversized key, TTL <= 0, below the backend's
//     minimum or above its maximum, out-of-range options, a closed or nil
//     Client) returns an error wrapping ErrInvalid or ErrClosed and changes
//     nothing.
//   - Every backend of this module has a maximum TTL, DefaultMaxTTL (1m)
//     unless its WithMaxTTL option or URL parameter maxttl says otherwise:
//     it bounds how long a holder that crashed, or a waiter killed while
//     queued, blocks a key. A waiter is never handed a lock for longer than
//     it asked for.
//
// # URLs
//
// Open builds a Client from a URL whose scheme a backend package registered
// in its init function; import the backend for its side effect:
//
//	import _ "github.com/distlock/lock/memory"
//	locks, err := lock.Open(ctx, "mem://orders?ttl=30s")
//
// Every scheme accepts these query parameters: ttl, drift, maxhold (Go
// durations) and autorenew (true or false).
//
// # Errors
//
// Check errors with errors.Is against the sentinels (ErrLocked, ErrNotHeld,
// ErrLost, ErrReleased, ErrClosed, ErrInvalid and its kinds). Messages start
// with "lock:" and name the operation and key. The backend's own error is
// reachable with errors.As.
package lock
