// Package migrate moves a running deployment's locks from one store to
// another (Redis to etcd, say, or between any two backends) with no
// downtime, and with fences that never go backwards.
//
// # The phases
//
// A move goes through four phases, each set by configuration alone: a
// Config in code, or a URL such as
//
//	migrate://?from=redis://r1:6379&to=etcd://e1:2379&phase=2
//
// (see SchemeName). Roll each phase out to every instance before the next
// one starts:
//
//  1. from only: locks on From, fences From's under the epoch (Config.Epoch,
//     0 for a first move). The same as the plain From URL with
//     lock.WithFenceEpoch(epoch).
//  2. both stores, From's fences: each lock is taken on From, then on To,
//     with one token, and its fence is From's, under the epoch.
//  3. both stores, To's fences under epoch+1.
//  4. to only: locks on To, fences To's under epoch+1. The same as the
//     plain To URL with lock.WithFenceEpoch(epoch+1), which the deployment
//     keeps from then on.
//
// # Why the phases keep the promise
//
// At most one valid lease per key. A lease of a phase is held, for as long
// as it is valid, on every store its phase uses: in phases 2 and 3 the
// lease's TTL is the shorter of the two stores' grants, and package lock
// counts its deadline from before the request to From, the first store
// asked, so both stores still hold the lock at the deadline. Any two
// adjacent phases share a store (1 and 2 share From, 2 and 3 both, 3 and 4
// share To), and a store grants a key to one token at a time; so two valid
// leases of instances in the same or adjacent phases would be held on one
// store at once, which it does not allow. Instances two phases apart share
// no store, which is why a phase must be everywhere before the next
// starts (Check says when no holder of a phase that the next one drops is
// left).
//
// No false "held". A lock of phases 2 and 3 is held on one store for a
// moment while it is taken or released (a release frees both stores at
// once, so that a reply lost on one does not keep the other held). An
// acquire that From refuses while To does not hold the key answers
// ErrContended, as after a Redlock split vote, not ErrLocked: no lease may
// hold the key (both.halfDone). A phase 1 holder is answered so too.
//
// No deadlock. Phases 2 and 3 take From first, then To, always; and they
// never wait while they hold a store: when To refuses, the From grant is
// undone before Acquire returns, and package lock waits with nothing held.
// Phases 1 and 4 take one store only.
//
// Faults. A reply lost after a store acted, or a request whose context
// ended while it was out, leaves the outcome unknown: Acquire returns the
// store's error as it is (never ErrLocked), and package lock's cleanup
// releases the token on both stores; a token is used for one attempt, so
// that release frees only what this attempt may hold. When To refuses and
// the undo on From fails, Acquire says the outcome is unknown, for the
// same cleanup. A release that one store answered and the other did not is
// sent again to the other only. A process stopped past its TTL finds its
// lease expired on both stores, and a resource refuses its late writes by
// the fence, as on one store. A store that loses its data (a restart
// without persistence) loses exclusion between instances that share only
// that store, as it would without a move: run each store in its safe
// configuration.
//
// Fences only grow. Phases 1 and 2 take fences from From's counters, under
// the epoch; phases 3 and 4 from To's, under epoch+1. A fence under an
// epoch is epoch<<lock.FenceEpochShift | the store's fence, so every fence
// of phases 3 and 4 is above every fence of phases 1 and 2, whatever the
// two stores' own values (a Redis key's counter may be at 10^8 and etcd's
// revision at 10^3). While instances move from phase 2 to phase 3, a
// phase 2 lease that follows a phase 3 lease on a key carries a fence of
// the lower epoch: a fenced resource refuses its writes, as it refuses a
// stale holder's. That is safe, and the refused instance succeeds once it
// runs phase 3; roll phase 3 out promptly.
//
// # What each phase costs
//
// Phases 2 and 3 send each acquire to From and then To, and each renewal
// and release to both at once: an acquire costs both stores' round trips
// in turn, a release the longer of the two. Waiting is by the stores'
// notifications (a wake-up from either store), with no queue of its own,
// so phases 2 and 3 do not keep arrival order. Handover between waiters
// of one client (backend.Transferer) and the stores' own queues are not
// used in those phases.
//
// # Tools
//
// lockctl status shows each store's holder in phases 2 and 3, and lockctl
// migrate check says whether keys are clear to move to the next phase.
package migrate
