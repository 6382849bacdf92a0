package clock_test

import (
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock/clock"
)

func TestFakeRunsDueCallbacksInOrder(t *testing.T) {
	start := time.Unix(0, 0)
	c := clock.NewFake(start)
	var mu sync.Mutex
	var got []int
	record := func(i int) func() {
		return func() { mu.Lock(); got = append(got, i); mu.Unlock() }
	}
	c.AfterFunc(30*time.Millisecond, record(3))
	c.AfterFunc(10*time.Millisecond, record(1))
	stopped := c.AfterFunc(20*time.Millisecond, record(2))
	if !stopped.Stop() {
		t.Fatal("Stop of a pending timer returned false")
	}
	if stopped.Stop() {
		t.Fatal("second Stop returned true")
	}
	c.AdvanceWait(9 * time.Millisecond)
	if len(got) != 0 {
		t.Fatalf("callbacks ran early: %v", got)
	}
	c.AdvanceWait(time.Millisecond)
	c.AdvanceWait(25 * time.Millisecond)
	if len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Fatalf("ran %v; want [1 3]", got)
	}
	if c.Pending() != 0 {
		t.Fatalf("%d timers pending after all fired", c.Pending())
	}
	if want := start.Add(35 * time.Millisecond); !c.Now().Equal(want) {
		t.Fatalf("Now %v; want %v", c.Now(), want)
	}
	if d := c.Until(start.Add(40 * time.Millisecond)); d != 5*time.Millisecond {
		t.Fatalf("Until %v; want 5ms", d)
	}
}

func TestFakeNeverRunsBackwards(t *testing.T) {
	start := time.Unix(100, 0)
	c := clock.NewFake(start)
	c.Advance(-time.Second)
	c.Set(start.Add(-time.Second))
	if !c.Now().Equal(start) {
		t.Fatalf("clock moved backwards to %v", c.Now())
	}
	c.Set(start.Add(time.Second))
	if !c.Now().Equal(start.Add(time.Second)) {
		t.Fatal("Set forwards ignored")
	}
}

func TestFakeResetReschedules(t *testing.T) {
	c := clock.NewFake(time.Unix(0, 0))
	fired := make(chan struct{}, 2)
	tm := c.AfterFunc(time.Second, func() { fired <- struct{}{} })
	if !tm.Reset(2 * time.Second) {
		t.Fatal("Reset of a pending timer returned false")
	}
	c.AdvanceWait(time.Second)
	if len(fired) != 0 {
		t.Fatal("fired at the old time")
	}
	c.AdvanceWait(time.Second)
	if len(fired) != 1 {
		t.Fatal("did not fire at the new time")
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a fired timer returned true")
	}
	c.AdvanceWait(time.Second)
	if len(fired) != 2 {
		t.Fatal("a fired timer did not run again after Reset")
	}
}

func TestRealClockIsMonotonic(t *testing.T) {
	a := clock.Real.Now()
	b := clock.Real.Now()
	if b.Before(a) {
		t.Fatal("Real clock ran backwards")
	}
	if d := clock.Real.Until(a); d > 0 {
		t.Fatalf("Until of a past time is %v", d)
	}
	done := make(chan struct{})
	clock.Real.AfterFunc(time.Millisecond, func() { close(done) })
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Real AfterFunc did not fire")
	}
}

// Real cannot be replaced by another clock: its variable's type is not an
// interface. IsReal tells it apart from other clocks by type.
func TestRealIsNotReplaceable(t *testing.T) {
	if k := reflect.TypeOf(&clock.Real).Elem().Kind(); k == reflect.Interface {
		t.Fatalf("clock.Real is a variable of interface type: any clock can be assigned to it")
	}
	var c clock.Clock = clock.Real
	if !clock.IsReal(c) {
		t.Error("IsReal(clock.Real) = false")
	}
	if clock.IsReal(clock.NewFake(time.Now())) {
		t.Error("IsReal(a fake clock) = true")
	}
}
