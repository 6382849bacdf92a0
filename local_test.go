package lock

import (
	"context"
	"testing"
	"time"
)

// A turn passes at most once, from its last holder: a holder that handed it
// on, or passes it twice, never gives a second goroutine the key's turn
// while the first has it.
func TestTurnPassesOnce(t *testing.T) {
	var q localQueue
	acquisition := q.tryTurn("k")
	if acquisition == nil {
		t.Fatal("tryTurn on a free key: no turn")
	}
	if q.tryTurn("k") != nil {
		t.Fatal("tryTurn took a turn that was taken")
	}

	// Two goroutines wait for the turn.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan *turn, 2)
	for range 2 {
		go func() {
			tn, _, _ := q.waitTurn(ctx, "k", nil, func() (string, error) { return newToken(), nil })
			got <- tn
		}()
	}
	waitFor(t, "two waiters", func() bool { return q.waiting("k") == 2 })

	// The acquisition hands the turn on to its lease; its own pass, as in
	// its deferred call, does nothing after that.
	lease := acquisition.handOn()
	if lease == nil {
		t.Fatal("handOn of a held turn: no turn")
	}
	acquisition.pass()
	if acquisition.handOn() != nil {
		t.Fatal("a turn was handed on twice")
	}
	if n := q.waiting("k"); n != 2 {
		t.Fatalf("%d waiters after a spent turn's pass; want 2: the turn went to a waiter while the lease held it", n)
	}

	// The lease ends: lost, then released; the turn passes once.
	lease.pass()
	lease.pass()
	first := <-got
	if first == nil {
		t.Fatal("the first waiter got no turn")
	}
	if n := q.waiting("k"); n != 1 {
		t.Fatalf("%d waiters after the lease passed its turn twice; want 1", n)
	}
	first.pass()
	if second := <-got; second == nil {
		t.Fatal("the second waiter got no turn")
	} else {
		second.pass()
	}
	if tn := q.tryTurn("k"); tn == nil {
		t.Fatal("the key's turn is still taken after every holder passed it")
	} else {
		tn.pass()
	}

	var none *turn // an in-process store's: no turn
	none.pass()
	if none.handOn() != nil {
		t.Fatal("handOn of no turn made one")
	}
}

// waitFor waits, in real time, for cond, which other goroutines make true.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}
