package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock/backend"
)

// Renewals. A renewal is two steps: a keep-alive of the lock's lease, then
// a read of the lock key to check that the token still holds it on that
// lease. Renew runs them for one lock; RenewBatch (backend.BatchRenewer)
// for many, which package lock sends when many automatic renewals fall due
// together: every keep-alive goes out on the backend's one keep-alive
// stream before any answer is awaited, and the keys whose lease lives are
// read in one read-only transaction of up to maxReadsPerTxn reads, instead
// of one Range each.
//
// Why a batch keeps the promise: each renewal in it is Renew's two steps
// for its own lock, in Renew's order (its read is sent only after its
// keep-alive was answered), and its answer is its own: one lock found lost
// is reported lost and the others renewed. A read-only transaction is one
// linearizable read of all its keys, as good for each as its own Range. The
// keep-alive's answer bounds the store's expiry of the lease from below
// (its TTL from when the store received the keep-alive, which was after
// the caller's send time), and the read shows that the key is still on
// that lease: so the store keeps the lock at least the granted TTL from the
// caller's send time, which is what package lock counts the deadline from.
// A keep-alive or read whose answer is lost is that renewal's unknown
// outcome, as in Renew (a keep-alive of unknown outcome taints the lease:
// it is never reused); a renewal never writes, so nothing sent again can
// take a free key.

// maxReadsPerTxn bounds the reads of one transaction: etcd refuses a
// transaction of more operations than its --max-txn-ops (128 by default).
// A server set lower makes the batch split its transactions until they
// pass (readKeys).
const maxReadsPerTxn = 128

// Renew implements backend.Backend: a keep-alive of the owner's lease, then
// a read of the lock key to check that it is still the owner's.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if err := b.check(); err != nil {
		return backend.Grant{}, err
	}
	r := b.renew(ctx, []backend.Renewal{{Key: key, Token: token, TTL: ttl}})[0]
	return r.Grant, r.Err
}

// RenewBatch implements backend.BatchRenewer: each renewal as Renew, with
// the keep-alives sent together and the reads shared (see Renewals).
func (b *Backend) RenewBatch(ctx context.Context, rs []backend.Renewal) []backend.RenewResult {
	if err := b.check(); err != nil {
		return backend.FailedRenewals(len(rs), err)
	}
	return b.renew(ctx, rs)
}

// renewal is one lock's renewal in progress.
type renewal struct {
	lk, token string
	ttl       time.Duration
	h         *heldLease // nil for a lock this backend did not acquire
	id        clientv3.LeaseID
	sent      time.Time
	ka        <-chan kaAnswer // the keep-alive's answer; nil: none sent
	// shares is the index of the earlier renewal of the batch whose
	// keep-alive this one shares (the same lease: a session's), or -1.
	shares  int
	kttl    int64 // the TTL the keep-alive restarted the lease with
	ok      bool  // renewed
	unknown bool  // the keep-alive's outcome is unknown
	lost    bool  // the read found the key no longer the token's on its lease
}

// renew runs the renewals rs: all keep-alives, then the reads of the keys
// whose lease lives, and returns each one's answer.
func (b *Backend) renew(ctx context.Context, rs []backend.Renewal) []backend.RenewResult {
	out := make([]backend.RenewResult, len(rs))
	ws := make([]renewal, len(rs))
	defer func() {
		for i := range ws {
			if w := &ws[i]; w.h != nil {
				b.leases.renewed(w.h, w.sent, w.ok, w.unknown)
			}
		}
	}()
	// A session's lease gets one keep-alive per batch, however many of
	// its locks the batch renews (see sessions.go): the renewals after the
	// first share its answer, sent before their own send time would be.
	// Each still counts from that keep-alive's send, and is still checked
	// by its own read after the answer.
	kaOf := map[clientv3.LeaseID]int{}
	for i, r := range rs {
		w := &ws[i]
		w.shares = -1
		w.lk, w.token, w.ttl = b.lockKeyOf(r.Key), r.Token, r.TTL
		w.h = b.leases.renewing(w.lk, w.token)
		w.sent = time.Now()
		if w.h != nil {
			w.id = w.h.id
		} else if backend.SessionID(w.token) != "" {
			// Another client's session: its keep-alive would extend
			// every lock of that session, whose holders may be gone.
			out[i].Err = fmt.Errorf("%w: etcd: renew of a lock of another client's session (token %.8s...): only the client that acquired it renews it", backend.ErrInvalid, w.token)
			continue
		} else {
			// A lock this backend did not acquire: find its lease.
			resp, err := b.cli.Get(ctx, w.lk)
			if err != nil {
				out[i].Err = b.storeErr(ctx, "renew", err)
				continue
			}
			if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != w.token {
				out[i].Err = backend.ErrNotHeld
				continue
			}
			w.id = clientv3.LeaseID(resp.Kvs[0].Lease)
		}
		if j, ok := kaOf[w.id]; ok {
			w.shares, w.sent = j, ws[j].sent
			continue
		}
		kaOf[w.id] = i
		ch, err := b.ka.start(w.id)
		if err != nil {
			w.unknown = true
			out[i].Err = b.storeErr(ctx, "renew: keep-alive", err)
			continue
		}
		w.ka = ch
	}
	var live []int // the renewals whose keep-alive was answered
	kaErr := make([]error, len(ws))
	for i := range ws {
		w := &ws[i]
		var kttl int64
		var err error
		switch {
		case w.shares >= 0:
			j := w.shares
			if ws[j].ka == nil {
				// The keep-alive could not be sent: the same unknown
				// outcome.
				w.unknown, out[i].Err = ws[j].unknown, out[j].Err
				continue
			}
			kttl, err = ws[j].kttl, kaErr[j]
		case w.ka == nil:
			continue
		default:
			kttl, err = await(ctx, w.ka)
			kaErr[i] = err
			if w.h != nil && w.h.session != nil {
				switch {
				case errors.Is(err, rpctypes.ErrLeaseNotFound):
					w.h.session.end()
				case err == nil:
					w.h.session.touch(w.sent)
				}
			}
		}
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			b.leases.release(w.lk, w.token) // expired: nothing to reuse or revoke
			out[i].Err = backend.ErrNotHeld
		case err != nil:
			w.unknown = true
			out[i].Err = b.storeErr(ctx, "renew: keep-alive", err)
		default:
			w.kttl = kttl
			live = append(live, i)
		}
	}
	for len(live) > 0 {
		n := min(len(live), maxReadsPerTxn)
		chunk := live[:n]
		live = live[n:]
		lks := make([]string, n)
		for j, i := range chunk {
			lks[j] = ws[i].lk
		}
		kvs, err := b.readKeys(ctx, lks)
		for j, i := range chunk {
			if err != nil {
				out[i].Err = b.storeErr(ctx, "renew", err)
				continue
			}
			out[i].Grant, out[i].Err = b.renewed(ctx, &ws[i], kvs[j])
		}
	}
	b.unlabelLost(ctx, ws)
	if b.sessions != nil {
		// Send again the releases of unknown outcome of the sessions
		// renewed (see released).
		done := map[*session]bool{}
		for i := range ws {
			if h := ws[i].h; h != nil && h.session != nil && !done[h.session] {
				done[h.session] = true
				b.sessions.resend(h.session)
			}
		}
	}
	return out
}

// renewed decides w, whose keep-alive was answered, from kv, what the lock
// key held after it (nil: nothing).
func (b *Backend) renewed(ctx context.Context, w *renewal, kv *mvccpb.KeyValue) (backend.Grant, error) {
	if kv == nil || string(kv.Value) != w.token || kv.Lease != int64(w.id) {
		// The key was deleted from outside (or taken over after that)
		// while the lease lived: the lock is lost, and its lease of no
		// use.
		w.lost = true
		if w.h != nil {
			b.leases.release(w.lk, w.token)
		}
		if w.h != nil && w.h.session == nil {
			// Only a lease this backend made for this lock alone: one
			// found under the key may be a session's.
			b.revoke(ctx, w.id)
		}
		return backend.Grant{}, backend.ErrNotHeld
	}
	secs := seconds(w.ttl)
	if got := lockTTL(secs, w.kttl); got < time.Duration(secs)*time.Second {
		return backend.Grant{}, fmt.Errorf("%w: etcd: renew for %v, but the lock's lease keeps it %v, fixed when it was acquired; renew with the TTL of the acquire", backend.ErrInvalid, w.ttl, got)
	}
	w.ok = true
	return backend.Grant{Fence: uint64(kv.ModRevision), TTL: lockTTL(secs, w.kttl)}, nil
}

// unlabelLost deletes the holder labels of the locks of the renewals ws
// found lost on a session's lease, which lives on with its other locks
// (see label.go): one transaction for them all, best effort (the token's
// release deletes it too). A lease of this backend's own that lost its
// lock was revoked, with its label.
func (b *Backend) unlabelLost(ctx context.Context, ws []renewal) {
	var ops []clientv3.Op
	seen := map[string]bool{}
	for i := range ws {
		w := &ws[i]
		if !w.lost || w.h == nil || w.h.session == nil || !w.h.labelled {
			continue
		}
		if k := labelKey(w.lk, w.token); !seen[k] {
			seen[k] = true
			ops = append(ops, clientv3.OpDelete(k))
		}
	}
	for len(ops) > 0 {
		n := min(len(ops), maxReadsPerTxn)
		b.deleteAll(ctx, ops[:n])
		ops = ops[n:]
	}
}

// deleteAll runs the deletes ops in one transaction, best effort; one the
// server refuses as too large is split in two.
func (b *Backend) deleteAll(ctx context.Context, ops []clientv3.Op) {
	_, err := b.cli.Txn(ctx).Then(ops...).Commit()
	if errors.Is(err, rpctypes.ErrTooManyOps) && len(ops) > 1 {
		h := len(ops) / 2
		b.deleteAll(ctx, ops[:h])
		b.deleteAll(ctx, ops[h:])
	}
}

// readKeys reads the keys lks in one linearizable request (a Range for one
// key, a read-only transaction for more) and returns what each holds, nil
// for a key that does not exist. A transaction the server refuses as too
// large is split in two.
func (b *Backend) readKeys(ctx context.Context, lks []string) ([]*mvccpb.KeyValue, error) {
	out := make([]*mvccpb.KeyValue, len(lks))
	if len(lks) == 1 {
		resp, err := b.cli.Get(ctx, lks[0])
		if err != nil {
			return nil, err
		}
		if len(resp.Kvs) == 1 {
			out[0] = resp.Kvs[0]
		}
		return out, nil
	}
	ops := make([]clientv3.Op, len(lks))
	for i, lk := range lks {
		ops[i] = clientv3.OpGet(lk)
	}
	resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
	if errors.Is(err, rpctypes.ErrTooManyOps) {
		h := len(lks) / 2
		first, err := b.readKeys(ctx, lks[:h])
		if err != nil {
			return nil, err
		}
		rest, err := b.readKeys(ctx, lks[h:])
		if err != nil {
			return nil, err
		}
		return append(first, rest...), nil
	}
	if err != nil {
		return nil, err
	}
	for i, r := range resp.Responses {
		if rr := r.GetResponseRange(); rr != nil && len(rr.Kvs) == 1 {
			out[i] = rr.Kvs[0]
		}
	}
	return out, nil
}
