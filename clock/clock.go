// Package clock is the time source shared by package lock and the memory
// backend. Production code uses Real; tests use a Fake and move time by hand,
// so that lease expiry and lost-lock handling can be tested deterministically,
// without sleeping.
//
// Give the same Fake to the memory backend and to lock.New (lock.WithClock):
// Advance then expires locks on the store and fires client-side deadlines in
// one step.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and schedules callbacks.
//
// Time values from a Clock are only compared with values from the same Clock.
type Clock interface {
	// Now returns the current time. Real returns a value with a monotonic
	// reading, so differences are immune to wall-clock steps.
	Now() time.Time
	// Until returns the duration until t: time.Until for Real, which reads
	// only the monotonic clock and is several times cheaper than Now.
	Until(t time.Time) time.Duration
	// AfterFunc calls f in its own goroutine once d has elapsed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a callback scheduled by AfterFunc.
type Timer interface {
	// Stop prevents the callback from running. It reports whether it did so:
	// false means the callback already ran, is running, or was stopped before.
	Stop() bool
	// Reset schedules the callback to run once more, d from now, whether or
	// not it ran before. A run that had already started is not stopped.
	Reset(d time.Duration) bool
}

// Real is the system's monotonic clock. Its Now reads only the monotonic
// clock (one clock read instead of two) and derives the wall reading from the
// wall time at program start: deadlines are immune to wall-clock steps, and
// a printed time may differ from time.Now by the steps since start.
//
// Real's type is not an interface but an unexported struct: no other clock
// can be assigned to it, so a program (or a test) cannot swap the system
// clock for every user of this package at once; a clock is given to each
// user instead (lock.WithClock, memory.WithStoreClock). Tell it apart with
// IsReal, not by comparing it with Real.
var Real = realClock{}

// IsReal reports whether c is Real: its times are the system's monotonic
// clock, so a context deadline (context.WithDeadline) taken from them
// expires when the clock reaches it.
func IsReal(c Clock) bool {
	_, ok := c.(realClock)
	return ok
}

type realClock struct{}

var realBase = time.Now()

func (realClock) Now() time.Time { return realBase.Add(time.Since(realBase)) }

func (realClock) Until(t time.Time) time.Duration { return time.Until(t) }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Fake is a Clock that moves only when Advance or Set is called. It is safe
// for concurrent use. The zero value is not usable; call NewFake.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*fakeTimer
}

// NewFake returns a Fake clock reading start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start}
}

// Now returns the fake time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Until returns t minus the fake time.
func (c *Fake) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// AfterFunc schedules f to run in its own goroutine when the fake time reaches
// Now()+d. A d <= 0 runs f at once.
func (c *Fake) AfterFunc(d time.Duration, f func()) Timer {
	t := &fakeTimer{c: c, f: f}
	t.Reset(d)
	return t
}

// Advance moves the clock forward by d and runs every callback that falls due,
// in time order, each in its own goroutine. A negative d is ignored: a clock
// does not run backwards.
func (c *Fake) Advance(d time.Duration) {
	if d < 0 {
		return
	}
	c.mu.Lock()
	c.setLocked(c.now.Add(d))
}

// AdvanceWait is Advance, but it returns only after the callbacks that fell
// due have returned. A test then knows that the code they run (an automatic
// renewal, say) has finished before it moves the clock again. A callback that
// blocks makes AdvanceWait block too.
func (c *Fake) AdvanceWait(d time.Duration) {
	if d < 0 {
		return
	}
	c.mu.Lock()
	c.setLocked(c.now.Add(d)).Wait()
}

// Set moves the clock to t if t is later than the current reading.
func (c *Fake) Set(t time.Time) {
	c.mu.Lock()
	if t.Before(c.now) {
		c.mu.Unlock()
		return
	}
	c.setLocked(t)
}

// Pending reports how many callbacks are scheduled and not yet run or stopped.
// Tests use it to wait until the code under test has armed its timers before
// advancing the clock.
func (c *Fake) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// setLocked is called with c.mu held and releases it. The returned group
// is done when the callbacks that fell due have returned.
func (c *Fake) setLocked(t time.Time) *sync.WaitGroup {
	c.now = t
	var due []*fakeTimer
	keep := c.timers[:0]
	for _, tm := range c.timers {
		if !tm.when.After(t) {
			tm.fired = true
			due = append(due, tm)
		} else {
			keep = append(keep, tm)
		}
	}
	for i := len(keep); i < len(c.timers); i++ {
		c.timers[i] = nil
	}
	c.timers = keep
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool {
		if due[i].when.Equal(due[j].when) {
			return due[i].seq < due[j].seq
		}
		return due[i].when.Before(due[j].when)
	})
	var wg sync.WaitGroup
	for _, tm := range due {
		wg.Go(tm.f)
	}
	return &wg
}

type fakeTimer struct {
	c     *Fake
	when  time.Time
	f     func()
	seq   uint64
	fired bool // guarded by c.mu
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	return t.stopLocked()
}

func (t *fakeTimer) stopLocked() bool {
	if t.fired {
		return false
	}
	for i, tm := range t.c.timers {
		if tm == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			t.fired = true
			return true
		}
	}
	return false
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	c := t.c
	c.mu.Lock()
	active := t.stopLocked()
	t.when, t.seq, t.fired = c.now.Add(d), c.seq, false
	c.seq++
	if d <= 0 {
		t.fired = true
		c.mu.Unlock()
		go t.f()
		return active
	}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	return active
}
