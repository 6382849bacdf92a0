package consul

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// The handover, on the releasing side (see queue.go for what it
// guarantees): the operations that give the entry to the head of the
// queue, the waiters read from a transaction, and the second transaction
// of a release that knew no waiter.

// maxView bounds the waiters a handover tells the new holder of.
const maxView = 16

// handoverTimeout bounds a handover sent after a release.
const handoverTimeout = 10 * time.Second

// waiter is a queued waiter as a releaser read it.
type waiter struct {
	Key     string `json:"k"` // the record
	Session string `json:"s"`
	Token   string `json:"t"`
	Label   string `json:"l,omitempty"` // its holder label (label.go)
	Index   uint64 `json:"i"`           // the record's ModifyIndex when read
}

// handedValue is the value of a record handed the lock, after recHanded.
type handedValue struct {
	Token string   `json:"t"`
	Next  []waiter `json:"n,omitempty"`
}

// handoverOps are the operations that give the free or just unlocked entry
// name to ws[0], with its label, telling it of the rest.
func handoverOps(name string, ws []waiter) api.TxnOps {
	n := ws[0]
	v, _ := json.Marshal(handedValue{Token: n.Token, Next: ws[1:min(len(ws), maxView+1)]})
	return api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: name, Value: entryValue(n.Token, n.Label), Session: n.Session}},
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: n.Key, Index: n.Index}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: n.Key, Value: append([]byte(recHanded), v...), Session: n.Session}},
	}
}

// waiters returns the queued waiters of entry name in a transaction's
// results (of a get-tree of the queue, or of the entry's name), oldest
// first.
func waiters(name string, resp *api.TxnResponse) []waiter {
	if resp == nil {
		return nil
	}
	var out []waiter
	var created []uint64
	for _, r := range resp.Results {
		kv := r.KV
		if kv == nil || kv.Session == "" || !strings.HasPrefix(kv.Key, name+queueSep) || !strings.HasPrefix(string(kv.Value), recQueued) {
			continue
		}
		token, label := parseValue(kv.Value[len(recQueued):])
		out = append(out, waiter{Key: kv.Key, Session: kv.Session, Token: token, Label: label, Index: kv.ModifyIndex})
		created = append(created, kv.CreateIndex)
	}
	idx := make([]int, len(out))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(created[a], created[b]) })
	sorted := make([]waiter, len(out))
	for i, j := range idx {
		sorted[i] = out[j]
	}
	return sorted
}

// handOverLater hands the free entry name to the first of ws that can
// take it, in the background: a waiter whose record changed or whose
// session is gone is skipped; a lock taken by someone else meanwhile ends
// it (that holder's release hands it over).
func (b *Backend) handOverLater(name string, ws []waiter) {
	b.sawHeld(name)
	b.bg.Go(func() {
		ctx, cancel := context.WithTimeout(b.ctx, handoverTimeout)
		defer cancel()
		for i := 0; i < len(ws) && i < 3; i++ {
			ok, resp, _, err := b.cli.Txn().Txn(handoverOps(name, ws[i:]), (&api.QueryOptions{}).WithContext(ctx))
			if ok || err != nil {
				return // handed over, or unknown: the waiter's timer covers it
			}
			if lockRefused(resp) {
				return
			}
		}
	})
}

// lockRefused reports whether a handover was refused by the lock entry
// (held by someone else, or under a lock-delay) rather than by the
// waiter's record or session.
func lockRefused(resp *api.TxnResponse) bool {
	if resp == nil {
		return false
	}
	for _, e := range resp.Errors {
		if e.OpIndex == 0 && !strings.Contains(e.What, "invalid session") {
			return true
		}
	}
	return false
}
