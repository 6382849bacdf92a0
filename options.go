package lock

import (
	"log/slog"
	"time"

	"github.com/distlock/lock/clock"
)

// Defaults of the options.
const (
	// DefaultTTL is the lease TTL when WithTTL is not given.
	DefaultTTL = 10 * time.Second
	// DefaultMinBackoff and DefaultMaxBackoff bound the waits between
	// attempts of Acquire when the backend offers no wake-up.
	DefaultMinBackoff = 2 * time.Millisecond
	DefaultMaxBackoff = 500 * time.Millisecond
	// MaxKeyLen is the longest key in bytes.
	MaxKeyLen = 512
)

// Option configures a Client (passed to New or Open: the client's defaults)
// or one acquisition (passed to TryAcquire, Acquire or Do: overrides the
// defaults for that call). An option given a value outside its valid range
// makes the call fail with ErrInvalidOption and change nothing.
type Option func(*config)

type config struct {
	ttl        time.Duration
	drift      time.Duration // < 0: default formula
	autoRenew  bool
	maxHold    time.Duration
	wait       time.Duration // WithWait; 0: until ctx ends
	minBackoff time.Duration
	maxBackoff time.Duration
	clock      clock.Clock
	clockID    int // counts WithClock options applied, to tell a call's own clock
	epoch      uint64
	epochSet   bool // WithFenceEpoch was given (a Client option only)
	observer   Observer
	logger     *slog.Logger
	observerID int    // counts WithObserver and WithLogger options applied (Client options only)
	holder     string // WithHolder's, or DefaultHolder()
	holderSet  bool   // WithHolder was given
	err        error  // the first invalid option
}

func defaultConfig() config {
	return config{
		ttl:        DefaultTTL,
		drift:      -1,
		autoRenew:  true,
		minBackoff: DefaultMinBackoff,
		maxBackoff: DefaultMaxBackoff,
		clock:      clock.Real,
	}
}

func (c *config) fail(format string, args ...any) {
	if c.err == nil {
		c.err = invalid(ErrInvalidOption, format, args...)
	}
}

// driftFor returns the validity margin subtracted from a lease's TTL.
func (c *config) driftFor(ttl time.Duration) time.Duration {
	if c.drift >= 0 {
		return c.drift
	}
	return DefaultDrift(ttl)
}

// DefaultDrift is the clock-drift allowance used unless WithDrift is given:
// 1% of the TTL plus 2ms, the value of the Redlock reference design.
func DefaultDrift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// MaxTTL is the longest TTL package lock accepts, on every backend (a
// backend may accept less: Capabilities.MaxTTL). A lock whose holder
// crashed blocks its key for the TTL, and a lease is kept alive by
// renewal, not by a long TTL; past a year, a TTL is a mistake (a unit
// typed wrong), and near time.Duration's limit the stores' own arithmetic
// overflows (a Redis expiry in the past, an etcd lease of 1s).
const MaxTTL = 365 * 24 * time.Hour

// DefaultMaxTTL is the default maximum TTL of every backend of this
// module (Capabilities.MaxTTL; each backend's WithMaxTTL option and URL
// parameter maxttl set another, up to MaxTTL). It is the longest a key
// stays blocked by a holder that crashed, or by a waiter killed while
// queued that the store hands the lock to: a TTL typed as 1h instead of
// 1m would otherwise keep everyone out for an hour after such a crash. A
// lease lives longer than its TTL by renewal (auto-renew), so a minute
// bounds the damage without bounding the work. Redlock needs a maximum
// for another reason too: a node that comes back empty waits it out
// before it votes again.
const DefaultMaxTTL = time.Minute

// WithTTL sets how long the store keeps a lock without renewal. Valid: > 0,
// at most MaxTTL, within the backend's minimum and maximum, and longer
// than the drift allowance.
func WithTTL(ttl time.Duration) Option {
	return func(c *config) {
		if ttl <= 0 || ttl > MaxTTL {
			if c.err == nil {
				c.err = invalid(ErrInvalidTTL, "WithTTL(%v): the TTL must be > 0 and at most %v (MaxTTL)", ttl, MaxTTL)
			}
			return
		}
		c.ttl = ttl
	}
}

// WithDrift sets the validity margin: a lease counts as lost at
// sent + TTL - drift, where sent is when the acquire or renew request was
// sent, measured on the monotonic clock. It covers clock-rate differences
// between client and store. Valid: >= 0 and shorter than the TTL. Default:
// DefaultDrift(ttl).
func WithDrift(drift time.Duration) Option {
	return func(c *config) {
		if drift < 0 {
			c.fail("WithDrift(%v): the drift must be >= 0", drift)
			return
		}
		c.drift = drift
	}
}

// WithAutoRenew turns the watchdog on (the default) or off. The watchdog
// renews the lease about every TTL/3, retries failed renewals while the lease
// is still valid, and never re-acquires a lost lock.
func WithAutoRenew(on bool) Option {
	return func(c *config) { c.autoRenew = on }
}

// WithMaxHold caps how long the watchdog keeps a lease alive: it makes no
// renewal that would carry the lease past max after acquisition, so the lease
// is lost (ErrLost) by then at the latest. Explicit Renew calls are not
// capped. Valid: >= 0; 0 means no cap (the default).
func WithMaxHold(max time.Duration) Option {
	return func(c *config) {
		if max < 0 {
			c.fail("WithMaxHold(%v): the maximum hold time must be >= 0 (0 means no cap)", max)
			return
		}
		c.maxHold = max
	}
}

// WithWait bounds how long TryAcquire, Acquire, TryDo and Do try to take
// the key: once d has passed since the call began, they give up as they
// do when their ctx ends (an error wrapping context.DeadlineExceeded, and
// ErrLocked when the key was held), and leave nothing behind on the
// store. It ends only the waiting: the lease, and the section that Do and
// TryDo run, are not bound by it (the section's context is the caller's
// ctx, cancelled at the loss of the lease). Measured on the real clock.
// Valid: >= 0; 0 means no bound but ctx's (the default).
func WithWait(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.fail("WithWait(%v): the wait bound must be >= 0 (0 means no bound but the context's)", d)
			return
		}
		c.wait = d
	}
}

// WithBackoff bounds the jittered exponential wait between attempts of
// Acquire on backends without a wake-up. A wait never exceeds the holder's
// remaining TTL when the backend reports it. Valid: 0 < min <= max.
func WithBackoff(min, max time.Duration) Option {
	return func(c *config) {
		if min <= 0 || max < min {
			c.fail("WithBackoff(%v, %v): need 0 < min <= max", min, max)
			return
		}
		c.minBackoff, c.maxBackoff = min, max
	}
}

// FenceEpochShift and MaxFenceEpoch place a fence epoch (WithFenceEpoch)
// in the top bits of a fence: a lease's Fence is epoch<<FenceEpochShift |
// the store's fence. With MaxFenceEpoch at 127 every such fence stays below
// 2^63, so a resource can keep it in a signed 64-bit column (fence.Table's
// BIGINT) as well as in a uint64.
const (
	FenceEpochShift = 56
	MaxFenceEpoch   = 127
)

// WithFenceEpoch sets the Client's fence epoch, for moving a running
// deployment from one store to another (README, "Migrating between
// backends"): fences of two stores do not bound each other (a Redis key's
// counter may be at 10^8 while etcd's revision is at 10^3), so each phase
// of the move that takes its fences from another store uses a higher
// epoch. A lease's Fence is then epoch<<FenceEpochShift | the store's
// fence: every fence of a later epoch is greater than every fence of an
// earlier one, whatever the stores' own values, and within an epoch fences
// keep the store's order.
//
// A store fence of 2^FenceEpochShift or more cannot be placed under an
// epoch: with WithFenceEpoch, a grant with one is refused as a broken
// contract (ErrBackendContract; its token is released). Every Client of a
// deployment that moves between stores sets an epoch, 0 on the first store
// included, so that no fence above 2^56 slips through unchecked. It is a
// Client option (lock.New): given to an Acquire, it is refused. Valid: 0 to
// MaxFenceEpoch, given once (or again with the same value): package
// migrate's phases set it, and a different epoch beside them is an error.
func WithFenceEpoch(epoch uint64) Option {
	return func(c *config) {
		if epoch > MaxFenceEpoch {
			c.fail("WithFenceEpoch(%d): an epoch must be at most %d (MaxFenceEpoch), so that fences stay below 2^63", epoch, MaxFenceEpoch)
			return
		}
		if c.epochSet && c.epoch != epoch {
			c.fail("WithFenceEpoch(%d) after WithFenceEpoch(%d): a Client has one fence epoch; give one (a migrate URL's phase sets it too)", epoch, c.epoch)
			return
		}
		c.epoch, c.epochSet = epoch, true
	}
}

// fence returns the fence a lease reports for the store's fence f: f under
// the epoch, when the Client has one.
func (c *config) fence(f uint64) uint64 { return c.epoch<<FenceEpochShift | f }

// fits reports whether the store's fence f can be placed under the epoch.
func (c *config) fits(f uint64) bool { return !c.epochSet || f < 1<<FenceEpochShift }

// WithClock sets the clock used for validity deadlines, renewals and waits.
// Tests pass a *clock.Fake (often the same one given to the memory backend)
// to drive expiry by hand. Valid: non-nil.
func WithClock(clk clock.Clock) Option {
	return func(c *config) {
		if clk == nil {
			c.fail("WithClock(nil): a clock is required; use clock.Real for the system clock")
			return
		}
		c.clock = clk
		c.clockID++
	}
}
