package redis

import (
	"errors"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// Quiet releases: the single deployment's release of a token that no
// request can follow leaves no tombstone.
//
// A tombstone (see Dead tokens in redis.go) exists for the requests of a
// token that may reach the server after its release: a copy that go-redis
// sent again after a lost reply, and an acquire (or a transfer to the
// token, or a place's attempt) that the caller gave up on, which package
// lock undoes with a release that may overtake it. Writing one is the
// most expensive step of an uncontended cycle: a new key and its expiry,
// created and later expired by the server, for every release. The
// backend writes it only when such a request may exist:
//
//   - The requests that can take a key for a token (Acquire, a place's
//     attempt, Transfer to it) and Release go out with runOnce: go-redis
//     never sends them again once they may have reached the connection.
//     So a reply received means the one copy has run, and none is left on
//     its way; a lost reply is an error, which the backend sees.
//   - A token any such request of which failed (an unknown outcome: the
//     caller's context ended, the connection broke) is a suspect, and
//     stays one until a release of it that kills it (with a tombstone) has
//     a known outcome. Package lock undoes an acquire of unknown outcome
//     with such a release, on this backend.
//   - Every other token's release is quiet: when the token holds the
//     lock, it deletes it and writes nothing else; when it does not, it
//     answers "not held" and writes nothing. No request that could take
//     the key for the token can arrive later: each one sent had its reply.
//     Renewals may still arrive (they are sent again after a lost reply);
//     a renewal never takes a free key (renewScript), so a late one
//     changes nothing.
//
// What a quiet release gives up is the second purpose of the tombstone:
// a release that reaches the server twice answers "not held" the second
// time. Only a client library's resend would do that, and runOnce rules
// it out; package lock's own resends of a release of unknown outcome
// (cleanup) are for suspects, and their answers are not reported (see
// lock.Lease.Release). A release from another process (lockctl break) of
// a token this backend never saw is quiet too: that token's own requests
// all had their replies in its holder's process, or that process's
// release will kill it.
//
// A client that cannot send a request only once (a Client of the caller's
// own without Process; see batcher.sendsOnce) gets tombstones on every
// release, as before.
type suspects struct {
	mu sync.Mutex
	m  map[string]struct{}
}

// failed notes a request of token whose outcome is unknown.
func (s *suspects) failed(token string, err error) {
	if err == nil || isReply(err) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]struct{}{}
	}
	s.m[token] = struct{}{}
}

// has reports whether token is a suspect.
func (s *suspects) has(token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[token]
	return ok
}

// killed notes that a release of token that kills it had a known outcome.
func (s *suspects) killed(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, token)
}

// isReply reports whether err is the server's reply (the script ran, or
// was refused, and said so), not a request's unknown outcome.
func isReply(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && !goredis.HasErrorPrefix(err, "NOSCRIPT")
}
