package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/clock"
	"github.com/distlock/lock/memory"
)

// batchProbe is a probe whose backend renews many locks in one request
// (backend.BatchRenewer): it counts the batches, answers ErrNotHeld for
// the key lose, and blocks each batch until unblock is closed when block
// is set.
type batchProbe struct {
	*probe
	batches, largest atomic.Int64
	lose             string
	block            bool
	started, unblock chan struct{}
}

func (p *batchProbe) RenewBatch(ctx context.Context, rs []backend.Renewal) []backend.RenewResult {
	p.batches.Add(1)
	for n := int64(len(rs)); ; {
		m := p.largest.Load()
		if n <= m || p.largest.CompareAndSwap(m, n) {
			break
		}
	}
	if p.block {
		p.started <- struct{}{}
		<-p.unblock
	}
	out := make([]backend.RenewResult, len(rs))
	for i, r := range rs {
		if r.Key == p.lose {
			out[i].Err = backend.ErrNotHeld
			continue
		}
		out[i].Grant, out[i].Err = p.probe.Backend.Renew(ctx, r.Key, r.Token, r.TTL)
	}
	return out
}

func newBatchProbe(t *testing.T, fc *clock.Fake, ttl time.Duration) (*batchProbe, *lock.Client) {
	t.Helper()
	store := memory.NewStore(memory.WithStoreClock(fc))
	p := &batchProbe{probe: &probe{Backend: store.NewBackend(), clock: fc}, started: make(chan struct{}, 16), unblock: make(chan struct{})}
	c, err := lock.New(p, lock.WithClock(fc), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return p, c
}

// Leases that fall due together are renewed in batches of at most 256
// when the backend can (no renewal of its own each); each lease gets its
// own answer: the one the store no longer holds is lost, the others'
// deadlines move on.
func TestDueRenewalsGoInBatches(t *testing.T) {
	const n, ttl = 600, 3 * time.Second
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	p, c := newBatchProbe(t, fc, ttl)
	p.lose = "k7"
	ctx := context.Background()
	ls := make([]*lock.Lease, n)
	for i := range ls {
		l, err := c.TryAcquire(ctx, fmt.Sprint("k", i))
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	first := ls[0].Deadline()
	fc.AdvanceWait(ttl / 3) // every lease is due

	if got := p.renews.Load(); got != 0 {
		t.Errorf("%d renewals went one by one; want all in batches", got)
	}
	if got, want := p.batches.Load(), int64((n+255)/256); got != want {
		t.Errorf("%d batches for %d leases due together; want %d (256 a batch)", got, n, want)
	}
	if got := p.largest.Load(); got > 256 {
		t.Errorf("a batch of %d renewals; want at most 256", got)
	}
	for i, l := range ls {
		if i == 7 {
			if err := l.Err(); !errors.Is(err, lock.ErrLost) {
				t.Errorf("the lease whose renewal the store answered not held: Err %v; want ErrLost", err)
			}
			continue
		}
		if err := l.Err(); err != nil {
			t.Fatalf("lease %d: Err %v after its batch renewed it", i, err)
		}
		if !l.Deadline().After(first) {
			t.Fatalf("lease %d: deadline %v; want it moved past %v", i, l.Deadline(), first)
		}
	}
	for i, l := range ls {
		if err := l.Release(ctx); err != nil && i != 7 {
			t.Errorf("release %d: %v", i, err)
		}
	}
}

// A batch that hangs delays no lease's end: each is lost at its own
// deadline while the batch is in flight, and the batch's late answer does
// not bring it back.
func TestHangingBatchLosesLeasesAtTheirDeadline(t *testing.T) {
	const ttl = 3 * time.Second
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	p, c := newBatchProbe(t, fc, ttl)
	p.block = true
	ctx := context.Background()
	a, err := c.TryAcquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.TryAcquire(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	fc.Advance(ttl / 3) // both due: one batch, which hangs
	select {
	case <-p.started:
	case <-time.After(10 * time.Second):
		close(p.unblock)
		t.Fatal("no batch of renewals started for two leases due together")
	}
	fc.AdvanceWait(ttl) // past both deadlines
	for _, l := range []*lock.Lease{a, b} {
		select {
		case <-l.Done():
		default:
			t.Fatalf("lease %q not ended past its deadline while its renewal hung", l.Key())
		}
		if err := l.Err(); !errors.Is(err, lock.ErrLost) {
			t.Fatalf("lease %q: Err %v; want ErrLost", l.Key(), err)
		}
	}
	close(p.unblock)
	c.Close() // waits for the renewals and the cleanup of what they extended
	for _, l := range []*lock.Lease{a, b} {
		if err := l.Err(); !errors.Is(err, lock.ErrLost) {
			t.Fatalf("lease %q came back to life: Err %v", l.Key(), err)
		}
	}
}
