package fence

import (
	"context"
	"database/sql"
	"reflect"
)

// Holder is what the fence helpers need of a lock's lease: its fence and
// a token unique to its acquisition. *lock.Lease satisfies it, so that a
// lease can be passed whole (DoLease, ApplyLease) rather than as a fence
// and a holder string that are easy to swap.
type Holder interface {
	Fence() uint64
	Token() string
}

// DoLease is Do with l's fence and token as the fence and the holder.
// A nil l returns an error wrapping ErrInvalid and changes nothing.
func (g *Guard) DoLease(resource string, l Holder, write func() error) error {
	if isNil(l) {
		return invalid("nil lease for resource %q", resource)
	}
	return g.Do(resource, l.Fence(), l.Token(), write)
}

// ApplyLease is Apply with l's fence and token as the fence and the
// holder. A nil l returns an error wrapping ErrInvalid and sends nothing.
func (t *Table) ApplyLease(ctx context.Context, tx *sql.Tx, resource string, l Holder) error {
	if isNil(l) {
		return invalid("nil lease for resource %q", resource)
	}
	return t.Apply(ctx, tx, resource, l.Fence(), l.Token())
}

// isNil reports whether h is nil, or a nil pointer in an interface (whose
// methods could panic).
func isNil(h Holder) bool {
	if h == nil {
		return true
	}
	v := reflect.ValueOf(h)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
