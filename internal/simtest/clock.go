package simtest

import (
	"time"

	"github.com/distlock/lock/clock"
)

// clientClock is a client's clock: package lock measures its leases on it,
// and the checkers convert its readings to true (virtual) time.
type clientClock interface {
	clock.Clock
	// True converts a reading of this clock to true time.
	True(t time.Time) time.Time
	// Rate is how fast the clock runs against true time.
	Rate() float64
}

// trueClock is clock.Real: in a synctest bubble, the bubble's virtual time.
type trueClock struct{ clock.Clock }

func (trueClock) True(t time.Time) time.Time { return t }
func (trueClock) Rate() float64              { return 1 }

// skewed is a clock that runs at rate times true time, from when it was
// made: a client whose clock drifts. Package lock's drift allowance (1% of
// the TTL plus 2ms by default) covers a clock slower than true time by up
// to that share of the TTL; a slower one makes leases outlive the store's
// expiry.
type skewed struct {
	base time.Time
	rate float64
}

func newSkewed(rate float64) *skewed { return &skewed{base: time.Now(), rate: rate} }

func (c *skewed) Now() time.Time {
	return c.base.Add(time.Duration(float64(time.Since(c.base)) * c.rate))
}

func (c *skewed) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// truly returns the true duration in which this clock advances d, rounded
// up: a timer set for d has fired no earlier than d on this clock.
func (c *skewed) truly(d time.Duration) time.Duration {
	t := time.Duration(float64(d) / c.rate)
	if time.Duration(float64(t)*c.rate) < d {
		t++
	}
	return t
}

func (c *skewed) AfterFunc(d time.Duration, f func()) clock.Timer {
	return &skewTimer{c: c, t: time.AfterFunc(c.truly(d), f)}
}

func (c *skewed) True(t time.Time) time.Time { return c.base.Add(c.truly(t.Sub(c.base))) }
func (c *skewed) Rate() float64              { return c.rate }

type skewTimer struct {
	c *skewed
	t *time.Timer
}

func (t *skewTimer) Stop() bool                 { return t.t.Stop() }
func (t *skewTimer) Reset(d time.Duration) bool { return t.t.Reset(t.c.truly(d)) }
