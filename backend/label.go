package backend

import "context"

// # Holder labels
//
// A holder label is a short description of who holds a lock ("host pid
// program" by default), which package lock sends with every request that
// grants one: Backend.Acquire, Queue.Acquire and Transferer.Transfer find
// it in their context (Label). A backend that stores it with the lock, in
// the same atomic step that grants the lock, declares
// Capabilities.Labels, and its Inspector reports it in Holder.Label.
//
// A label describes a token, never a key: it is stored beside the token
// it came with, and Inspect reports it only while that token holds the
// lock. So a label cannot outlive its lock's holder, and no request,
// however late or reordered, makes a label describe another holder: at
// worst a holder shows none. Package lock has checked a label (at most
// MaxLabel bytes of valid UTF-8 without control characters) before it
// reaches a backend.

// MaxLabel is the longest holder label in bytes.
const MaxLabel = 256

type labelKey struct{}

// WithLabel returns ctx carrying the holder label of the requests made
// with it (see Label).
func WithLabel(ctx context.Context, label string) context.Context {
	return context.WithValue(ctx, labelKey{}, label)
}

// Label returns the holder label that ctx carries: what a backend with
// Capabilities.Labels stores with a lock it grants. It is "" when ctx
// carries none (a caller other than package lock, or a Client whose
// backend does not declare Labels).
func Label(ctx context.Context) string {
	s, _ := ctx.Value(labelKey{}).(string)
	return s
}
