package conformance

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// roundTTL rounds d up to the store's granularity.
func (s *suite) roundTTL(d time.Duration) time.Duration {
	if g := s.caps.Granularity; g > 0 {
		d = (d + g - 1) / g * g
	}
	return d
}

// handoverTTLs: a lock handed from one owner to the next keeps the new
// owner's own TTL on the store, whatever the previous owner had: from a
// holder with less time left than the next waiter's TTL, between
// goroutines of one client (a Transferer's transfer) and then between
// clients (a Queuer's handover, or a release and the waiter's acquire),
// each waiter with a TTL of its own. Each new owner's lock is still held
// on the store shortly before the owner's deadline.
func (s *suite) handoverTTLs(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	c := s.client(t, lock.WithAutoRenew(false))
	other := s.client(t, lock.WithAutoRenew(false))
	ttlA := 2 * s.short
	// Each next TTL is longer than what its predecessor has left when it
	// releases by more than the slack, so that a lock handed over with
	// the predecessor's expiry is found free at the check.
	ttlB := s.roundTTL(2*s.slack + 2*s.short)
	ttlC := ttlB + s.short
	a, err := c.TryAcquire(ctx, key, lock.WithTTL(ttlA))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	gotB := acquireLater(ctx, t, c, key, lock.WithTTL(ttlB))
	waitWaiting(ctx, t, c, key, 1)
	// A releases with a quarter of its TTL left: waiting out most of it.
	time.Sleep(time.Until(a.Deadline().Add(-ttlA / 4)))
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release of the holder with %v left: %v", time.Until(a.Deadline()), err)
	}
	b := <-gotB
	if b == nil {
		t.FailNow()
	}
	if b.TTL() != ttlB {
		t.Errorf("the waiter's lease has TTL %v; want its own, %v", b.TTL(), ttlB)
	}
	gotC := acquireLater(ctx, t, other, key, lock.WithTTL(ttlC))
	s.heldNearDeadline(ctx, t, b, "the lease handed within a client by a holder with less time left", ownTTL)
	if err := b.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	cl := <-gotC
	if cl == nil {
		t.FailNow()
	}
	if cl.Fence() <= b.Fence() {
		t.Errorf("fence %d after %d; want strictly increasing", cl.Fence(), b.Fence())
	}
	s.heldNearDeadline(ctx, t, cl, "the lease that another client's waiter got from a holder with a shorter TTL", ownTTL)
	if err := cl.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}

const ownTTL = "the store must hold the lock for the new owner's own TTL, not for what its predecessor had left"

// heldNearDeadline waits until the slack before l's deadline and checks
// that the store still holds the lock there: l is not lost, and another
// client's TryAcquire finds the key held.
func (s *suite) heldNearDeadline(ctx context.Context, t *testing.T, l *lock.Lease, what, want string) {
	t.Helper()
	time.Sleep(time.Until(l.Deadline().Add(-s.slack))) // waiting out most of a TTL
	select {
	case <-l.Done():
		t.Fatalf("%s (TTL %v) ended %v before its deadline: %v", what, l.TTL(), time.Until(l.Deadline()), l.Err())
	default:
	}
	o, err := s.client(t).TryAcquire(ctx, l.Key(), lock.WithTTL(s.long))
	if err == nil {
		o.Release(ctx)
		t.Fatalf("%s (TTL %v, fence %d): another client took the key %v before the lease's deadline; %s", what, l.TTL(), l.Fence(), s.slack, want)
	}
	if !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("another client's TryAcquire shortly before the holder's deadline: %v; want ErrLocked", err)
	}
}

// handoverLostOnTheWay: a lock that package lock hands to the next
// goroutine of a client ahead of the store (see HandoverFails) is lost in
// the store while the transfer is on its way: the suite holds the
// transfer until the previous owner's lock has expired there. The new
// lease must end no later than the previous owner's deadline (until the
// transfer lands, the store holds the lock for the previous owner only),
// end lost, and another client then takes the key and keeps it: the
// transfer, and the cleanup after it, must not take it away.
func (s *suite) handoverLostOnTheWay(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	bb := s.backend(t)
	ttl := s.roundTTL(max(4*s.short, 2*s.slack))
	c := s.clientOver(t, bb, lock.WithTTL(ttl), lock.WithAutoRenew(false))
	if c.Capabilities().InProcess {
		t.Log("a store in the process: package lock hands nothing over ahead of it")
		return
	}
	b, gotC := threeInLine(ctx, t, c, key)
	held := make(chan struct{})
	let := make(chan struct{})
	goOn := sync.OnceFunc(func() { close(let) })
	t.Cleanup(goOn)
	intercept(t, bb, interceptors{transfer: func(ctx context.Context, opt backend.TransferOptions) {
		if opt.Fence == 0 {
			return // a transfer that takes a new fence: not ahead of the store
		}
		select {
		case <-held:
			return
		default:
		}
		close(held)
		select {
		case <-let:
		case <-ctx.Done():
		}
	}})
	// B hands the lock on with half its TTL left, so that a lease valid
	// for its own TTL from the handover would outlive B's deadline.
	time.Sleep(time.Until(b.Deadline().Add(-ttl / 2)))
	prev := b.Deadline()
	if err := b.Release(ctx); err != nil { // to C, ahead of the store
		t.Fatalf("Release: %v", err)
	}
	cl := <-gotC
	if cl == nil {
		t.FailNow()
	}
	select {
	case <-held: // the transfer goes out as the next goroutine starts
	case <-time.After(s.slack):
		t.Logf("the lock reached the next goroutine with its transfer, not ahead of the store: nothing to check")
		cl.Release(ctx)
		return
	}
	if cl.Deadline().After(prev) {
		t.Errorf("the lease handed ahead of the store is valid until %v after the previous holder's deadline; the store holds the lock only for the previous holder until the transfer lands", cl.Deadline().Sub(prev))
	}
	select {
	case <-cl.Done():
	case <-time.After(time.Until(prev) + s.slack):
		t.Fatalf("the transfer is held, the previous holder's deadline passed %v ago, and the lease handed ahead of the store is still valid", s.slack)
	}
	if !errors.Is(cl.Err(), lock.ErrLost) {
		t.Errorf("Err of the lease whose transfer never landed: %v; want ErrLost", cl.Err())
	}
	// The previous holder's lock expires in the store: another client
	// takes the key, then the held transfer goes on, and the cleanup after
	// it runs; the other client's lock must stay.
	wctx, cancel := context.WithTimeout(ctx, s.caps.LatestExpiry(ttl)+s.slack)
	defer cancel()
	o, err := s.client(t, lock.WithAutoRenew(false)).Acquire(wctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("another client once the previous holder's lock expired: %v", err)
	}
	goOn()
	if o.Fence() <= cl.Fence() {
		t.Errorf("fence %d after the reserved fence %d; want strictly increasing", o.Fence(), cl.Fence())
	}
	// The transfer and the cleanup of its tokens run in the background:
	// once the lease's client has closed, they are over.
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := o.Renew(ctx); err != nil {
		t.Fatalf("the other client's lease after the held transfer went on: %v; want it still held", err)
	}
	if err := o.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}
