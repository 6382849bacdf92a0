package memory

import (
	"path"
	"runtime"
	"strings"
	"time"

	"github.com/distlock/lock/backend"
)

// flaws are deliberate bugs, switched on only by this package's tests, to
// prove that the conformance suite catches a backend that breaks a promise.
// They are all off in every Store a user can build.
type flaws struct {
	releaseIgnoresToken bool // Release deletes whoever holds the key
	renewReacquires     bool // Renew of a free or expired key takes it again
	repeatFence         bool // fences repeat: 1, 1, 2, 2, 3, ...
	nonAtomicAcquire    bool // Acquire checks and sets in two steps
	expireEarly         bool // a lock expires after 3/4 of its TTL; conflicts report no remaining TTL
	roundDown           bool // TTLs are rounded down to a declared 100ms granularity
	renewShort          bool // Renew extends by half the TTL asked for
	grantOverstated     bool // Grant.TTL says twice the TTL the store enforces
	prefixToken         bool // renew and release compare the first 16 characters of tokens
	releaseExpiredOK    bool // Release of one's own expired lock reports success
	silentNotifier      bool // Watch never wakes anyone
	inspectExpired      bool // Inspect reports expired locks as held
	inspectStale        bool // Inspect reports the key's first holder, not its current one
	claimsFIFO          bool // Capabilities declares FIFO; waiters race newcomers
	forgetFenceIdle     bool // the fence counter starts again after 300ms without a grant
	ignoreContext       bool // calls wait for a disconnected client or a paused store regardless of their context
	transferAnyFrom     bool // a transfer with a reserved fence does not check from
	transferForgets     bool // a transfer forgets that an owner elsewhere waits
	transferKeepsExpiry bool // a transfer keeps the previous expiry instead of the new TTL
	shortKeys           bool // keys are stored cut to 64 bytes, as in a column too short
	foldKeys            bool // keys are stored lower-cased, as under a case-insensitive collation
	cleanKeys           bool // keys are stored as cleaned paths, as behind an HTTP router
}

// storedKey returns key as the store keeps it.
func (f *flaws) storedKey(key string) string {
	switch {
	case f.shortKeys && len(key) > 64:
		return key[:64]
	case f.foldKeys:
		return strings.ToLower(key)
	case f.cleanKeys:
		return path.Clean(key)
	}
	return key
}

// enforced returns the TTL the store really enforces for a request of ttl.
func (f *flaws) enforced(ttl time.Duration) time.Duration {
	switch {
	case f.expireEarly:
		return ttl * 3 / 4
	case f.roundDown:
		return ttl / flawGranularity * flawGranularity
	}
	return ttl
}

// flawGranularity is the granularity the roundDown flaw declares.
const flawGranularity = 100 * time.Millisecond

// sameToken compares tokens as the store does.
func (f *flaws) sameToken(a, b string) bool {
	if f.prefixToken && len(a) >= 16 && len(b) >= 16 {
		return a[:16] == b[:16]
	}
	return a == b
}

// acquireNonAtomic is Acquire with the check and the set in two critical
// sections: two callers can both see the key free and both "win".
func (c *Client) acquireNonAtomic(key, token string, ttl time.Duration) (backend.Grant, error) {
	s := c.s
	sh := s.shard(key)
	sh.mu.Lock()
	now := s.now()
	e, ok := sh.locks[key]
	sh.mu.Unlock()
	if ok && now < e.expires {
		return backend.Grant{}, backend.Locked(e.expires - now)
	}
	runtime.Gosched()
	sh.mu.Lock()
	fence := s.nextFence()
	sh.locks[key] = entry{token: token, fence: fence, expires: now + ttl}
	sh.mu.Unlock()
	return backend.Grant{Fence: fence, TTL: ttl}, nil
}
