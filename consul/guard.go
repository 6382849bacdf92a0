package consul

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// guardOps is the number of checks TxnIfHeld puts before the caller's ops.
const guardOps = 2

// TxnIfHeld runs ops in one Consul transaction that first checks, in the
// store, that l still holds its lock: that the lock's entry is still locked
// by the session this backend acquired it with (check-session), and that
// the entry is still the one l's acquisition wrote (check-index against
// l.StoreFence(), the entry's ModifyIndex at the grant: renewals do not write
// the entry, and every acquisition, even one on a reused session, writes it
// at a new index). Consul applies the checks and ops atomically, in one
// Raft write: either l held the lock when ops were applied, or nothing was
// written. See "Guarded writes" in the package doc.
//
// On success the response's Results hold the results of ops only, as
// Consul returns them (a delete has none, a get-tree one per key); the
// checks' results are dropped. The checks take two of the operations
// Consul allows per transaction (128 in Consul 1.14).
//
// Errors:
//   - the lock is no longer l's (released, expired, its session destroyed,
//     taken by a successor, or its entry changed from outside): an error
//     wrapping backend.ErrNotHeld (lock.ErrNotHeld); nothing was written. A
//     lease released through this backend is refused without a request.
//   - the checks passed but ops failed: an *OpsError with Consul's errors,
//     indexed into ops; Consul rolled back, nothing was written.
//   - l or ctx is nil, l was not granted by this backend (it came from
//     another backend or client: call the method of the backend that
//     granted it, lock.Client.Backend), or ops holds a nil or empty
//     operation or one that would change the lock's own entry: an error
//     wrapping backend.ErrInvalid; nothing is sent.
//   - the backend is closed: an error wrapping backend.ErrClosed.
//   - the request failed: its outcome may be unknown; if ops were applied,
//     it was while l held the lock.
//
// The store decides, not the lease's own view: a lease that package lock
// already counts as lost (its deadline passed) but whose lock the store
// still keeps passes the checks, since nobody else can hold the lock then.
func (b *Backend) TxnIfHeld(ctx context.Context, l *lock.Lease, ops api.TxnOps) (*api.TxnResponse, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: consul: TxnIfHeld: nil lease", backend.ErrInvalid)
	}
	key := l.Key()
	if ctx == nil {
		return nil, fmt.Errorf("%w: consul: TxnIfHeld %q: nil context", backend.ErrInvalid, key)
	}
	if b.closed.Load() {
		return nil, fmt.Errorf("consul: TxnIfHeld %q: %w", key, backend.ErrClosed)
	}
	h, err := b.heldBy(l)
	if err != nil {
		return nil, err
	}
	if err := checkOps(key, h.name, ops); err != nil {
		return nil, err
	}
	return b.guardedTxn(ctx, key, h, ops)
}

// OpsError is the error of TxnIfHeld when the lock checks passed but ops
// failed: Consul rolled the transaction back, so nothing was written.
type OpsError struct {
	Key    string        // the lock's key
	Errors api.TxnErrors // Consul's errors; each OpIndex is an index into ops
}

func (e *OpsError) Error() string {
	msgs := make([]string, 0, len(e.Errors))
	for _, te := range e.Errors {
		msgs = append(msgs, fmt.Sprintf("ops[%d]: %s", te.OpIndex, te.What))
	}
	return fmt.Sprintf("consul: guarded transaction under %q rolled back, nothing was written: %s", e.Key, strings.Join(msgs, "; "))
}

// held is what TxnIfHeld checks in the store: the lock's entry, locked by
// session, last written at fence.
type held struct {
	name    string
	session string
	fence   uint64
}

// heldBy returns what this backend knows of l's lock.
func (b *Backend) heldBy(l *lock.Lease) (held, error) {
	key, token, fence := l.Key(), l.Token(), l.StoreFence()
	if token == "" || fence == 0 {
		return held{}, fmt.Errorf("%w: consul: TxnIfHeld %q: the lease has no token or fence: it was not granted by a lock.Client", backend.ErrInvalid, key)
	}
	name := b.entry(key)
	b.mu.Lock()
	o := b.owned[token]
	_, dead := b.deadToken(token)
	var h held
	if o != nil {
		h = held{name: o.key, session: o.session, fence: o.fence}
	}
	b.mu.Unlock()
	switch {
	case o != nil && h.name == name && h.fence == fence:
		return h, nil
	case o != nil:
		return held{}, fmt.Errorf("%w: consul: TxnIfHeld %q: the lease does not match the lock this backend granted its token", backend.ErrInvalid, key)
	case dead:
		// Its session may serve another lock by now: no check on it
		// would mean anything.
		return held{}, fmt.Errorf("%w: consul: %q: the lease was released or lost; its guarded transaction was not sent, nothing was written", backend.ErrNotHeld, key)
	case l.Err() != nil:
		// This backend forgets a token a while after its lease ended.
		return held{}, fmt.Errorf("%w: consul: %q: the lease has ended (%v); its guarded transaction was not sent, nothing was written", backend.ErrNotHeld, key, l.Err())
	}
	return held{}, fmt.Errorf("%w: consul: TxnIfHeld %q: this backend did not grant the lease; call the TxnIfHeld of the backend that did (lock.Client.Backend)", backend.ErrInvalid, key)
}

// checkOps refuses ops that Consul would choke on or that would change the
// lock's own entry, name.
func checkOps(key, name string, ops api.TxnOps) error {
	for i, op := range ops {
		switch {
		case op == nil:
			return fmt.Errorf("%w: consul: TxnIfHeld %q: ops[%d] is nil", backend.ErrInvalid, key, i)
		case op.KV == nil && op.Node == nil && op.Service == nil && op.Check == nil:
			return fmt.Errorf("%w: consul: TxnIfHeld %q: ops[%d] has no operation", backend.ErrInvalid, key, i)
		case op.KV != nil && changesEntry(op.KV, name):
			return fmt.Errorf("%w: consul: TxnIfHeld %q: ops[%d] (%s %q) would change the lock's own entry %q", backend.ErrInvalid, key, i, op.KV.Verb, op.KV.Key, name)
		}
	}
	return nil
}

// changesEntry reports whether op may write the entry name.
func changesEntry(op *api.KVTxnOp, name string) bool {
	switch op.Verb {
	case api.KVGet, api.KVGetOrEmpty, api.KVGetTree, api.KVCheckSession, api.KVCheckIndex, api.KVCheckNotExists:
		return false
	case api.KVDeleteTree:
		return strings.HasPrefix(name, op.Key)
	}
	return op.Key == name
}

// guardedTxn sends ops after the checks that the entry h.name is locked by
// h.session and was last written at h.fence.
func (b *Backend) guardedTxn(ctx context.Context, key string, h held, ops api.TxnOps) (*api.TxnResponse, error) {
	all := make(api.TxnOps, 0, guardOps+len(ops))
	all = append(all,
		&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: h.name, Session: h.session}},
		&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: h.name, Index: h.fence}},
	)
	all = append(all, ops...)
	// A transaction of reads only is served without Raft: make it
	// consistent. Writes go through Raft, which checks at apply time.
	ok, resp, _, err := b.cli.Txn().Txn(all, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	switch {
	case err != nil:
		return nil, fmt.Errorf("consul: guarded transaction under %q: %w (if it was applied, it was while the lock was held)", key, err)
	case resp == nil:
		return nil, fmt.Errorf("consul: guarded transaction under %q: no response", key)
	case !ok:
		return nil, refused(key, resp)
	case len(resp.Results) < guardOps:
		return nil, fmt.Errorf("consul: guarded transaction under %q: %d results, fewer than the lock checks", key, len(resp.Results))
	}
	resp.Results = resp.Results[guardOps:]
	return resp, nil
}

// refused is the error of a rolled-back guarded transaction: not held when
// a lock check failed, whatever ops did; else ops' errors.
func refused(key string, resp *api.TxnResponse) error {
	var checks []string
	var opErrs api.TxnErrors
	for _, e := range resp.Errors {
		switch {
		case e == nil:
		case e.OpIndex < guardOps:
			if !slices.Contains(checks, e.What) {
				checks = append(checks, e.What)
			}
		default:
			opErrs = append(opErrs, &api.TxnError{OpIndex: e.OpIndex - guardOps, What: e.What})
		}
	}
	why := strings.Join(checks, "; ")
	switch {
	case strings.Contains(strings.ToLower(why), "permission denied"):
		return fmt.Errorf("consul: guarded transaction under %q: the lock checks were denied (%s); nothing was written", key, why)
	case len(checks) > 0:
		return fmt.Errorf("%w: consul: %q is no longer held by this lease (%s); the guarded transaction was refused, nothing was written", backend.ErrNotHeld, key, why)
	case len(opErrs) > 0:
		return &OpsError{Key: key, Errors: opErrs}
	}
	return fmt.Errorf("consul: guarded transaction under %q: rolled back without an error; nothing was written", key)
}
