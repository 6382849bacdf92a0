package etcd

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// KeepAlive sends one keep-alive on b's stream.
func KeepAlive(ctx context.Context, b *Backend, id clientv3.LeaseID) (int64, error) {
	return b.ka.keepAlive(ctx, id)
}

// AfterKeepAliveSent sets a function that runs after each keep-alive of b
// went out; set it before b is used concurrently.
func AfterKeepAliveSent(b *Backend, f func()) { b.ka.afterSend = f }

// BreakKeepAliveStream breaks b's keep-alive stream: the keep-alives waiting
// for their answers fail with an unknown outcome.
func BreakKeepAliveStream(b *Backend) {
	b.ka.mu.Lock()
	defer b.ka.mu.Unlock()
	if b.ka.cur != nil {
		b.ka.breakLocked(b.ka.cur)
	}
}

// PredictRefusal makes b's waiters take every attempt for one that will
// queue (or none, with false), whatever the store shows: set it before b
// is used.
func PredictRefusal(b *Backend, refused bool) { b.queues.refusable = func() bool { return refused } }

// AgeIdleLeases makes b's idle leases look d older than they are: their
// latest confirmed refresh moves d earlier (which only makes the backend
// more careful with them).
func AgeIdleLeases(b *Backend, d time.Duration) {
	b.leases.mu.Lock()
	defer b.leases.mu.Unlock()
	for _, p := range b.leases.pool {
		for i := range p {
			p[i].refreshed = p[i].refreshed.Add(-d)
		}
	}
}

// UnrefreshedWindow is how recently an idle lease must have been refreshed
// to carry a lock without a refresh of its own.
const UnrefreshedWindow = unrefreshedWindow

// QueueHeadToken returns the token at the head of key's queue as b's
// follower of the key sees it, or "" when b does not follow the key or sees
// nobody queued.
func QueueHeadToken(b *Backend, key string) string {
	_, head, ok := b.queues.head(b.lockKeyOf(key))
	if !ok {
		return ""
	}
	return head.token
}

// LeaseTTL is the TTL of the lease that carries a lock of ttl.
func LeaseTTL(ttl time.Duration) time.Duration {
	return time.Duration(leaseSecs(seconds(ttl))) * time.Second
}

// LockKey returns the store key of key's lock.
func LockKey(b *Backend, key string) string { return b.lockKeyOf(key) }
