package fence

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ruleSteps is one history of offers, run in order against one Guard or
// Table: the rule every helper applies.
var ruleSteps = []struct {
	name     string
	resource string
	fence    uint64
	holder   string
	want     string // "" when accepted, else the ErrStale message
}{
	{"first fence accepted", "r1", 5, "a", ""},
	{"lower fence refused", "r1", 4, "b", `fence: stale fence 4 for "r1": fence 5 was already accepted`},
	{"lower fence from the same holder refused", "r1", 3, "a", `fence: stale fence 3 for "r1": fence 5 was already accepted`},
	{"equal fence from the same holder accepted", "r1", 5, "a", ""},
	{"equal fence from another holder refused", "r1", 5, "b", `fence: stale fence 5 for "r1": fence 5 was already accepted from another holder`},
	{"higher fence accepted", "r1", 6, "b", ""},
	{"the old holder refused after the new one", "r1", 5, "a", `fence: stale fence 5 for "r1": fence 6 was already accepted`},
	{"the new holder writes twice", "r1", 6, "b", ""},
	{"another resource starts afresh", "r2", 1, "c", ""},
	{"the first resource is unchanged by it", "r1", 2, "c", `fence: stale fence 2 for "r1": fence 6 was already accepted`},
	{"the second resource refuses on its own", "r2", 1, "d", `fence: stale fence 1 for "r2": fence 1 was already accepted from another holder`},
	{"a large fence", "r2", math.MaxInt64, "d", ""},
}

// checkOffer compares the outcome of one offer with what ruleSteps wants.
func checkOffer(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("refused: %v; want accepted", err)
	case want != "" && !errors.Is(err, ErrStale):
		t.Fatalf("got %v; want ErrStale", err)
	case want != "" && err.Error() != want:
		t.Fatalf("message %q; want %q", err, want)
	}
}

func TestGuardRule(t *testing.T) {
	var g Guard
	for _, s := range ruleSteps {
		t.Run(s.name, func(t *testing.T) {
			wrote := false
			err := g.Do(s.resource, s.fence, s.holder, func() error { wrote = true; return nil })
			checkOffer(t, err, s.want)
			if wrote != (s.want == "") {
				t.Fatalf("write ran: %v; want %v", wrote, s.want == "")
			}
		})
	}
}

func TestGuardWriteError(t *testing.T) {
	var g Guard
	boom := errors.New("disk full")
	if err := g.Do("r", 3, "a", func() error { return boom }); err != boom {
		t.Fatalf("got %v; want write's error as is", err)
	}
	// The fence stays accepted: an older holder stays out.
	err := g.Do("r", 2, "b", func() error { return nil })
	if !errors.Is(err, ErrStale) {
		t.Fatalf("fence 2 after fence 3's failed write: %v; want ErrStale", err)
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
		{"resource too long", strings.Repeat("r", MaxNameLen+1), 9, "a", ok, "is 1025 bytes long"},
		{"resource not UTF-8", "r\xff", 9, "a", ok, "is not valid UTF-8"},
		{"resource with NUL", "r\x00", 9, "a", ok, "contains a NUL byte"},
		{"empty holder", "r", 9, "", ok, "holder is empty"},
		{"holder too long", "r", 9, strings.Repeat("h", MaxNameLen+1), ok, "holder is 1025 bytes long"},
		{"nil write", "r", 9, "a", nil, "nil write function"},
	}
	var g Guard
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := g.Do(c.resource, c.fence, c.holder, c.write)
			if !errors.Is(err, ErrInvalid) || errors.Is(err, ErrStale) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v; want ErrInvalid saying %q", err, c.want)
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
	if n := len(g.resources); n != 1 {
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
		g        Guard
		next     atomic.Uint64 // fresh fences
		newest   atomic.Uint64 // the highest fence whose write ran
		accepted atomic.Int64
		refused  atomic.Int64
		last     uint64 // guarded by the Guard
		writes   int64  // guarded by the Guard
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
					raise(&newest, f)
				case errors.Is(err, ErrStale):
					refused.Add(1)
				default:
					t.Errorf("fence %d: %v", f, err)
					return
				}
				// A fence below the newest that ran, or equal to it from
				// another holder, is refused whatever else is going on.
				c := newest.Load()
				if c < 2 {
					continue
				}
				f = c - 1
				if r%2 == 1 {
					f = c
				}
				if err := g.Do("account", f, fmt.Sprint("late-", w), write(f)); !errors.Is(err, ErrStale) {
					t.Errorf("fence %d after %d ran: %v; want ErrStale", f, c, err)
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
	var g Guard
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

// raise sets a to f if f is higher.
func raise(a *atomic.Uint64, f uint64) {
	for {
		old := a.Load()
		if f <= old || a.CompareAndSwap(old, f) {
			return
		}
	}
}
