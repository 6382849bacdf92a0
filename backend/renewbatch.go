package backend

import (
	"context"
	"time"
)

// BatchRenewer is an optional interface: a backend that can renew many
// locks in one request to its store implements it, and package lock then
// sends the automatic renewals that fall due together as batches instead
// of one request per lease. A process that holds hundreds of thousands of
// locks needs it: one request (and one goroutine) per renewal is what gives
// out first.
type BatchRenewer interface {
	// RenewBatch renews each of rs as Renew would, and returns one result
	// per renewal, in the order of rs: results[i] is what
	// Renew(ctx, rs[i].Key, rs[i].Token, rs[i].TTL) would have returned
	// (a grant, ErrNotHeld for a lock the store no longer holds for that
	// token, ErrInvalid for a TTL out of range, or an error of unknown
	// outcome). One renewal's answer never changes another's: a lock
	// that was lost is reported lost and the others renewed. A renewal
	// the store answered for is as good as Renew's: the store keeps that
	// lock at least its TTL from when it received the batch, which came
	// after the caller's send time. An error of the whole request (a lost
	// reply, ctx ending) is every unanswered renewal's unknown outcome; a
	// renewal, sent again or not, never takes a free key.
	RenewBatch(ctx context.Context, rs []Renewal) []RenewResult
}

// Renewal is one lock to renew in a batch (BatchRenewer).
type Renewal struct {
	Key, Token string
	TTL        time.Duration
}

// RenewResult is one renewal's answer in a batch (BatchRenewer).
type RenewResult struct {
	Grant Grant
	Err   error
}

// FailedRenewals returns the answers to a batch of n renewals of which none
// could be sent (a closed backend, say): each fails with err.
func FailedRenewals(n int, err error) []RenewResult {
	out := make([]RenewResult, n)
	for i := range out {
		out[i].Err = err
	}
	return out
}
