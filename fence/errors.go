package fence

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Sentinel errors. Check them with errors.Is; every error this package
// returns starts with "fence:". A database's own error stays reachable with
// errors.As, and context errors are never hidden.
var (
	// ErrStale: the fence offered is lower than the newest accepted for the
	// resource, or equal to it but offered by another holder. Nothing was
	// accepted; with Table.Apply, roll the transaction back.
	ErrStale = errors.New("fence: stale fence")
	// ErrInvalid: bad input. Nothing was changed and nothing was sent to a
	// database.
	ErrInvalid = errors.New("fence: invalid input")
)

// MaxNameLen is the longest resource name and holder, in bytes.
const MaxNameLen = 1024

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// check validates the input every helper takes.
func check(resource string, fence uint64, holder string) error {
	if fence == 0 {
		return invalid("fence 0 for resource %q: fences start at 1 (pass Lease.Fence)", resource)
	}
	if p := nameProblem(resource); p != "" {
		return invalid("resource %s", p)
	}
	if p := nameProblem(holder); p != "" {
		return invalid("holder %s; pass an id unique to the lease, such as Lease.Token", p)
	}
	return nil
}

// nameProblem says what is wrong with a resource name or holder, or "" when
// nothing is.
func nameProblem(s string) string {
	const valid = "a name is 1 to %d bytes of UTF-8 without NUL bytes"
	switch {
	case s == "":
		return fmt.Sprintf("is empty; "+valid, MaxNameLen)
	case len(s) > MaxNameLen:
		return fmt.Sprintf("is %d bytes long; "+valid, len(s), MaxNameLen)
	case !utf8.ValidString(s):
		return fmt.Sprintf("%q is not valid UTF-8; "+valid, s, MaxNameLen)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Sprintf("%q contains a NUL byte; "+valid, s, MaxNameLen)
	}
	return ""
}

// accepts reports whether a write with fence from holder is accepted after
// seen from seenHolder was: the one rule every helper applies.
func accepts(seen uint64, seenHolder string, fence uint64, holder string) bool {
	return fence > seen || fence == seen && holder == seenHolder
}

// stale returns the error for a fence that the newest accepted one, seen,
// refused. Holders are not printed: a lease's token lets its owner renew
// and release the lock.
func stale(resource string, fence, seen uint64) error {
	if fence == seen {
		return fmt.Errorf("%w %d for %q: fence %d was already accepted from another holder", ErrStale, fence, resource, seen)
	}
	return fmt.Errorf("%w %d for %q: fence %d was already accepted", ErrStale, fence, resource, seen)
}
