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
//     arrives last, the session lives TTL past the later of them.
//   - A session that expired while idle makes the lock transaction fail
//     with "invalid session"; Acquire then creates a new one.
//
// TestSessionReuseKeepsTheTTL and TestReleasingOneLockFreesNoOther check
// this against a real agent.
type sessionPool struct {
	mu   sync.Mutex
	idle map[time.Duration][]string
}

// maxIdle bounds the idle sessions kept per TTL.
const maxIdle = 64

// get returns an idle session of ttl, if any.
func (p *sessionPool) get(ttl time.Duration) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.idle[ttl]
	if len(s) == 0 {
		return "", false
	}
	id := s[len(s)-1]
	p.idle[ttl] = s[:len(s)-1]
	return id, true
}

// put keeps id for reuse; false when the pool is full (destroy it).
func (p *sessionPool) put(id string, ttl time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idle == nil {
		p.idle = map[time.Duration][]string{}
	}
	if len(p.idle[ttl]) >= maxIdle {
		return false
	}
	p.idle[ttl] = append(p.idle[ttl], id)
	return true
}

// drain empties the pool and returns what it held.
func (p *sessionPool) drain() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, s := range p.idle {
		out = append(out, s...)
	}
	p.idle = nil
	return out
}
