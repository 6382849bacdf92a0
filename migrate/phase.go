package migrate

import (
	"fmt"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// Phase is a step of a move from one store (From) to another (To). Every
// instance of a deployment runs one phase; a phase is rolled out to every
// instance before the next one starts, so that at any time instances run
// at most two adjacent phases.
type Phase int

// The four phases.
const (
	// FromOnly: locks on From only, fences From's under the epoch.
	FromOnly Phase = 1
	// BothFromFences: locks on From, then To; fences From's under the
	// epoch. It excludes FromOnly instances through From and prepares To.
	BothFromFences Phase = 2
	// BothToFences: locks on From, then To; fences To's under epoch+1,
	// above every fence of phases 1 and 2.
	BothToFences Phase = 3
	// ToOnly: locks on To only, fences To's under epoch+1. It excludes
	// BothToFences instances through To.
	ToOnly Phase = 4
)

// String names the phase as the README does.
func (p Phase) String() string {
	switch p {
	case FromOnly:
		return "1 (from only)"
	case BothFromFences:
		return "2 (both stores, from's fences)"
	case BothToFences:
		return "3 (both stores, to's fences at epoch+1)"
	case ToOnly:
		return "4 (to only, epoch+1)"
	}
	return fmt.Sprintf("%d (not a phase)", int(p))
}

// valid reports whether p is one of the four phases.
func (p Phase) valid() bool { return p >= FromOnly && p <= ToOnly }

// usesFrom and usesTo report which stores the phase locks on.
func (p Phase) usesFrom() bool { return p <= BothToFences }
func (p Phase) usesTo() bool   { return p >= BothFromFences }

// MaxEpoch is the highest epoch a Config takes: phases 3 and 4 use
// Epoch+1, at most lock.MaxFenceEpoch.
const MaxEpoch = lock.MaxFenceEpoch - 1

// Config is one phase of a move, as code; a migrate:// URL says the same
// (see the package doc).
type Config struct {
	// From is the store the deployment moves from; it may be nil in
	// phase 4, which does not use it.
	From backend.Backend
	// To is the store it moves to; it may be nil in phase 1.
	To backend.Backend
	// Phase is 1 to 4.
	Phase Phase
	// Epoch is the fence epoch of From's fences (lock.WithFenceEpoch):
	// 0 for a deployment's first move; phases 3 and 4 use Epoch+1. A
	// later move from To to a third store takes Epoch+1 as its Epoch.
	Epoch uint64
}

// ErrInvalidConfig is the error of a Config (or a migrate:// URL) that
// names no phase, lacks a store its phase uses, or has an epoch out of
// range. errors.Is(err, lock.ErrInvalid) holds for it too.
var ErrInvalidConfig = fmt.Errorf("%w: migrate configuration", lock.ErrInvalid)

// Backend returns the backend of c's phase and the Client option that
// sets its fence epoch: From itself in phase 1, To itself in phase 4, and
// in phases 2 and 3 a backend that holds each lock on both (see the
// package doc). Give both to lock.New, or use NewClient. The returned
// backend owns the stores it uses (its Close closes them); a store the
// phase does not use is left to the caller. Nothing is sent to a store.
func (c Config) Backend() (backend.Backend, lock.Option, error) {
	if err := c.check(); err != nil {
		return nil, nil, err
	}
	switch c.Phase {
	case FromOnly:
		return c.From, lock.WithFenceEpoch(c.Epoch), nil
	case ToOnly:
		return c.To, lock.WithFenceEpoch(c.Epoch + 1), nil
	case BothFromFences:
		return newBoth(c.From, c.To, false), lock.WithFenceEpoch(c.Epoch), nil
	default: // BothToFences
		return newBoth(c.From, c.To, true), lock.WithFenceEpoch(c.Epoch + 1), nil
	}
}

// check says what is wrong with c, or nil.
func (c Config) check() error {
	switch {
	case !c.Phase.valid():
		return fmt.Errorf("%w: phase %d; want 1 (from only), 2 (both stores, from's fences), 3 (both stores, to's fences at epoch+1) or 4 (to only, epoch+1)", ErrInvalidConfig, int(c.Phase))
	case c.Epoch > MaxEpoch:
		return fmt.Errorf("%w: epoch %d; want 0 to %d (phases 3 and 4 use epoch+1, at most lock.MaxFenceEpoch)", ErrInvalidConfig, c.Epoch, MaxEpoch)
	case c.Phase.usesFrom() && c.From == nil:
		return fmt.Errorf("%w: phase %v needs the From store; it is nil", ErrInvalidConfig, c.Phase)
	case c.Phase.usesTo() && c.To == nil:
		return fmt.Errorf("%w: phase %v needs the To store; it is nil", ErrInvalidConfig, c.Phase)
	case c.Phase.usesFrom() && c.Phase.usesTo() && c.From == c.To:
		return fmt.Errorf("%w: From and To are the same backend; a move needs two stores", ErrInvalidConfig)
	}
	return nil
}

// NewClient returns lock.New over c's phase: its backend, with its fence
// epoch, then opts. An opts that sets another fence epoch is an error
// (lock.ErrInvalidOption). On an error, the stores are not closed.
func NewClient(c Config, opts ...lock.Option) (*lock.Client, error) {
	b, epoch, err := c.Backend()
	if err != nil {
		return nil, err
	}
	return lock.New(b, append([]lock.Option{epoch}, opts...)...)
}

// Stores returns the two stores of a backend that a phase 2 or 3 Config
// made (Config.Backend, or the Backend of a Client that NewClient or a
// migrate:// URL made), for tools that show each store's holder (lockctl
// status): ok is false for any other backend.
func Stores(b backend.Backend) (from, to backend.Backend, ok bool) {
	d := asBoth(b)
	if d == nil {
		return nil, nil, false
	}
	return d.from, d.to, true
}

// errStore wraps a store's error with the store's name, keeping it
// reachable by errors.Is and errors.As.
func errStore(store, op string, err error) error {
	if err == nil {
		return nil
	}
	return &storeError{store: store, op: op, err: err}
}

// storeError is an error of one of the two stores.
type storeError struct {
	store, op string
	err       error
}

func (e *storeError) Error() string {
	return "migrate: " + e.op + " on the " + e.store + " store: " + e.err.Error()
}
func (e *storeError) Unwrap() error { return e.err }
