package conformance

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// transfers reports whether the store's backend implements
// backend.Transferer; the Transfer case runs only then.
func (s *suite) transfers(t *testing.T) bool {
	b := s.backend(t)
	defer b.Close()
	_, ok := b.(backend.Transferer)
	return ok
}

// transfer checks the backend.Transferer contract directly on the store:
// fences, reserved fences, refusal when an owner elsewhere waits, and no
// change on a refused or misaddressed transfer.
func (s *suite) transfer(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	b := s.backend(t)
	defer b.Close()
	tr := b.(backend.Transferer)
	other := s.backend(t) // another process
	defer other.Close()
	ttl := s.long

	// Tokens shaped as package lock makes them (32 hexadecimal digits),
	// named by a letter in the messages.
	tok := map[string]string{}
	for _, name := range "abcdepqrswxy" {
		var r [16]byte
		crand.Read(r[:])
		tok[string(name)] = hex.EncodeToString(r[:])
	}
	holds := func(name string) {
		t.Helper()
		if _, err := b.Renew(ctx, key, tok[name], ttl); err != nil {
			t.Fatalf("renew by %s, which should hold the key: %v", name, err)
		}
	}
	g, err := b.Acquire(ctx, key, tok["a"], ttl)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}

	// A transfer from a token that does not hold the key changes nothing.
	if _, err := tr.Transfer(ctx, key, tok["x"], tok["y"], ttl, backend.TransferOptions{}); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("transfer from a token that does not hold the key: %v; want ErrNotHeld", err)
	}
	holds("a")

	// A plain transfer takes a new fence and can reserve the next one.
	ab, err := tr.Transfer(ctx, key, tok["a"], tok["b"], ttl, backend.TransferOptions{Reserve: true})
	if err != nil {
		t.Fatalf("transfer a to b: %v", err)
	}
	if ab.Fence <= g.Fence || ab.Next <= ab.Fence {
		t.Fatalf("transfer a to b: fence %d, next %d after fence %d; want fence > %d and next > fence", ab.Fence, ab.Next, g.Fence, g.Fence)
	}
	holds("b")
	if in, ok := b.(backend.Inspector); ok {
		// The reservation does not change the holder's fence.
		if h, err := in.Inspect(ctx, key); err != nil || !h.Held || h.Fence != ab.Fence {
			t.Fatalf("Inspect after a transfer that reserved the next fence: %+v, %v; want held with fence %d", h, err, ab.Fence)
		}
	}
	if _, err := b.Renew(ctx, key, tok["a"], ttl); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("renew by the previous owner after a transfer: %v; want ErrNotHeld", err)
	}
	// Nor with a reserved fence may a token that does not hold the key
	// transfer it.
	if _, err := tr.Transfer(ctx, key, tok["x"], tok["y"], ttl, backend.TransferOptions{Fence: ab.Next}); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("transfer with a reserved fence from a token that does not hold the key: %v; want ErrNotHeld", err)
	}
	holds("b")
	// The same transfer sent again (a retry after a lost reply) succeeds
	// without reserving anything; to's fence stays between its neighbours.
	again, err := tr.Transfer(ctx, key, tok["a"], tok["b"], ttl, backend.TransferOptions{Reserve: true})
	if err != nil {
		t.Fatalf("transfer a to b sent again: %v; want it to report the transfer that took effect", err)
	}
	if again.Fence != ab.Fence || again.Next != 0 {
		t.Fatalf("transfer a to b sent again: fence %d, next %d; want fence %d, next 0", again.Fence, again.Next, ab.Fence)
	}
	holds("b")

	// A transfer with the reserved fence gives exactly that fence.
	bc, err := tr.Transfer(ctx, key, tok["b"], tok["c"], ttl, backend.TransferOptions{Fence: ab.Next, Reserve: true})
	if err != nil {
		t.Fatalf("transfer b to c with the reserved fence: %v", err)
	}
	if bc.Fence != ab.Next || bc.Next <= bc.Fence {
		t.Fatalf("transfer b to c with fence %d reserved: got fence %d, next %d", ab.Next, bc.Fence, bc.Next)
	}
	holds("c")
	if again, err := tr.Transfer(ctx, key, tok["b"], tok["c"], ttl, backend.TransferOptions{Fence: ab.Next, Reserve: true}); err != nil || again.Fence != ab.Next || again.Next != 0 {
		t.Fatalf("transfer b to c with fence %d sent again: fence %d, next %d, %v; want fence %d, next 0", ab.Next, again.Fence, again.Next, err, ab.Next)
	}

	// An owner elsewhere asks for the key: a plain transfer is refused and
	// changes nothing; one with a reserved fence goes ahead but reserves
	// nothing more, so that the lock goes back to the store next.
	var locked *backend.LockedError
	if _, err := other.Acquire(ctx, key, tok["w"], ttl); !errors.As(err, &locked) && !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("acquire by another owner while c holds the key: %v; want a LockedError", err)
	}
	if _, err := tr.Transfer(ctx, key, tok["c"], tok["d"], ttl, backend.TransferOptions{Reserve: true}); !errors.Is(err, backend.ErrTransferRefused) {
		t.Fatalf("plain transfer while another owner waits: %v; want ErrTransferRefused", err)
	}
	holds("c")
	cd, err := tr.Transfer(ctx, key, tok["c"], tok["d"], ttl, backend.TransferOptions{Fence: bc.Next, Reserve: true})
	if err != nil {
		t.Fatalf("transfer c to d with the reserved fence while another owner waits: %v", err)
	}
	if cd.Fence != bc.Next || cd.Next != 0 {
		t.Fatalf("transfer c to d with fence %d reserved while another owner waits: got fence %d, next %d; want next 0", bc.Next, cd.Fence, cd.Next)
	}
	holds("d")
	// The owner elsewhere is still known: the next plain transfer is
	// refused too.
	if _, err := tr.Transfer(ctx, key, tok["d"], tok["e"], ttl, backend.TransferOptions{Reserve: true}); !errors.Is(err, backend.ErrTransferRefused) {
		t.Fatalf("plain transfer after a reserved one while another owner still waits: %v; want ErrTransferRefused", err)
	}
	holds("d")

	// The waiter gets the key after d's release, with a fence above all.
	if err := b.Release(ctx, key, tok["d"]); err != nil {
		t.Fatalf("release by d: %v", err)
	}
	w, err := other.Acquire(ctx, key, tok["w"], ttl)
	if err != nil {
		t.Fatalf("acquire by the waiting owner after the release: %v", err)
	}
	if w.Fence <= cd.Fence || w.Fence <= bc.Next {
		t.Fatalf("fence %d after the transfers (last fence %d, reserved %d); want above both", w.Fence, cd.Fence, bc.Next)
	}
	if err := other.Release(ctx, key, tok["w"]); err != nil {
		t.Fatalf("release by the waiter: %v", err)
	}

	// A transfer sets the new owner's TTL from now, whatever was left of
	// the old one's.
	if _, err := b.Acquire(ctx, key, tok["p"], s.short); err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if _, err := tr.Transfer(ctx, key, tok["p"], tok["q"], s.long, backend.TransferOptions{}); err != nil {
		t.Fatalf("transfer p to q: %v", err)
	}
	s.waitOutExpiry(s.short)
	holds("q")
	if err := b.Release(ctx, key, tok["q"]); err != nil {
		t.Fatalf("release by q: %v", err)
	}

	// A transfer sent again once to's lock has ended (a copy that waited
	// on the wire longer than to's TTL, or one that a client library sent
	// after a lost reply, late): from held the lock until it handed it
	// on, so the copy must not answer ErrNotHeld, which would make from's
	// Release report a lease held until its release as lost; and from's
	// release succeeds, as after a release that took effect.
	if _, err := b.Acquire(ctx, key, tok["r"], s.long); err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if _, err := tr.Transfer(ctx, key, tok["r"], tok["s"], s.short, backend.TransferOptions{}); err != nil {
		t.Fatalf("transfer r to s: %v", err)
	}
	s.waitOutExpiry(s.short)
	if _, err := tr.Transfer(ctx, key, tok["r"], tok["s"], s.short, backend.TransferOptions{}); err == nil || errors.Is(err, backend.ErrNotHeld) || errors.Is(err, backend.ErrTransferRefused) {
		t.Fatalf("transfer r to s sent again after s's lock expired: %v; want an error that is neither ErrNotHeld nor ErrTransferRefused (r handed the lock on)", err)
	}
	if err := b.Release(ctx, key, tok["r"]); err != nil {
		t.Fatalf("release by r after it handed the lock on: %v; want nil", err)
	}
}

// handoverFails: on a store that transfers locks, goroutines of one client
// hand the key over ahead of the store; when a handover's reply is lost
// (its outcome unknown), the goroutine that started under it is told at
// once that it lost the lock, and the key is freed for others.
func (s *suite) handoverFails(t *testing.T) {
	rh := s.replyHolder(t)
	ctx := s.ctx(t)
	bb := s.backend(t)
	c := s.clientOver(t, bb, lock.WithTTL(s.long))
	if c.Capabilities().InProcess {
		t.Log("a store in the process: package lock hands nothing over ahead of it")
		return
	}
	s.warmUp(ctx, t, c)
	// A client library may send the transfer again, and it may then land
	// after all: the lease carries on, which is right, but tests nothing.
	// Try again, on a fresh key, a few times.
	const attempts = 3
	for range attempts {
		if s.handoverFailsOnce(ctx, t, rh, bb, c) {
			return
		}
	}
	t.Logf("the handover landed after all in each of %d attempts: the lost-handover path was not reached", attempts)
}

// threeInLine makes three goroutines of c take key in turn: the first
// holds it, the second and the third wait, and the first releases. It
// returns the second's lease, which the first's transfer brought with a
// fence reserved for the third, so that the second's release hands the
// lock to the third ahead of the store, and the channel of the third's.
func threeInLine(ctx context.Context, t *testing.T, c *lock.Client, key string) (*lock.Lease, <-chan *lock.Lease) {
	t.Helper()
	a, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	gotB := acquireLater(ctx, t, c, key)
	waitWaiting(ctx, t, c, key, 1)
	gotC := acquireLater(ctx, t, c, key)
	waitWaiting(ctx, t, c, key, 2)
	if err := a.Release(ctx); err != nil { // to B, reserving C's fence
		t.Fatalf("Release: %v", err)
	}
	b := <-gotB
	if b == nil {
		t.FailNow()
	}
	return b, gotC
}

// handoverFailsOnce is one attempt of handoverFails; it reports whether
// the handover's loss was seen (false: it landed after all).
func (s *suite) handoverFailsOnce(ctx context.Context, t *testing.T, rh ReplyHolder, bb backend.Backend, c *lock.Client) bool {
	key := s.key(t)
	b, gotC := threeInLine(ctx, t, c, key)
	replies(ctx, t, rh, bb).hold()
	if err := b.Release(ctx); err != nil { // to C, ahead of the store
		t.Fatalf("Release: %v", err)
	}
	cl := <-gotC
	if cl == nil {
		t.FailNow()
	}
	done := cl.Done()
	replies(ctx, t, rh, bb).drop()
	dropped := time.Now()
	select {
	case <-done:
	case <-time.After(s.slack + time.Second):
		if err := cl.Renew(ctx); err == nil {
			cl.Release(ctx)
			return false
		}
		t.Fatalf("the handover's reply was lost %v ago, and the lease it started is neither lost nor renewable", time.Since(dropped))
	}
	if !errors.Is(cl.Err(), lock.ErrLost) {
		t.Errorf("Err after a lost handover: %v; want ErrLost", cl.Err())
	}
	// Both tokens are released: another client takes the key well before
	// the TTL.
	wctx, cancel := context.WithTimeout(ctx, s.long/2)
	defer cancel()
	o, err := s.client(t).Acquire(wctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("another client after a lost handover: %v; want the key freed", err)
	}
	if o.Fence() <= cl.Fence() {
		t.Errorf("fence %d after %d", o.Fence(), cl.Fence())
	}
	o.Release(ctx)
	return true
}
