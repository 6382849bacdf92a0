package backend

import (
	crand "crypto/rand"
	"sync"
)

// Session ids for a TokenPrefixer. A backend whose leases share a session
// on the store can name the session in each token with the prefix "S" and
// a session id from NewSessionID: the prefix starts with a byte that is no
// hexadecimal digit, as TokenPrefixer requires, and is MaxTokenPrefix bytes
// long. SessionID finds the id in a token again, with no state per lease.

// SessionIDLen is the length of the ids NewSessionID returns.
const SessionIDLen = MaxTokenPrefix - 1

// sessionMark is the first byte of a token that names a session.
const sessionMark = 'S'

// sessionAlphabet are the characters of a session id: 32 of them, so that
// each of the SessionIDLen characters carries 5 random bits (35 in all).
const sessionAlphabet = "abcdefghijklmnopqrstuvwxyz234567"

// NewSessionID returns a new random session id: SessionIDLen characters
// of a-z and 2-7, safe in store keys. The token prefix that names the
// session is "S" followed by it (SessionPrefix).
func NewSessionID() string {
	var r [SessionIDLen]byte
	crand.Read(r[:])
	for i := range r {
		r[i] = sessionAlphabet[r[i]%32]
	}
	return string(r[:])
}

// SessionPrefix returns the token prefix that names session id.
func SessionPrefix(id string) string { return string(sessionMark) + id }

// SessionID returns the session id that token names (it starts with
// SessionPrefix of it), or "" when it names none.
func SessionID(token string) string {
	if len(token) < 1+SessionIDLen || token[0] != sessionMark {
		return ""
	}
	return token[1 : 1+SessionIDLen]
}

// PendingReleases is a session's record of the releases of its locks whose
// outcome is unknown (a lost reply, a context that ended while the request
// was out): the zero value is empty and ready, and it is safe for
// concurrent use.
//
// Why a session needs it: a lock of a session does not expire while the
// session lives (the session's renewals keep it, whatever its holder
// does), so a release that may not have reached the store could leave the
// lock for as long as the session's other locks are renewed, where a lock
// of its own would expire a TTL later. The backend records every release
// of a session's lock (Record), and sends the pending ones again while the
// session lives (List), until each has a known outcome.
//
// Why sending a release again keeps every promise: a release is checked by
// token, and a token is for one acquisition, so it frees only that
// acquisition's lock, never another owner's; sent again after it took
// effect, it finds the token dead (its tombstone) and changes nothing.
type PendingReleases struct {
	mu sync.Mutex
	m  map[PendingRelease]struct{}
}

// PendingRelease names one lock: its key, as the backend names it, and
// its holder's token.
type PendingRelease struct{ Key, Token string }

// Record records the outcome of a release of token's lock on key: known
// (the store answered: nothing is pending) or not.
func (p *PendingReleases) Record(key, token string, known bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := PendingRelease{key, token}
	switch {
	case known:
		delete(p.m, r)
	case p.m == nil:
		p.m = map[PendingRelease]struct{}{r: {}}
	default:
		p.m[r] = struct{}{}
	}
}

// List returns the releases pending now, in no order.
func (p *PendingReleases) List() []PendingRelease {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]PendingRelease, 0, len(p.m))
	for r := range p.m {
		out = append(out, r)
	}
	return out
}
