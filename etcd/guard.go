package etcd

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// TxnIfHeld runs ops in one etcd transaction that also checks that l, a
// lease of a lock.Client over this backend, still holds its lock: the lock
// key holds l's token and was created at l's fence (its create revision),
// so neither an expired nor a released lock, nor a successor's, lets the
// writes through. It returns the transaction's response when it ran ops; an
// error wrapping lock.ErrNotHeld, having written nothing, when the lock is
// no longer l's; an error wrapping lock.ErrLost or lock.ErrReleased, sending
// nothing, when l has already ended; and ErrInvalid for bad input. The ops
// must not touch the backend's own keys (under its prefix).
//
// This is stronger than a fence check at the resource: etcd refuses the
// writes from the moment the lock is gone, even before anyone else has
// acquired it, and nothing can happen between the check and the writes,
// which commit together. It protects only data in the same etcd cluster:
// for anything else, send the fence (lock.Lease.Fence) and check it at the
// resource.
func (b *Backend) TxnIfHeld(ctx context.Context, l *lock.Lease, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("%w: etcd: TxnIfHeld: nil context", backend.ErrInvalid)
	case l == nil:
		return nil, fmt.Errorf("%w: etcd: TxnIfHeld: nil lease", backend.ErrInvalid)
	case len(ops) == 0:
		return nil, fmt.Errorf("%w: etcd: TxnIfHeld: no operations", backend.ErrInvalid)
	}
	for _, op := range ops {
		if k := string(op.KeyBytes()); b.opts.prefix != "" && strings.HasPrefix(k, b.opts.prefix) {
			return nil, fmt.Errorf("%w: etcd: TxnIfHeld: key %q is under the backend's prefix %q; keep the data elsewhere", backend.ErrInvalid, k, b.opts.prefix)
		}
	}
	if err := l.WaitConfirmed(ctx); err != nil {
		return nil, err
	}
	lk := b.lockKeyOf(l.Key())
	resp, err := b.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.Value(lk), "=", l.Token()),
		clientv3.Compare(clientv3.ModRevision(lk), "=", int64(l.StoreFence())),
	).Then(ops...).Commit()
	if err != nil {
		return nil, b.storeErr(ctx, "txn if held", err)
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("etcd: TxnIfHeld: %w: the lock of %q is no longer this lease's (expired, released or taken over); nothing was written", backend.ErrNotHeld, l.Key())
	}
	return resp, nil
}
