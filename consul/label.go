package consul

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/distlock/lock/backend"
)

// Holder labels (backend.Label). A lock entry's value is its holder's
// token, then, when the request that granted the lock carried a label, a
// newline and the label:
//
//	TOKEN            no label
//	TOKEN\nLABEL     labelled
//
// A queue record carries its waiter's label the same way, after recQueued
// (recQueued + TOKEN\nLABEL), and so does each waiter a handover tells the
// new holder of (waiter.Label): a lock the store hands to a queued waiter,
// in the release's transaction, is written with that waiter's token and
// label, those of the waiter's latest queueing attempt.
//
// Why the value, and not an entry of its own beside the lock named after
// the token: the label is written by the very lock operation that grants
// the lock (acquire, shared-session acquire, a waiter's own lock, a
// handover), so it costs no operation, no round trip and no entry; it
// cannot outlive the lock (a release deletes the entry, an invalidated
// session deletes it, a handover rewrites it with the next holder's token
// and label); and it cannot describe another holder, since Inspect reads
// token and label from one value. A separate entry would need a delete in
// every path that ends a lock (releases, handovers, a release from
// outside, a shared session's lost locks), and each one missed would leave
// a label behind.
//
// The cost is that every reader of an entry's value as a token reads it
// through tokenOf: tokens never hold a newline (Acquire and queue attempts
// refuse one), so the token is what comes before the first newline, and
// the label everything after it. No transaction compares values (Consul's
// checks compare sessions and indexes), so none needed changing.

// labelSep separates the token from the label in an entry's value.
const labelSep = "\n"

// entryValue is the value of a lock entry (or, after recQueued, of a queue
// record) for token with label: the token alone when label is "".
func entryValue(token, label string) []byte {
	if label == "" {
		return []byte(token)
	}
	return []byte(token + labelSep + label)
}

// parseValue splits an entry's value (or a queue record's, after
// recQueued) into its token and label ("" when it has none).
func parseValue(v []byte) (token, label string) {
	t, l, _ := bytes.Cut(v, []byte(labelSep))
	return string(t), string(l)
}

// tokenOf is the token of an entry's value: every check of who holds an
// entry reads it.
func tokenOf(v []byte) string {
	t, _ := parseValue(v)
	return t
}

// requestLabel returns the holder label that ctx carries for a request
// that may grant token a lock, or an error wrapping backend.ErrInvalid
// when token or the label cannot be stored: a token with a newline (the
// value's separator) or a label longer than backend.MaxLabel (package lock
// sends neither).
func requestLabel(ctx context.Context, token string) (string, error) {
	if strings.Contains(token, labelSep) {
		return "", fmt.Errorf("%w: consul: token %q holds a newline", backend.ErrInvalid, token)
	}
	l := backend.Label(ctx)
	if len(l) > backend.MaxLabel {
		return "", fmt.Errorf("%w: consul: holder label of %d bytes; at most %d", backend.ErrInvalid, len(l), backend.MaxLabel)
	}
	return l, nil
}
