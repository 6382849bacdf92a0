package consul

import (
	"context"

	"github.com/hashicorp/consul/api"
)

// GuardedTxn sends the transaction TxnIfHeld sends for a lock of key that
// this backend believes session holds since fence, whatever it knows: tests
// use it to show what the store alone refuses.
func (b *Backend) GuardedTxn(ctx context.Context, key, session string, fence uint64, ops api.TxnOps) (*api.TxnResponse, error) {
	return b.guardedTxn(ctx, key, held{name: b.entry(key), session: session, fence: fence}, ops)
}

// Entry is the KV name of key's lock entry; its queue records are under
// Entry(key) + "/q/".
func (b *Backend) Entry(key string) string { return b.entry(key) }

// OwnedFence is the fence this backend keeps for token's lock, 0 when it
// knows none (yet): a handover's report sets it.
func (b *Backend) OwnedFence(token string) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if o := b.owned[token]; o != nil {
		return o.fence
	}
	return 0
}

// PendingReleases returns how many releases of unknown outcome the shared
// session that token names still has to send again.
func (b *Backend) PendingReleases(token string) int {
	if b.shared == nil {
		return 0
	}
	s, ok := b.shared.Lookup(token)
	if !ok {
		return 0
	}
	return len(s.pending.List())
}

// TokenOf is the token of a lock entry's value, which may carry a holder
// label after it (label.go).
func TokenOf(v []byte) string { return tokenOf(v) }
