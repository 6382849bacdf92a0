package backend

import (
	"context"
	crand "crypto/rand"
	"sync"
	"time"
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
	mu        sync.Mutex
	m         map[PendingRelease]struct{}
	resending bool // a Resend is running
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

// Resend sends the pending releases again, one after another, with
// release (which records each outcome with Record), in a goroutine that
// start runs; start returns false when the backend is closing, and then
// nothing is sent. One Resend runs at a time (another call meanwhile does
// nothing), and it gives up after within. A backend calls it after each
// confirmed renewal of the session: while the session lives, so may the
// locks of its pending releases.
func (p *PendingReleases) Resend(start func(func()) bool, within time.Duration, release func(ctx context.Context, key, token string)) {
	ls := p.List()
	p.mu.Lock()
	if p.resending || len(ls) == 0 {
		p.mu.Unlock()
		return
	}
	p.resending = true
	p.mu.Unlock()
	done := func() {
		p.mu.Lock()
		p.resending = false
		p.mu.Unlock()
	}
	if !start(func() {
		defer done()
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		for _, l := range ls {
			if ctx.Err() != nil {
				return
			}
			release(ctx, l.Key, l.Token)
		}
	}) {
		done()
	}
}

// Sessions is a backend's table of sessions of type S: the one that new
// leases of each class (their TTL, as the backend rounds it) join, and
// every one that a token may still name. The zero value is ready; it is
// safe for concurrent use.
type Sessions[S any] struct {
	mu      sync.Mutex
	current map[time.Duration]sessionOf[S]
	byID    map[string]S
	closed  bool
	wg      sync.WaitGroup // Start's goroutines
}

type sessionOf[S any] struct {
	id string
	s  S
}

// Current returns the session that a new lease of class joins, and its
// id: the latest one of class while usable (called with the table locked)
// says it still is, or else a new one that open makes for a new id from
// NewSessionID. A session that is no longer usable is forgotten: a token
// that names it finds none (Lookup), and its backend gives such a token's
// acquire a lease of its own or refuses it. After Close, ErrClosed.
func (t *Sessions[S]) Current(class time.Duration, usable func(S) bool, open func(id string) S) (S, string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		var zero S
		return zero, "", ErrClosed
	}
	if c, ok := t.current[class]; ok {
		if usable(c.s) {
			return c.s, c.id, nil
		}
		delete(t.byID, c.id)
	}
	if t.current == nil {
		t.current, t.byID = map[time.Duration]sessionOf[S]{}, map[string]S{}
	}
	id := NewSessionID()
	c := sessionOf[S]{id: id, s: open(id)}
	t.current[class], t.byID[id] = c, c.s
	return c.s, id, nil
}

// Lookup returns the session that token names, when the table has it.
func (t *Sessions[S]) Lookup(token string) (S, bool) {
	id := SessionID(token)
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.byID[id]
	return s, ok && id != ""
}

// Start runs f in a goroutine, unless the table is closed (false); Close
// waits for it.
func (t *Sessions[S]) Start(f func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Go(f)
	return true
}

// Close makes Current answer ErrClosed and Start refuse, and waits for
// the goroutines Start runs.
func (t *Sessions[S]) Close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
}
