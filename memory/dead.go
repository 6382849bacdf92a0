package memory

import "time"

// DeadTokenTTL is how long a store serving clients over a network keeps a
// released token dead (see KeepDeadTokens): far longer than a request
// waits in a pipeline or a proxy in this module's tests, as with the Redis
// backend's tombstones.
const DeadTokenTTL = 15 * time.Second

// KeepDeadTokens makes every token released on the store from now on dead
// for d after its release: an Acquire with it fails with an error wrapping
// backend.ErrInvalid, a Transfer to it too, and a Release of it answers as
// the first release did (nil when that one freed the lock). A release that
// finds the token not holding the key kills it as well.
//
// Why: over a network, requests sent on different connections can reach the
// store in another order than they were sent. Package lock undoes an
// acquire or a transfer of unknown outcome with a Release of its token; if
// that release overtakes the request it undoes, the request would otherwise
// take the lock for a whole TTL with nobody to release it. A server built on
// the store (package netstore) calls KeepDeadTokens(DeadTokenTTL). In the
// process requests arrive in the order they were made, so by default the
// store only remembers the last release of each key, until its next sweep.
//
// The price is one tombstone of about 100 bytes per release, for d;
// tombstones past d are swept as releases come, so memory stays bounded by
// the release rate times d. A restart that loses data loses them too. d
// only grows: a smaller d than the current one is ignored.
func (s *Store) KeepDeadTokens(d time.Duration) {
	for {
		cur := s.deadFor.Load()
		if int64(d) <= cur || s.deadFor.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// deadKey names a released token of a key.
type deadKey struct{ key, token string }

// tomb is a released token's tombstone.
type tomb struct {
	held    bool          // the token held the lock when it was released
	expires time.Duration // since the store's epoch
}

// deadAt is a tombstone in the shard's sweep queue.
type deadAt struct {
	k       deadKey
	expires time.Duration
}

// kill records that token was released on key at now; held says whether it
// held the lock then. sh.mu must be held.
func (sh *shard) kill(s *Store, key, token string, held bool, now time.Duration) {
	d := time.Duration(s.deadFor.Load())
	if d <= 0 {
		if held {
			if sh.released == nil {
				sh.released = map[string]string{}
			}
			sh.released[key] = token
		}
		return
	}
	sh.sweepDead(now)
	k := deadKey{key, token}
	if t, ok := sh.dead[k]; ok && now < t.expires {
		return // dead already: the first release's answer stands
	}
	if sh.dead == nil {
		sh.dead = map[deadKey]tomb{}
	}
	sh.dead[k] = tomb{held: held, expires: now + d}
	sh.deadQ = append(sh.deadQ, deadAt{k, now + d})
}

// deadToken reports whether token was released on key, and whether it held
// the lock then. sh.mu must be held.
func (sh *shard) deadToken(key, token string, now time.Duration) (dead, held bool) {
	if last, ok := sh.released[key]; ok && last == token {
		return true, true
	}
	if t, ok := sh.dead[deadKey{key, token}]; ok && now < t.expires {
		return true, t.held
	}
	return false, false
}

// sweepDead drops the tombstones that have expired, oldest first: amortised
// O(1) per release. sh.mu must be held.
func (sh *shard) sweepDead(now time.Duration) {
	for sh.deadHead < len(sh.deadQ) && now >= sh.deadQ[sh.deadHead].expires {
		e := sh.deadQ[sh.deadHead]
		if t, ok := sh.dead[e.k]; ok && t.expires == e.expires {
			delete(sh.dead, e.k) // not killed again since
		}
		sh.deadQ[sh.deadHead] = deadAt{}
		sh.deadHead++
	}
	switch {
	case sh.deadHead == len(sh.deadQ) && cap(sh.deadQ) > 4096:
		sh.deadQ, sh.deadHead = nil, 0 // let a burst's queue go
	case sh.deadHead == len(sh.deadQ):
		sh.deadQ, sh.deadHead = sh.deadQ[:0], 0
	case sh.deadHead >= 64 && 2*sh.deadHead >= len(sh.deadQ):
		n := copy(sh.deadQ, sh.deadQ[sh.deadHead:])
		clear(sh.deadQ[n:])
		sh.deadQ, sh.deadHead = sh.deadQ[:n], 0
	}
}
