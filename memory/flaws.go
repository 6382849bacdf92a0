package memory

import (
	"runtime"
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
