package consul

import (
	"sync"
	"time"
)

// sessionPool keeps the sessions of released locks, by TTL, for the next
// acquisitions of the same backend: a session costs a Raft write to create,
// a renewal costs none.
//
// Why reuse keeps the promises:
//   - A session holds at most one lock: it enters the pool only after the
//     transaction that deleted its entry succeeded (the delete checked the
//     session), or after a lock transaction was refused, which changed
//     nothing. A session whose outcome is unknown (a lost reply, a refused
//     release) is destroyed, never pooled, so a late lock transaction of
//     an earlier owner can never land on a session that now serves
//     another lock: destroying it makes Consul refuse that transaction.
//   - The store keeps a lock at least its TTL after the acquire was sent:
//     a reused session is renewed in the same round trip as the lock
//     transaction, and both are sent after the acquire began; whichever
//     arrives last, the session lives TTL past the later of them. Or its
//     latest confirmed renewal was recent enough that its longer TTL
//     covers the lock's TTL from the acquire (see reserveOf).
//   - A session that expired while idle (or was destroyed from outside)
//     makes the lock transaction fail with "invalid session", which
//     changes nothing; Acquire then creates a new session, never tries a
//     second pooled one after it, and never reports a grant it was not
//     given.
//
// TestSessionReuseKeepsTheTTL and TestReleasingOneLockFreesNoOther check
// this against a real agent.
type sessionPool struct {
	mu   sync.Mutex
	idle map[time.Duration][]pooled
}

// pooled is an idle session and the send time of its latest confirmed
// creation or renewal: the store keeps it at least its TTL from then.
type pooled struct {
	id      string
	renewed time.Time
}

// maxIdle bounds the idle sessions kept per TTL.
const maxIdle = 64

// get returns an idle session of ttl, if any.
func (p *sessionPool) get(ttl time.Duration) (pooled, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.idle[ttl]
	if len(s) == 0 {
		return pooled{}, false
	}
	e := s[len(s)-1]
	p.idle[ttl] = s[:len(s)-1]
	return e, true
}

// put keeps e for reuse; false when the pool is full (destroy it).
func (p *sessionPool) put(e pooled, ttl time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idle == nil {
		p.idle = map[time.Duration][]pooled{}
	}
	if len(p.idle[ttl]) >= maxIdle {
		return false
	}
	p.idle[ttl] = append(p.idle[ttl], e)
	return true
}

// drain empties the pool and returns what it held.
func (p *sessionPool) drain() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, s := range p.idle {
		for _, e := range s {
			out = append(out, e.id)
		}
	}
	p.idle = nil
	return out
}
