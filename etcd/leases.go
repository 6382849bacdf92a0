package etcd

import (
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// leases is a backend's record of the etcd leases it uses: the lease of each
// lock it holds, and idle leases that it reuses for its next locks, so that
// an acquisition costs one Raft write (the transaction) instead of two
// (a grant, then the transaction).
//
// A lease carries at most one lock at a time, so that renewing one lock
// never extends another. An idle lease holds nothing: it joins the pool
// only when the store confirmed that the transaction which would attach a
// key to it did not (the key was held, or the token dead), or that the key
// it carried was deleted by this backend's release.
//
// Which requests can still act on a lease when it is reused. A lease
// joins the pool only when every request this backend ever sent on it
// has a known outcome and none is in flight, so that nothing but the
// next lock's own requests can touch it:
//   - A transaction of unknown outcome (a lost reply, a context that ended
//     while it was on its way) may attach a key to the lease later; and
//     the undo of such an attempt revokes the lease (a waiter's place
//     revokes it in Close, in the background, and the cleanup release
//     revokes it when it finds the key free). A revoke may arrive after
//     the release that deleted the key: were the lease reused, it would
//     delete the next lock on it while its holder's deadline is far away.
//     So a lease that carried any request of unknown outcome is never
//     reused, whatever the release then finds (heldLease.unknown); it is
//     revoked, or expires.
//   - A keep-alive of unknown outcome may still arrive and extend the
//     next lock past the expiry this backend declares (heldLease.tainted).
//   - A renewal in flight could extend the next lock (heldLease.renewing).
//
// A revoke is sent only for a lease that is not in the pool and never
// will be: so a revoke in flight never targets a lease that can carry
// another lock.
type leases struct {
	mu   sync.Mutex
	pool map[int64][]idleLease // by TTL in seconds, freshest last
	held map[heldKey]*heldLease
	// prunedAt is the size of held after its last pruning; held is pruned
	// again when it has doubled.
	prunedAt int
}

// idleLeasesPerTTL bounds the pool of each TTL. A lease beyond it is left to
// expire: it holds nothing.
const idleLeasesPerTTL = 64

type idleLease struct {
	id clientv3.LeaseID
	// refreshed is when the request that last granted or refreshed the
	// lease was sent; the store keeps it at least its TTL from then.
	refreshed time.Time
}

type heldKey struct{ lockKey, token string }

// heldLease is the lease of one acquisition: attached to the lock key, or
// perhaps attached (unknown).
type heldLease struct {
	id        clientv3.LeaseID
	secs      int64
	refreshed time.Time
	unknown   bool // the acquire transaction's outcome is unknown
	renewing  int  // renewals in flight
	// tainted: a refresh of unknown outcome may still arrive; were the
	// lease reused, it would extend the next lock.
	tainted bool
	// session: the lease is a session's, which carries other locks too
	// (see sessions.go): it never joins the pool and is never revoked.
	session *session
	// labelled: the acquire put a holder label beside the lock key (see
	// label.go).
	labelled bool
}

func newLeases() *leases {
	return &leases{pool: map[int64][]idleLease{}, held: map[heldKey]*heldLease{}}
}

// take returns an idle lease of secs seconds that the store should still
// have, with the send time of its latest confirmed refresh, or NoLease.
// The caller refreshes it before it carries a lock.
func (l *leases) take(secs int64) (clientv3.LeaseID, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pool[secs]
	ttl := time.Duration(secs) * time.Second
	margin := max(200*time.Millisecond, ttl/10) // for the refresh to arrive
	for len(p) > 0 {
		last := p[len(p)-1]
		p = p[:len(p)-1]
		if time.Since(last.refreshed) < ttl-margin {
			l.pool[secs] = p
			return last.id, last.refreshed
		}
		// The freshest has (nearly) expired: so have all the others.
		p = p[:0]
	}
	l.pool[secs] = p
	return clientv3.NoLease, time.Time{}
}

// idle returns a lease that holds nothing to the pool.
func (l *leases) idle(id clientv3.LeaseID, secs int64, refreshed time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.pool[secs]; len(p) < idleLeasesPerTTL {
		l.pool[secs] = append(p, idleLease{id, refreshed})
	}
}

// attach records lease id as the lease of token's lock on lockKey; unknown
// says whether the acquire's outcome is unknown, tainted whether a refresh
// of the lease has an unknown outcome (the lease is then never reused).
func (l *leases) attach(lockKey, token string, id clientv3.LeaseID, secs int64, refreshed time.Time, unknown, tainted bool) {
	l.attachTo(lockKey, token, &heldLease{id: id, secs: secs, refreshed: refreshed, unknown: unknown, tainted: tainted})
}

// attachTo records h as the lease of token's lock on lockKey.
func (l *leases) attachTo(lockKey, token string, h *heldLease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held[heldKey{lockKey, token}] = h
	if n := len(l.held); n >= 1024 && n >= 2*l.prunedAt {
		l.pruneLocked()
	}
}

// forgetAfter is how long after its last refresh a lease is forgotten
// when no release came for it: long after any store expired it.
const forgetAfter = time.Minute

// pruneLocked forgets the leases of locks that expired without a release
// (their holders lost them). l.mu must be held.
func (l *leases) pruneLocked() {
	for k, h := range l.held {
		if h.renewing == 0 && time.Since(h.refreshed) > time.Duration(h.secs)*time.Second*2+forgetAfter {
			delete(l.held, k)
		}
	}
	l.prunedAt = len(l.held)
}

// acquired reports whether this backend acquired token's lock on lockKey
// with a known outcome and has not released it.
func (l *leases) acquired(lockKey, token string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.held[heldKey{lockKey, token}]
	return h != nil && !h.unknown
}

// doubtfulSession returns the session's lease that an acquire of unknown
// outcome for token's lock on lockKey may still attach the key to, or
// NoLease.
func (l *leases) doubtfulSession(lockKey, token string) clientv3.LeaseID {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.held[heldKey{lockKey, token}]; h != nil && h.unknown && h.session != nil {
		return h.id
	}
	return clientv3.NoLease
}

// sessionOf returns the session whose lease carries token's lock on
// lockKey, or nil.
func (l *leases) sessionOf(lockKey, token string) *session {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.held[heldKey{lockKey, token}]; h != nil {
		return h.session
	}
	return nil
}

// renewing returns the lease of token's lock on lockKey, marked as being
// renewed, or nil when this backend did not acquire it.
func (l *leases) renewing(lockKey, token string) *heldLease {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.held[heldKey{lockKey, token}]
	if h != nil {
		h.renewing++
	}
	return h
}

// renewed ends a renewal of h; sent is when it was sent, if it succeeded;
// unknown says its refresh's outcome is unknown.
func (l *leases) renewed(h *heldLease, sent time.Time, ok, unknown bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h.renewing--
	if ok {
		h.refreshed = sent
	}
	if unknown {
		h.tainted = true
	}
}

// release forgets the lease of token's lock on lockKey and returns it, with
// whether it may be reused (no request of unknown outcome ever used it, and
// none is in flight: see leases): the caller reuses it (idle) when it also
// knows that the lease holds nothing now, and revokes it otherwise.
func (l *leases) release(lockKey, token string) (h *heldLease, reusable bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := heldKey{lockKey, token}
	h = l.held[k]
	if h == nil {
		return nil, false
	}
	delete(l.held, k)
	return h, h.renewing == 0 && !h.tainted && !h.unknown && h.session == nil
}
