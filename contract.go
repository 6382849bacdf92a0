package lock

import (
	"fmt"
	"time"
)

// brokenGrant checks a grant, handover or transfer that the backend
// reported, before it becomes a lease, against the two rules of the
// contract that package lock relies on to keep its promises: the fence is
// greater than 0 (a resource that checks fences needs one above every
// earlier holder's, and 0 is what a backend returns when it granted
// nothing), and the TTL the store enforces is at least the TTL asked for
// (0 stands for exactly that): the lease's deadline is counted from the
// asked TTL, and a store that expires the lock earlier could give it to
// another owner while this one is still valid. Under a fence epoch, the
// fence must also fit below it (WithFenceEpoch). It returns an error
// wrapping ErrBackendContract that names the backend and the rule, or nil.
//
// The caller treats a broken grant as one of unknown outcome: the store
// may hold the lock for the token, or for nobody, so it releases the token
// and returns the error. A single backend bug then costs an error, never
// two holders.
func (c *Client) brokenGrant(what string, fence uint64, granted, asked time.Duration) error {
	switch {
	case fence == 0:
		return fmt.Errorf("%w: %T reported %s with fence 0; a fence must be greater than 0 (a grant is never empty)", ErrBackendContract, c.b, what)
	case !c.cfg.fits(fence):
		return fmt.Errorf("%w: %T reported %s with fence %d, which does not fit under a fence epoch (WithFenceEpoch): a store's fence must be below 2^%d", ErrBackendContract, c.b, what, fence, FenceEpochShift)
	case granted != 0 && granted < asked:
		return fmt.Errorf("%w: %T reported %s for %v, shorter than the %v asked for; the store must keep a lock at least the TTL asked for", ErrBackendContract, c.b, what, granted, asked)
	}
	return nil
}
