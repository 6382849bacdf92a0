package lock

import (
	"errors"
	"fmt"

	"github.com/distlock/lock/backend"
)

// Sentinel errors. Check them with errors.Is; every error this package returns
// starts with "lock:". A backend's own error stays reachable with errors.As,
// and context errors are never hidden: errors.Is(err, context.Canceled) holds
// when a call ended because its context was cancelled.
var (
	// ErrLocked: the key is held by another owner (TryAcquire).
	ErrLocked = backend.ErrLocked
	// ErrContended: TryAcquire gave up on a multi-node store (Redlock)
	// where nobody held the key but no attempt got it either: concurrent
	// attempts kept splitting the quorum, or the quorum kept coming later
	// than the TTL (a slow network or store). It gives up after about a
	// TTL of such attempts (64 at most); Acquire keeps trying until its
	// context ends.
	ErrContended = backend.ErrContended
	// ErrNotHeld: the store says the key is not held by this owner.
	ErrNotHeld = backend.ErrNotHeld
	// ErrLost: the lease ended without being released: its validity deadline
	// passed without a successful renewal, or the store said another owner
	// may hold the key. Whatever the holder did after the loss may have
	// overlapped another holder's critical section.
	ErrLost = errors.New("lock: lease lost")
	// ErrReleased: the lease was released by its holder.
	ErrReleased = errors.New("lock: lease released")
	// ErrClosed: the Client was closed.
	ErrClosed = backend.ErrClosed
	// ErrInvalid: bad input; nothing was changed. ErrInvalidKey,
	// ErrInvalidTTL and ErrInvalidOption are kinds of it.
	ErrInvalid = backend.ErrInvalid
	// ErrInvalidKey: the key is empty, too long, or not valid UTF-8.
	ErrInvalidKey = errors.New("lock: invalid key")
	// ErrInvalidTTL: the TTL is not positive, below the backend's minimum,
	// or not longer than the drift allowance.
	ErrInvalidTTL = errors.New("lock: invalid TTL")
	// ErrInvalidOption: an option has a value outside its valid range.
	ErrInvalidOption = errors.New("lock: invalid option")
	// ErrUnknownScheme: Open was given a URL whose scheme no backend
	// registered.
	ErrUnknownScheme = errors.New("lock: unknown URL scheme")
	// ErrBackendContract: the backend reported a grant or a handover that
	// its contract rules out (a fence of 0, or a TTL shorter than asked
	// for): a bug in the backend. Package lock never makes a lease of it;
	// it releases the token, as after an acquire of unknown outcome.
	ErrBackendContract = errors.New("lock: the backend broke its contract")
)

// inputError is bad input: errors.Is matches both its kind and ErrInvalid.
type inputError struct {
	kind error
	msg  string
}

func (e *inputError) Error() string { return "lock: " + e.msg }

func (e *inputError) Is(target error) bool { return target == e.kind || target == ErrInvalid }

func invalid(kind error, format string, args ...any) error {
	return &inputError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// opError adds the operation and key to an error from the backend or the
// context, keeping it reachable for errors.Is and errors.As.
type opError struct {
	op  string
	key string
	err error
}

func (e *opError) Error() string {
	msg := e.err.Error()
	if len(msg) > 6 && msg[:6] == "lock: " {
		msg = msg[6:]
	}
	return fmt.Sprintf("lock: %s %q: %s", e.op, e.key, msg)
}

func (e *opError) Unwrap() error { return e.err }

func wrap(op, key string, err error) error {
	if err == nil {
		return nil
	}
	return &opError{op: op, key: key, err: err}
}
