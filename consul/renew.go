package consul

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock/backend"
)

// Renewals. A renewal is a renewal of the lock's session and a check that
// the entry is still locked by that session (a check-session operation in
// a read transaction), sent together. Renew runs them for one lock;
// RenewBatch (backend.BatchRenewer), which package lock sends when many
// automatic renewals fall due together, runs the session renewals of a
// batch at most renewConcurrency at a time (for the whole backend) and
// checks its entries in
// transactions of up to maxChecksPerTxn operations, instead of one
// transaction each.
//
// Why a batch keeps the promise: each renewal in it is Renew's for its own
// lock, and its answer is its own: an entry no longer locked by its
// session is reported lost and the others renewed. A transaction that one
// check fails is refused whole, with the failed operations named: those
// locks are not held, and the rest are checked again without them, so
// that one lost lock never turns another's answer. A check is a read,
// and a session renewal is what Renew sends; the session's renewal,
// confirmed, keeps the session (and the entry it locks) at least its TTL
// from the caller's send time, which is before this call began. A request
// whose answer is lost is that renewal's unknown outcome, as in Renew; a
// renewal never writes an entry, so nothing sent again can take a free
// key.

// maxChecksPerTxn bounds the operations of one check transaction: Consul
// takes at most 64 in a transaction.
const maxChecksPerTxn = 64

// renewConcurrency bounds the session renewals of a backend in flight at
// once, whatever the batches: each is an HTTP request, and Consul refuses
// more than 200 concurrent connections from one address by default (the
// backend's loss watches and queue waits need some too). A batch of 256
// sent at once, or 64 batches of 16, would exceed it.
const renewConcurrency = 32

// Renew implements backend.Backend: it renews the token's session and, in
// the same round trip, checks that the entry is still locked by it.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	r := b.renew(ctx, []backend.Renewal{{Key: key, Token: token, TTL: ttl}})[0]
	return r.Grant, r.Err
}

// RenewBatch implements backend.BatchRenewer: each renewal as Renew, with
// the checks shared (see Renewals).
func (b *Backend) RenewBatch(ctx context.Context, rs []backend.Renewal) []backend.RenewResult {
	return b.renew(ctx, rs)
}

// renewal is one lock's renewal in progress.
type renewal struct {
	key, token string
	o          *owned
	s          *sessionRenewal // its session's renewal
	notHeld    string          // why the check failed; "" when it passed or is unknown
}

// sessionRenewal is one session's renewal in a batch.
type sessionRenewal struct {
	id     string
	shared *shared // nil: a session of one lock
	alive  bool    // the renewal found the session
	err    error   // the renewal's error: outcome unknown
}

// renew runs the renewals rs and returns each one's answer.
func (b *Backend) renew(ctx context.Context, rs []backend.Renewal) []backend.RenewResult {
	out := make([]backend.RenewResult, len(rs))
	ws := make([]*renewal, 0, len(rs))
	idx := make([]int, 0, len(rs))
	for i, r := range rs {
		if err := b.check(r.TTL); err != nil {
			out[i].Err = err
			continue
		}
		b.mu.Lock()
		o := b.owned[r.Token]
		b.mu.Unlock()
		if o == nil || o.fence == 0 || o.key != b.entry(r.Key) {
			out[i].Err = fmt.Errorf("%w: consul: %q is not held by this token", backend.ErrNotHeld, r.Key)
			continue
		}
		if r.TTL > o.ttl {
			out[i].Err = fmt.Errorf("%w: consul: renew %q for %v: its session's TTL is %v; renew for at most that", backend.ErrInvalid, r.Key, r.TTL, o.ttl)
			continue
		}
		ws = append(ws, &renewal{key: r.Key, token: r.Token, o: o})
		idx = append(idx, i)
	}
	if len(ws) == 0 {
		return out
	}
	sent := time.Now()
	// One renewal per session: locks of a shared session share it.
	bySession := map[string]*sessionRenewal{}
	for _, w := range ws {
		if bySession[w.o.session] == nil {
			bySession[w.o.session] = &sessionRenewal{id: w.o.session, shared: w.o.shared}
		}
		w.s = bySession[w.o.session]
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		var rg sync.WaitGroup
		for _, sr := range bySession {
			select {
			case b.sessionRenewals <- struct{}{}:
			case <-ctx.Done():
				sr.err = ctx.Err() // not sent; unknown to the caller all the same
				continue
			}
			rg.Go(func() {
				defer func() { <-b.sessionRenewals }()
				sr.alive, sr.err = b.renewSession(ctx, sr.id)
			})
		}
		rg.Wait()
	})
	checkErrs := make([]error, len(ws))
	for start := 0; start < len(ws); start += maxChecksPerTxn {
		chunk := ws[start:min(len(ws), start+maxChecksPerTxn)]
		err := b.checkHeld(ctx, chunk)
		for j := range chunk {
			checkErrs[start+j] = err
		}
	}
	wg.Wait()
	for _, sr := range bySession {
		switch {
		case sr.shared == nil:
		case sr.err == nil && sr.alive:
			sr.shared.touch(sent)
			b.shared.resend(sr.shared)
		case sr.err == nil:
			sr.shared.end()
		}
	}
	for j, w := range ws {
		i := idx[j]
		switch err := checkErrs[j]; {
		case w.notHeld != "":
			b.destroyLater(w.token)
			out[i].Err = fmt.Errorf("%w: consul: %q: %s", backend.ErrNotHeld, w.key, w.notHeld)
		case w.s.err == nil && !w.s.alive:
			b.destroyLater(w.token)
			out[i].Err = fmt.Errorf("%w: consul: %q: %v", backend.ErrNotHeld, w.key, errSessionGone)
		case err != nil:
			out[i].Err = fmt.Errorf("consul: renew %q: %w", w.key, err)
		case w.s.err != nil:
			out[i].Err = fmt.Errorf("consul: renew %q: %w", w.key, w.s.err)
		default:
			b.mu.Lock()
			if sent.After(w.o.renewed) {
				w.o.renewed = sent
			}
			b.mu.Unlock()
			out[i].Grant = backend.Grant{Fence: w.o.fence, TTL: w.o.ttl}
		}
	}
	return out
}

// checkHeld checks that each entry of ws is locked by its session, in one
// read transaction; a transaction refused for some of them marks those
// not held, and the others are checked again without them. An error is
// the unknown outcome of the checks not yet decided.
func (b *Backend) checkHeld(ctx context.Context, ws []*renewal) error {
	for len(ws) > 0 {
		ops := make(api.TxnOps, len(ws))
		for i, w := range ws {
			ops[i] = &api.TxnOp{KV: heldCheck(w.o)}
		}
		ok, resp, _, err := b.cli.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		failed := map[int]string{}
		if resp != nil {
			for _, e := range resp.Errors {
				if e != nil && e.OpIndex >= 0 && e.OpIndex < len(ws) {
					failed[e.OpIndex] = e.What
				}
			}
		}
		if len(failed) == 0 {
			return errors.New("consul: check transaction refused without naming an operation: " + txnErrors(resp))
		}
		rest := ws[:0:0]
		for i, w := range ws {
			if why, bad := failed[i]; bad {
				w.notHeld = why
			} else {
				rest = append(rest, w)
			}
		}
		ws = rest
	}
	return nil
}

// heldCheck is the check that o's lock is still held: that its entry is
// locked by its session or, for a lock of a shared session, which may
// hold the entry again for another lease, that the entry is still at the
// fence's index (see Shared sessions in sessions.go).
func heldCheck(o *owned) *api.KVTxnOp {
	if o.shared != nil {
		return &api.KVTxnOp{Verb: api.KVCheckIndex, Key: o.key, Index: o.fence}
	}
	return &api.KVTxnOp{Verb: api.KVCheckSession, Key: o.key, Session: o.session}
}
