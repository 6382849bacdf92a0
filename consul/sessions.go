package consul

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock/backend"
)

// Shared sessions (WithSessions): one Consul session for many locks of a
// backend.
//
// Without shared sessions every lock has a session of its own, and
// renewing a lock renews its session: one request per lock. With them, the
// locks of one TTL that a backend acquires with Acquire for leases that
// renew themselves are held by one session, their shared session's: a
// batch of renewals sends one session renewal per shared session, however
// many of its locks it renews, and still checks each lock's entry (in
// transactions of up to maxChecksPerTxn checks) so that each lock gets its
// own answer. Waiters (Queue) keep sessions of their own.
//
// # Why a shared session keeps the promises
//
// Consul deletes every entry a session holds when the session is
// invalidated (behavior "delete"), so a lock lives as long as its session
// or until it is released. A renewal's grant counts from the send of the
// session renewal it followed, with the session's TTL a quarter longer
// than the lock's (reserveOf), as for a session of its own: a lease's
// deadline never lies past its lock's expiry.
//
// A session that holds many locks changes three things, each met here:
//
//   - Consul lets a session lock an entry it already holds (the value is
//     replaced). So the acquire transaction first checks that the entry
//     does not exist (check-not-exists): a lock of another lease of the
//     same session is refused as held, never taken over. An entry that
//     exists without a holder (written from outside) is locked with a
//     check of its index instead, so that it is still never one a session
//     holds.
//   - A release, a renewal's check and a loss watch can no longer tell the
//     lock by its session alone: another lock of the same session may hold
//     the entry later. They check the entry's index against the lock's
//     fence (check-index): every write to an entry changes its index, and
//     nothing writes it while it is held, so an entry at the fence's index
//     is still the lock the fence was granted with, held by its session.
//   - A dead token can no longer be killed by destroying its session,
//     which holds other locks. A late acquire of a released token must
//     still take nothing. The release of a token whose acquire had an
//     unknown outcome therefore first buries the token: it locks the
//     entry PREFIX + deadSep + TOKEN with the shared session, and every
//     acquire transaction checks that its token's tombstone does not exist
//     (check-not-exists) before it locks. Consul applies a transaction in
//     one Raft write, so an acquire that arrives after the burial is
//     refused whole, and one that arrived before it is found by the read
//     that follows the burial and deleted (check-index). The tombstone is
//     held by the session, so it lives exactly as long as an acquire with
//     that session could land, and goes with it.
//
// A lock could also live on after its holder stopped renewing it, for as
// long as the session's other locks are renewed. These rules bound that:
//
//   - Only leases that renew themselves join a shared session (package lock
//     asks a backend.TokenPrefixer for a prefix only for them, and Acquire
//     puts only tokens that name a shared session of this backend on it),
//     and package lock releases such a lease in the background when it
//     ends lost at its deadline.
//   - A release of unknown outcome (its reply lost, its context ended) is
//     sent again after each renewal of its session, until the store
//     answers it (backend.PendingReleases says why that is safe).
//   - A lock granted whose session renewal beside it failed is released
//     at once, in the background, with its fence (a lock of its own
//     session would have been freed by destroying the session).
//   - A shared session is never destroyed and never pooled: destroying it
//     would delete every lock it holds while their holders' deadlines lie
//     ahead.
//
// # Faults
//
//   - A process stopped or cut off for longer than the session's TTL: the
//     session expires and Consul deletes every lock of it, each lease lost
//     by its own deadline first (the TTL counts from the renewal's send);
//     the renewals then find the session gone (ErrNotHeld), the shared
//     session has ended, and new leases join a new one.
//   - A session renewal whose answer is lost: each renewal of the batch
//     that depends on it has an unknown outcome, as with a session of its
//     own; the next renewal or the session's expiry decides.
//   - A shared session that expired while idle: the acquire finds it gone
//     (its transaction changed nothing) and answers an error wrapping
//     backend.ErrContended; package lock's next attempt joins a new
//     session.
//
// # The cost
//
// Per batch of renewals, one session renewal per shared session instead of
// one per lock; the checks stay. Acquires send the session's renewal
// beside the lock transaction unless its latest renewal was sent within
// half its reserve (asIs), as pooled sessions do. The price: tombstones of
// doubtful tokens stay in the KV store while their session lives, one per
// acquire of unknown outcome; a lock whose release had an unknown outcome
// may be kept by its session until the next renewal of the session
// reaches the store.

// deadSep separates the prefix from a tombstone's token: a ';' never
// appears in an escaped key (escapeKey escapes it), so no entry or queue
// record is named like a tombstone.
const deadSep = ";dead/"

// WithSessions makes the locks of one TTL that a backend acquires for
// leases that renew themselves share one Consul session, renewed with one
// request however many locks it holds (see Shared sessions in
// sessions.go). For a process that holds many locks at once; the URL
// parameter sessions=true sets it.
func WithSessions(on bool) Option { return func(o *options) { o.sessions = on } }

// sharedSessions are a backend's shared sessions: the one that new leases
// of each TTL join, and every one whose locks may still renew.
type sharedSessions struct {
	b *Backend
	backend.Sessions[*shared]
}

// shared is one shared session.
type shared struct {
	ttl time.Duration // the TTL of its locks

	create chan struct{} // held while creating the Consul session (only then); heeds ctx

	mu        sync.Mutex
	id        string    // the Consul session, "" until created
	refreshed time.Time // send of the latest creation or renewal Consul confirmed
	made      time.Time
	ended     bool // Consul no longer knows it: no new lock joins it

	pending backend.PendingReleases
}

func newSharedSessions(b *Backend) *sharedSessions { return &sharedSessions{b: b} }

// TokenPrefix implements backend.TokenPrefixer: with shared sessions, "S"
// and the id of the session a lease of ttl joins; without them, "".
func (b *Backend) TokenPrefix(ttl time.Duration) (string, error) {
	if b.shared == nil {
		return "", nil
	}
	if err := b.check(ttl); err != nil {
		return "", err
	}
	_, id, err := b.shared.Current(ttl, usable, func(string) *shared {
		return &shared{ttl: ttl, create: make(chan struct{}, 1), made: time.Now()}
	})
	if err != nil {
		return "", err
	}
	return backend.SessionPrefix(id), nil
}

// usable reports whether new locks may still join s: it did not end, and
// it was renewed in the last half TTL (or is being created). Otherwise
// new locks join a new session rather than find s expired while idle; no
// lock of s is renewing, and its locks, if any, keep it (owned.shared).
func usable(s *shared) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.ended && (s.id == "" && time.Since(s.made) < s.ttl || time.Since(s.refreshed) < s.ttl/2)
}

// session returns the Consul session of s, creating it first if need be,
// with the send time of its latest confirmed creation or renewal.
func (s *shared) session(ctx context.Context, b *Backend) (string, time.Time, error) {
	s.mu.Lock()
	id, refreshed, ended := s.id, s.refreshed, s.ended
	s.mu.Unlock()
	if ended {
		return "", time.Time{}, errSharedEnded
	}
	if id != "" {
		return id, refreshed, nil
	}
	select {
	case s.create <- struct{}{}:
	case <-ctx.Done():
		return "", time.Time{}, fmt.Errorf("consul: acquire: creating a shared session: %w", ctx.Err())
	}
	defer func() { <-s.create }()
	s.mu.Lock()
	id, refreshed, ended = s.id, s.refreshed, s.ended // created while this call waited?
	s.mu.Unlock()
	switch {
	case ended:
		return "", time.Time{}, errSharedEnded
	case id != "":
		return id, refreshed, nil
	}
	sent := time.Now()
	// A creation whose answer was lost leaves a session that holds
	// nothing: it expires.
	id, err := b.createSession(ctx, "shared session", s.ttl)
	if err != nil {
		return "", time.Time{}, err
	}
	s.mu.Lock()
	s.id, s.refreshed = id, sent
	s.mu.Unlock()
	return id, sent, nil
}

// touch records that Consul confirmed a renewal of the session sent at
// sent.
func (s *shared) touch(sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sent.After(s.refreshed) {
		s.refreshed = sent
	}
}

// end marks the session as ended: Consul no longer knows it.
func (s *shared) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
}

// errSharedEnded: the shared session expired; the attempt took nothing, and
// the next one joins a new session.
var errSharedEnded = fmt.Errorf("consul: the lease's shared session ended (it expired): a new attempt joins a new session: %w", backend.ErrContended)

// tombstone is the name of token's tombstone (see Shared sessions).
func (b *Backend) tombstone(token string) string { return b.o.prefix + deadSep + token }

// acquireShared acquires key for token, with label, on the shared session
// s: renewed beside the transaction, unless its latest confirmed renewal
// leaves it more than the TTL (asIs).
func (b *Backend) acquireShared(ctx context.Context, key, token, label string, ttl time.Duration, s *shared) (backend.Grant, error) {
	if s.ttl != ttl {
		return backend.Grant{}, fmt.Errorf("%w: consul: a token of a session for %v used for a lock of %v; a token is for one acquisition with its TTL", backend.ErrInvalid, s.ttl, ttl)
	}
	id, refreshed, err := s.session(ctx, b)
	if err != nil {
		return backend.Grant{}, err
	}
	name := b.entry(key)
	b.mu.Lock()
	b.owned[token] = &owned{key: name, session: id, ttl: ttl, shared: s}
	b.mu.Unlock()
	// guard is the entry's check: that it does not exist, or, for an
	// entry found without a holder, that it is as it was read.
	guard := &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: name}
	for range 3 {
		ops := api.TxnOps{
			{KV: &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: b.tombstone(token)}},
			{KV: guard},
			{KV: &api.KVTxnOp{Verb: api.KVLock, Key: name, Value: entryValue(token, label), Session: id}},
			{KV: &api.KVTxnOp{Verb: api.KVGet, Key: name}},
		}
		var renewErr error
		var wg sync.WaitGroup
		renew := !asIs(ttl, time.Now(), refreshed)
		if renew {
			wg.Go(func() {
				var sent time.Time
				if sent, renewErr = b.renewAfter(ctx, id); renewErr == nil {
					s.touch(sent)
				}
			})
		}
		ok, resp, _, err := b.cli.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
		wg.Wait()
		if errors.Is(renewErr, errSessionGone) {
			s.end()
		}
		var got *api.KVPair // the entry, as the transaction left it
		if ok {
			for _, r := range resp.Results {
				if r != nil && r.KV != nil && r.KV.Key == name && tokenOf(r.KV.Value) == token {
					got = r.KV
				}
			}
		}
		switch {
		case err != nil:
			// The outcome is unknown: package lock releases the token,
			// which buries it (releaseDoubtful).
			return backend.Grant{}, fmt.Errorf("consul: acquire %q: %w", key, err)
		case ok && (renewErr != nil || got == nil):
			// Locked, but the session may not live ttl from now (or the
			// answer lacks the entry): give the lock up.
			if got != nil {
				b.setFence(token, got.ModifyIndex)
			}
			b.releaseLater(key, token)
			why := "the transaction returned no entry"
			if renewErr != nil {
				why = "renewing the session: " + renewErr.Error()
			}
			return backend.Grant{}, fmt.Errorf("consul: acquire %q: %s", key, why)
		case ok:
			b.setFence(token, got.ModifyIndex)
			return backend.Grant{Fence: got.ModifyIndex, TTL: ttl}, nil
		}
		// Refused: nothing changed.
		failed := map[int]string{}
		for _, e := range resp.Errors {
			if e != nil {
				failed[e.OpIndex] = e.What
			}
		}
		if why, bad := failed[2]; bad {
			b.forget(token)
			switch {
			case strings.Contains(why, "invalid session"):
				s.end()
				return backend.Grant{}, errSharedEnded
			case strings.Contains(why, "lock delay"):
				return backend.Grant{}, backend.Locked(b.lockDelayLeft(name))
			case strings.Contains(why, "already held"):
				b.sawHeld(name)
				return backend.Grant{}, backend.Locked(0)
			}
			return backend.Grant{}, fmt.Errorf("consul: acquire %q: %s", key, why)
		}
		if _, bad := failed[0]; bad {
			b.forget(token)
			return backend.Grant{}, fmt.Errorf("%w: consul: token %s was released before; a token is for one attempt", backend.ErrInvalid, token)
		}
		if renewErr != nil {
			b.forget(token)
			if errors.Is(renewErr, errSessionGone) {
				return backend.Grant{}, errSharedEnded
			}
			return backend.Grant{}, fmt.Errorf("consul: acquire %q: renewing the session: %w", key, renewErr)
		}
		if _, bad := failed[1]; !bad {
			b.forget(token)
			return backend.Grant{}, fmt.Errorf("consul: acquire %q: %s", key, txnErrors(resp))
		}
		// The entry exists, and the lock would have been granted: it is
		// held by this session for another lease, or it has no holder.
		kv, _, err := b.cli.KV().Get(name, (&api.QueryOptions{}).WithContext(ctx))
		switch {
		case err != nil:
			b.forget(token)
			return backend.Grant{}, fmt.Errorf("consul: acquire %q: %w", key, err)
		case kv == nil:
			guard = &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: name}
		case kv.Session != "":
			b.forget(token)
			b.sawHeld(name)
			return backend.Grant{}, backend.Locked(0)
		default:
			guard = &api.KVTxnOp{Verb: api.KVCheckIndex, Key: name, Index: kv.ModifyIndex}
		}
	}
	b.forget(token)
	return backend.Grant{}, backend.Locked(0) // the entry keeps changing
}

// setFence records the fence of token's grant.
func (b *Backend) setFence(token string, fence uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if o := b.owned[token]; o != nil {
		o.fence = fence
	}
}

// forget forgets token's attempt, which changed nothing.
func (b *Backend) forget(token string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.owned, token)
}

// releaseLater releases key for token in the background, bounded; Close
// waits. A release of unknown outcome is pending on its session (see
// settle), and sent again after its next renewal.
func (b *Backend) releaseLater(key, token string) {
	b.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b.Release(ctx, key, token)
	})
}

// releaseDoubtful releases key for token, whose acquire on a shared session
// had an unknown outcome: it buries the token (its tombstone, held by the
// session, makes any copy of the acquire still on its way fail), then
// deletes the entry if the acquire landed. Its outcome is recorded on the
// session: pending when unknown.
func (b *Backend) releaseDoubtful(ctx context.Context, key, token string, o *owned) error {
	known, err := b.buryAndRelease(ctx, key, token, o)
	o.shared.pending.Record(key, token, known)
	return err
}

// buryAndRelease is releaseDoubtful's work; known is false when its
// outcome is unknown.
func (b *Backend) buryAndRelease(ctx context.Context, key, token string, o *owned) (known bool, err error) {
	ok, resp, _, err := b.cli.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: b.tombstone(token), Session: o.session}},
	}, (&api.QueryOptions{}).WithContext(ctx))
	switch {
	case err != nil:
		return false, fmt.Errorf("consul: release %q: burying the token: %w", key, err)
	case !ok && strings.Contains(txnErrors(resp), "invalid session"):
		// The session is gone, and every entry it held with it; no
		// acquire with it can land.
		o.shared.end()
		b.kill(token, false)
		return true, fmt.Errorf("%w: consul: %q: %v", backend.ErrNotHeld, key, errSessionGone)
	case !ok:
		return false, fmt.Errorf("consul: release %q: burying the token: %s", key, txnErrors(resp))
	}
	// Buried: no acquire of token lands from now on. Did one land
	// before?
	kv, _, err := b.cli.KV().Get(o.key, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("consul: release %q: %w", key, err)
	}
	if kv == nil || kv.Session != o.session || tokenOf(kv.Value) != token {
		b.kill(token, false)
		return true, fmt.Errorf("%w: consul: %q is not held by this token", backend.ErrNotHeld, key)
	}
	ok, resp, _, err = b.cli.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: o.key, Index: kv.ModifyIndex}},
		{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: o.key}},
	}, (&api.QueryOptions{}).WithContext(ctx))
	switch {
	case err != nil:
		return false, fmt.Errorf("consul: release %q: %w", key, err)
	case !ok:
		b.kill(token, false)
		return true, fmt.Errorf("%w: consul: %q changed while it was released: %s", backend.ErrNotHeld, key, txnErrors(resp))
	}
	b.kill(token, true)
	return true, nil
}

// resend sends the pending releases of s's locks again, in the
// background, within a TTL; Close waits for it.
func (ss *sharedSessions) resend(s *shared) {
	s.pending.Resend(ss.Start, s.ttl, func(ctx context.Context, key, token string) {
		ss.b.Release(ctx, key, token) // records its outcome
	})
}
