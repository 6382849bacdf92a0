// Package fence makes a protected resource refuse writes from a lock holder
// that is no longer the newest: the fencing-token check, written once, for
// resources in memory (Guard) and in SQL databases (Table).
//
// # Why fencing
//
// A lease of package lock is valid until its deadline, and its holder
// learns that the deadline passed only when it runs. A pause longer than
// the TTL (garbage collection, swapping, a stopped VM) lets the lock expire
// and go to another process while the first still believes it holds it;
// when the first resumes, it writes, and two critical sections overlap.
// Every lease carries a fencing token, Lease.Fence: > 0 and strictly
// increasing over successive holders of a key. A resource that remembers
// the newest fence it accepted and refuses older ones rejects the late
// write.
//
// # The rule
//
// Per resource name, a write is accepted when its fence is higher than the
// newest fence accepted for that resource, or equal to it and offered by
// the same holder (one lease writing twice); the fence then becomes the
// newest. Otherwise it is refused with ErrStale. Every helper takes:
//
//   - resource: the name of what is protected, 1 to MaxNameLen bytes of
//     UTF-8. Guard each resource with the fences of one lock key on one
//     backend: fences of different keys (on Redis) or of different backends
//     are not comparable, unless the Clients set fence epochs
//     (lock.WithFenceEpoch) while a deployment moves from one store to
//     another: every fence of a later epoch is then above every fence of an
//     earlier one.
//   - fence: Lease.Fence, 1 or more. Store it whole, in 64 bits: an
//     unsigned integer, or a signed one (a BIGINT column, as Table keeps),
//     which holds every fence under an epoch (below 2^63); never cut it to
//     32 bits or to a float, which would merge or reorder fences.
//   - holder: who offers the fence, 1 to MaxNameLen bytes. Pass
//     Lease.Token, which is unique to each acquisition, or an id of your
//     own that no other lease uses. It tells a lease writing twice from
//     another lease with the same fence (a store that lost its counters
//     after a restart hands fences out again).
//
// Guard.DoLease and Table.ApplyLease take a *lock.Lease (any Holder)
// instead of the fence and the holder, so that the two cannot be swapped.
//
// # What the helpers guarantee
//
//   - Guard.Do runs the write only when the fence is accepted, with the
//     resource locked from the check until the write returns: writes to a
//     resource run one at a time, in fence order, and none runs after a
//     newer holder's fence was accepted.
//   - Table.Apply accepts the fence inside the caller's database
//     transaction with one upsert, whose row lock (PostgreSQL) or write
//     lock (SQLite) lasts until the transaction ends: no newer fence can be
//     accepted for the resource meanwhile, so fenced writes commit in fence
//     order and a write guarded by a stale fence never commits after a
//     newer one. On ErrStale, roll back. Table.Apply's documentation says
//     why, and what each isolation level does.
//
// Both refuse bad input (fence 0, an empty resource or holder) with an
// error wrapping ErrInvalid, changing nothing.
//
// # Errors
//
// Check errors with errors.Is against ErrStale and ErrInvalid. Messages
// start with "fence:"; a stale fence's says which fence was offered and
// which was already accepted, never the holders (a lease token lets its
// owner renew and release the lock). A database's error is reachable with
// errors.As.
package fence
