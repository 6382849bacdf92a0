package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock/backend"
)

// Holder labels (backend.Label). The label of a token's lock is a key of
// its own beside the lock key, named after the token:
//
//	k/KEY\xff            the holder's token (the lock key)
//	k/KEY\xffh/TOKEN     the label TOKEN's request carried (labelKey)
//	k/KEY\xffq/ID        a waiter's queue record
//
// It cannot be taken for anything else: after the lock key's 0xff (never
// part of a valid UTF-8 key, so no other lock's key starts with it) comes
// "h/", where a queue record has "q/", so that no label key is under the
// queue prefix (the compares that check "nobody queues" and "my record
// comes first" look under k/KEY\xffq/ only) and the follower of the key,
// which watches k/KEY\xff and everything after it, ignores it; tombstones
// live under t/.
//
// Written with the lock, on the lock's lease. The request that grants a
// lock puts the label key in the same transaction branch that puts the
// lock key, attached to the same lease: the acquire (acquireOn, which
// session acquires share), and a waiter's attempt that takes the key
// (place.Attempt). Only when the request carries a label: a lock without
// one costs nothing more, and no acquire costs a request more.
//
// A label describes a token, never a key. Inspect reports the label key
// of the token that the lock key holds, and nothing else, so a label put
// by a late or repeated request can only ever describe its own token, and
// a label left behind under another token is never reported.
//
// Gone with the lock. Every release transaction deletes the label key of
// the released token, in every branch (it held the key, it did not, the
// lock was handed to the next waiter): deleting a key that does not exist
// changes nothing. That matters because leases outlive their locks: a
// released lock's lease goes back to the pool and carries the next lock,
// and a session's lease carries many locks at once; a label left on
// either would live on with it. A lock whose lease expires or is revoked
// takes its label with it. A lock deleted from outside while its lease
// lives (found by a renewal, which revokes a lease of this backend's own)
// leaves its label on a session's lease: that renewal deletes it.
//
// The handover. A release that hands the lock to the head of the queue
// knows the head's token, not its label. So a waiter's attempt that
// queues puts its label under its token beside its record, on its lease
// (the one its lock will be on), in the same request: when the lock is
// handed to that token, its label is already there, and Inspect reports
// it. A waiter's next attempt, with a new token, deletes the label of the
// previous one in its transaction (place.labelToks), and a waiter that
// leaves revokes its lease, which deletes its record and its label; so a
// place's lease, when it goes back to the pool, carries no label. A
// waiter whose queueing attempt carried no label, or another version of
// this backend's, shows none once the lock is handed to it.
//
// The cost of a label for a waiter is that Inspect reads the label keys
// of the queued waiters too: it reads the lock key and the label keys in
// one range, with at most inspectLabels label keys, and reads the
// holder's label key alone in a second request only when the range had
// more and the holder's was not among those it took.

// labelKey returns the key of token's label beside lock key lk.
func labelKey(lk, token string) string { return lk + "h/" + token }

// labelsEnd returns the end of the range of lock key lk and its label
// keys: lk, then lk+"h/..."; the queue records (lk+"q/...") come after.
func labelsEnd(lk string) string { return lk + "h0" }

// inspectLabels bounds the label keys that Inspect reads in its first
// request.
const inspectLabels = 16

// requestLabel returns the holder label that ctx carries for a request
// that may grant a lock, or an error wrapping backend.ErrInvalid for one
// longer than backend.MaxLabel (package lock sends none).
func requestLabel(ctx context.Context) (string, error) {
	l := backend.Label(ctx)
	if len(l) > backend.MaxLabel {
		return "", fmt.Errorf("%w: etcd: holder label of %d bytes; at most %d", backend.ErrInvalid, len(l), backend.MaxLabel)
	}
	return l, nil
}

// putLabel returns ops with the put of token's label beside lock key lk,
// on lease id, appended: ops alone when label is "".
func putLabel(ops []clientv3.Op, lk, token, label string, id clientv3.LeaseID) []clientv3.Op {
	if label == "" {
		return ops
	}
	return append(ops, clientv3.OpPut(labelKey(lk, token), label, clientv3.WithLease(id)))
}

// deleteLabels returns ops with the deletes of the labels of tokens beside
// lock key lk appended.
func deleteLabels(ops []clientv3.Op, lk string, tokens []string) []clientv3.Op {
	for _, t := range tokens {
		ops = append(ops, clientv3.OpDelete(labelKey(lk, t)))
	}
	return ops
}
