package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/fence"
	"github.com/distlock/lock/internal/fencerule"
)

func TestGuardWriteError(t *testing.T) {
	var g fence.Guard
	boom := errors.New("disk full")
	if err := g.Do("r", 3, "a", func() error { return boom }); err != boom {
		t.Fatalf("got %v; want write's error as is", err)
	}
	// The fence stays accepted: an older holder stays out.
	err := g.Do("r", 2, "b", func() error { return nil })
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("fence 2 after fence 3's failed write: %v; want fence.ErrStale", err)
	}
}

func TestGuardBadInput(t *testing.T) {
	ok := func() error { return nil }
	cases := []struct {
		name     string
		resource string
		fence    uint64
		holder   string
		write    func() error
		want     string
	}{
		{"fence 0", "r", 0, "a", ok, "fences start at 1"},
		{"empty resource", "", 9, "a", ok, "resource is empty"},
		{"resource too long", strings.Repeat("r", fence.MaxNameLen+1), 9, "a", ok, "is 1025 bytes long"},
		{"resource not UTF-8", "r\xff", 9, "a", ok, "is not valid UTF-8"},
		{"resource with NUL", "r\x00", 9, "a", ok, "contains a NUL byte"},
		{"empty holder", "r", 9, "", ok, "holder is empty"},
		{"holder too long", "r", 9, strings.Repeat("h", fence.MaxNameLen+1), ok, "holder is 1025 bytes long"},
		{"nil write", "r", 9, "a", nil, "nil write function"},
	}
	var g fence.Guard
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := g.Do(c.resource, c.fence, c.holder, c.write)
			if !errors.Is(err, fence.ErrInvalid) || errors.Is(err, fence.ErrStale) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v; want fence.ErrInvalid saying %q", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "fence: invalid input: ") {
				t.Fatalf("message %q does not start with the package's prefix", err)
			}
		})
	}
	// Nothing was recorded: fence 9 was never accepted for "r".
	if err := g.Do("r", 1, "a", ok); err != nil {
		t.Fatalf("fence 1 after bad input: %v; want accepted", err)
	}
	if n := fence.Resources(&g); n != 1 {
		t.Fatalf("the guard holds %d resources; want 1", n)
	}
}

// TestGuardConcurrent races goroutines offering fresh fences (in the order
// they draw them, not the order they arrive) and fences known to be stale.
// The write keeps its state in plain variables: the race detector fails
// the test if two writes to one resource overlap.
func TestGuardConcurrent(t *testing.T) {
	const workers, rounds = 8, 300
	var (
		g        fence.Guard
		next     atomic.Uint64 // fresh fences
		newest   atomic.Uint64 // the highest fence whose write ran
		accepted atomic.Int64
		refused  atomic.Int64
		last     uint64 // guarded by the fence.Guard
		writes   int64  // guarded by the fence.Guard
		lost     int64  // writes whose fence was lower than the previous write's
	)
	write := func(f uint64) func() error {
		return func() error {
			if f < last {
				lost++
			}
			last = f
			writes++
			return nil
		}
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				f := next.Add(1)
				switch err := g.Do("account", f, fmt.Sprint("lease-", f), write(f)); {
				case err == nil:
					accepted.Add(1)
					fencerule.Raise(&newest, f)
				case errors.Is(err, fence.ErrStale):
					refused.Add(1)
				default:
					t.Errorf("fence %d: %v", f, err)
					return
				}
				// A fence below the newest that ran, or equal to it from
				// another holder, is refused whatever else is going on.
				f, ok := fencerule.Stale(&newest, r)
				if !ok {
					continue
				}
				if err := g.Do("account", f, fmt.Sprint("late-", w), write(f)); !errors.Is(err, fence.ErrStale) {
					t.Errorf("fence %d after %d ran: %v; want fence.ErrStale", f, newest.Load(), err)
					return
				}
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if lost != 0 {
		t.Errorf("%d writes ran after a newer fence's", lost)
	}
	if writes != accepted.Load() || last != newest.Load() {
		t.Errorf("%d writes, last fence %d; want %d writes, last fence %d", writes, last, accepted.Load(), newest.Load())
	}
	t.Logf("%d accepted, %d refused", accepted.Load(), refused.Load())
}

// TestGuardResourcesIndependent: a write in progress on one resource holds
// up only that resource.
func TestGuardResourcesIndependent(t *testing.T) {
	var g fence.Guard
	inA, releaseA, doneA := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		doneA <- g.Do("a", 1, "h", func() error { close(inA); <-releaseA; return nil })
	}()
	<-inA
	doneB := make(chan error, 1)
	go func() { doneB <- g.Do("b", 1, "h", func() error { return nil }) }()
	select {
	case err := <-doneB:
		if err != nil {
			t.Errorf("resource b: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("resource b waited for a write to resource a")
		close(releaseA)
		<-doneA
		<-doneB
		return
	}
	close(releaseA)
	if err := <-doneA; err != nil {
		t.Errorf("resource a: %v", err)
	}
}

// TestGuardRule runs the rule's history against a Guard; the SQL tables
// answer the same history in internal/sqltest/fencesql.
func TestGuardRule(t *testing.T) {
	var g fence.Guard
	for _, s := range fencerule.Steps {
		t.Run(s.Name, func(t *testing.T) {
			wrote := false
			err := g.Do(s.Resource, s.Fence, s.Holder, func() error { wrote = true; return nil })
			fencerule.Check(t, err, s.Want)
			if wrote != (s.Want == "") {
				t.Fatalf("write ran: %v; want %v", wrote, s.Want == "")
			}
		})
	}
}

// DoLease and ApplyLease refuse a nil lease, untyped or typed, with
// ErrInvalid and record nothing.
func TestLeaseHelpersRefuseNil(t *testing.T) {
	var g fence.Guard
	ok := func() error { return nil }
	var typed *lock.Lease
	for _, l := range []fence.Holder{nil, typed} {
		if err := g.DoLease("r", l, ok); !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), "nil lease") {
			t.Errorf("DoLease(%#v): %v; want ErrInvalid saying nil lease", l, err)
		}
		tbl, err := fence.NewTable(fence.SQLite, "fences")
		if err != nil {
			t.Fatal(err)
		}
		if err := tbl.ApplyLease(context.Background(), nil, "r", l); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("ApplyLease(%#v): %v; want ErrInvalid", l, err)
		}
	}
	if n := fence.Resources(&g); n != 0 {
		t.Errorf("the guard holds %d resources after the refusals; want 0", n)
	}
}
