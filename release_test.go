package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
)

// transferReplyLost is a memory client across a network: its transfers
// take effect, and their replies are lost.
type transferReplyLost struct{ *memory.Backend }

var errReplyLost = errors.New("the reply was lost (outcome unknown)")

func (b transferReplyLost) Transfer(ctx context.Context, key, from, to string, ttl time.Duration, opt backend.TransferOptions) (backend.Transferred, error) {
	if _, err := b.Backend.Transfer(ctx, key, from, to, ttl, opt); err != nil {
		return backend.Transferred{}, err
	}
	return backend.Transferred{}, errReplyLost
}

func (b transferReplyLost) Capabilities() backend.Capabilities {
	caps := b.Backend.Capabilities()
	caps.InProcess = false // the paths of a networked store
	return caps
}

// A release whose handover to a waiting goroutine had an unknown outcome
// (the transfer took effect, its reply was lost) then finds its token no
// longer holding the lock: the transfer moved it. That is no loss, and
// Release must not report one (it did: "lease lost: the store no longer
// held it at release", for a lease valid to its release).
func TestReleaseAfterUnknownHandoverIsNoLoss(t *testing.T) {
	store := memory.NewStore()
	c, err := lock.New(transferReplyLost{store.NewBackend()}, lock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	a, err := c.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := c.Acquire(ctx, "k")
		if l != nil {
			l.Release(ctx)
		}
		got <- err
	}()
	until(t, "the second goroutine waiting", func() bool { return c.Waiting("k") == 1 })
	if err := a.Release(ctx); err != nil {
		t.Errorf("Release after a handover of unknown outcome: %v; want nil (the lease was held to its release)", err)
	}
	if err := <-got; err != nil {
		t.Errorf("the waiting Acquire: %v; want the lock, from the store", err)
	}
}
