package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock/backend"
)

// Sessions (WithSessions): one lease for many locks of a client.
//
// Without sessions every lock has a lease of its own, and renewing a lock
// is a keep-alive of its lease: one message per lock on the client's
// keep-alive stream, which the leader answers one after another. At
// 300,000 locks with a TTL of 6s that is 150,000 keep-alives a second, and
// they fall behind. With sessions, the locks of one TTL (in seconds) that
// a backend acquires with Acquire for leases that renew themselves share
// one lease, their session's: a batch of renewals sends one keep-alive per
// session, however many of its locks it renews, and still reads each lock
// key to check that its token holds it on that lease.
//
// # Why a shared lease keeps the promises
//
// etcd deletes every key attached to a lease when the lease expires or is
// revoked, so a lock on the session's lease lives as long as the lease,
// or until it is released or deleted. A renewal's grant counts from the
// send of the session's keep-alive that the renewal followed (or that went
// beside the acquire), with the TTL that keep-alive's answer gave, and the
// read after it shows the key still on that lease: as for a lease of its
// own, the store keeps the lock at least the granted TTL from the send. A
// lease's deadline can thus never lie past its lock's expiry.
//
// What a shared lease changes is the other way round: renewing one lock
// extends the others, so a lock could live on after its holder stopped
// renewing it, for as long as the session's other locks are renewed. These
// rules bound that:
//
//   - Only leases that renew themselves join a session (package lock asks
//     a backend.TokenPrefixer for a prefix only for them, and Acquire puts
//     only tokens that name a session of this backend on its lease), and
//     package lock releases such a lease in the background when it ends
//     lost at its deadline.
//   - A release of unknown outcome (its reply lost, its context ended) is
//     sent again after each renewal of its session, until the store
//     answers it (released).
//   - The release of a token whose acquire had an unknown outcome writes
//     the token's tombstone under the session's lease rather than the
//     tombstones' own (which keeps it 15 to 30s): the acquire, should it
//     arrive later, is refused for as long as the lease lives, which is as
//     long as it could attach a key to that lease.
//   - A session's lease is never revoked and never reused for another
//     session: a revoke would delete every lock of the session while their
//     holders' deadlines lie ahead. For the same reason the backend
//     revokes no lease it did not make itself (one it found under a key
//     it released or renewed for another client): it may be a session's.
//     And it keeps no other client's session alive: a renewal of a token
//     of another client's session is refused (ErrInvalid).
//
// # Faults
//
//   - A process stopped or cut off for longer than the lease's TTL: the
//     lease expires and every lock of the session goes with it, each lease
//     lost by its own deadline first; the renewals then find the lease
//     gone (ErrNotHeld), the session has ended, and new leases join a new
//     one.
//   - A keep-alive whose answer is lost: each renewal of the batch has an
//     unknown outcome, as for a lease of its own; the next keep-alive or
//     the lease's expiry decides.
//   - A session's lease that expired while idle: the acquire finds it gone
//     (its transaction did nothing) and answers an error wrapping
//     backend.ErrContended, and package lock's next attempt joins a new
//     session.
//
// # The cost
//
// Per batch of renewals, one keep-alive per session instead of one per
// lock; the reads stay (up to 128 keys per read-only transaction). The
// price: a lock of a session whose process died lives until the session's
// lease expires (its TTL plus a second after the last keep-alive), as
// without sessions; a session's lease may keep the key of a lock released
// with an unknown outcome until the next renewal of the session reaches
// the store.

// WithSessions makes the leases of one TTL that renew themselves share one
// etcd lease, renewed with one keep-alive however many locks it carries
// (see Sessions in sessions.go). For a process that holds many locks at
// once; the URL parameter sessions=true sets it.
func WithSessions(on bool) Option { return func(o *options) { o.sessions = on } }

// sessions are a backend's sessions: the one that new leases of each TTL
// join, and every one whose locks may still renew.
type sessions struct {
	b *Backend
	backend.Sessions[*session]
}

// session is one session: its lease, once granted.
type session struct {
	secs int64 // the TTL of its locks, in seconds

	grant chan struct{} // held while granting the lease (only then); heeds ctx

	mu        sync.Mutex
	id        clientv3.LeaseID // clientv3.NoLease until granted
	refreshed time.Time        // send of the latest grant or keep-alive the store confirmed
	made      time.Time        // when the session was made
	ended     bool             // its lease is gone: no new lock joins it

	// pending are the session's locks (by the caller's key) whose
	// release had an unknown outcome (see released).
	pending backend.PendingReleases
}

func newSessions(b *Backend) *sessions { return &sessions{b: b} }

// TokenPrefix implements backend.TokenPrefixer: with sessions, "S" and the
// id of the session a lease of ttl joins.
func (b *Backend) TokenPrefix(ttl time.Duration) (string, error) {
	if b.sessions == nil {
		return "", nil
	}
	if err := b.check(); err != nil {
		return "", err
	}
	if err := b.checkTTL(ttl); err != nil {
		return "", err
	}
	secs := seconds(ttl)
	_, id, err := b.sessions.Current(time.Duration(secs)*time.Second, usable, func(string) *session {
		return &session{secs: secs, grant: make(chan struct{}, 1), made: time.Now()}
	})
	if err != nil {
		return "", err
	}
	return backend.SessionPrefix(id), nil
}

// usable reports whether new locks may still join s: its lease is not
// gone, and was refreshed in the last half TTL (or is being granted).
// Otherwise new locks join a new session rather than find the lease
// expired while idle; no lock of s is renewing, and its locks, if any,
// keep it through their leases (heldLease.session).
func usable(s *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ttl := time.Duration(s.secs) * time.Second
	return !s.ended && (s.id == clientv3.NoLease && time.Since(s.made) < ttl || time.Since(s.refreshed) < ttl/2)
}

// lease returns the session's lease, granting it first if need be, with
// the send time of its latest confirmed refresh.
func (s *session) lease(ctx context.Context, b *Backend) (clientv3.LeaseID, time.Time, error) {
	s.mu.Lock()
	id, refreshed, ended := s.id, s.refreshed, s.ended
	s.mu.Unlock()
	if id != clientv3.NoLease || ended {
		return s.granted(id, refreshed, ended)
	}
	select {
	case s.grant <- struct{}{}:
	case <-ctx.Done():
		return clientv3.NoLease, time.Time{}, b.storeErr(ctx, "acquire: session lease", ctx.Err())
	}
	defer func() { <-s.grant }()
	s.mu.Lock()
	id, refreshed, ended = s.id, s.refreshed, s.ended // granted while this call waited?
	s.mu.Unlock()
	if id != clientv3.NoLease || ended {
		return s.granted(id, refreshed, ended)
	}
	sent := time.Now()
	resp, err := b.cli.Grant(ctx, leaseSecs(s.secs))
	if err != nil {
		// A grant whose answer was lost leaves a lease that carries
		// nothing: it expires.
		return clientv3.NoLease, time.Time{}, b.storeErr(ctx, "acquire: session lease", err)
	}
	s.mu.Lock()
	s.id, s.refreshed = resp.ID, sent
	s.mu.Unlock()
	return resp.ID, sent, nil
}

// granted answers lease for a session whose lease was granted, or ended.
func (s *session) granted(id clientv3.LeaseID, refreshed time.Time, ended bool) (clientv3.LeaseID, time.Time, error) {
	if ended {
		return clientv3.NoLease, time.Time{}, errSessionEnded
	}
	return id, refreshed, nil
}

// touch records that the store confirmed a grant or keep-alive of the
// session's lease sent at sent.
func (s *session) touch(sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sent.After(s.refreshed) {
		s.refreshed = sent
	}
}

// end marks the session as ended: its lease is gone.
func (s *session) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
}

// errSessionEnded: the session's lease expired; the attempt took nothing,
// and the next one joins a new session.
var errSessionEnded = fmt.Errorf("etcd: the lease's session ended (its lease expired): a new attempt joins a new session: %w", backend.ErrContended)

// acquireInSession acquires key for token on session s's lease: refreshed
// by a keep-alive sent beside the transaction, unless the lease's latest
// confirmed refresh leaves it more than the TTL (see reserve).
func (b *Backend) acquireInSession(ctx context.Context, key, token string, secs int64, s *session) (backend.Grant, error) {
	if s.secs != secs {
		return backend.Grant{}, fmt.Errorf("%w: etcd: a token of a session for %ds used for a lock of %ds; a token is for one acquisition with its TTL", backend.ErrInvalid, s.secs, secs)
	}
	id, refreshed, err := s.lease(ctx, b)
	if err != nil {
		return backend.Grant{}, err
	}
	var g backend.Grant
	if sent := time.Now(); asIs(secs, sent, refreshed) {
		g, err = b.acquireOn(ctx, key, token, secs, id, sent, refreshed, time.Duration(secs)*time.Second, nil, s)
	} else {
		ka, kerr := b.ka.start(id)
		if kerr != nil {
			return backend.Grant{}, b.storeErr(ctx, "acquire: keep-alive", kerr)
		}
		g, err = b.acquireOn(ctx, key, token, secs, id, sent, sent, 0, ka, s)
	}
	if errors.Is(err, errLeaseGone) {
		s.end()
		return backend.Grant{}, errSessionEnded
	}
	return g, err
}

// released records the outcome of a release of token's lock on key: known
// (the store answered) or not. A lock of a session does not expire while
// its session's other locks are renewed: a release of unknown outcome is
// sent again after each renewal of the session (resend), until one has a
// known outcome (see backend.PendingReleases for why that is safe).
func (s *session) released(key, token string, known bool) {
	s.pending.Record(key, token, known)
}

// resend sends the pending releases of s's locks again, in the
// background, within a TTL; Close waits for it.
func (ss *sessions) resend(s *session) {
	s.pending.Resend(ss.Start, time.Duration(s.secs)*time.Second, func(ctx context.Context, key, token string) {
		ss.b.Release(ctx, key, token) // records its outcome
	})
}
