package pgbackend

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/lock/backend"
)

// MinTTL is the shortest TTL the backend accepts: the store enforces any
// TTL to the microsecond, but a lease renews about every third of its TTL,
// and a renewal needs a round trip and a commit (a WAL flush) within that.
const MinTTL = 100 * time.Millisecond

// DefaultMaxTTL is the longest TTL the backend accepts unless WithMaxTTL
// says otherwise: it bounds how long a crashed holder blocks a key.
const DefaultMaxTTL = time.Minute

// Backend is a lock store in PostgreSQL. It is safe for concurrent use.
type Backend struct {
	pool     *pgxpool.Pool
	maxTTL   time.Duration
	deadTTL  time.Duration
	closed   atomic.Bool
	listener *listener
}

// Option configures a Backend.
type Option func(*Backend)

// WithMaxTTL sets the longest TTL the backend accepts (default
// DefaultMaxTTL).
func WithMaxTTL(d time.Duration) Option { return func(b *Backend) { b.maxTTL = d } }

// WithDeadTokenTTL sets how long a released token stays dead (default,
// and minimum, backend.MinDeadTokenTTL). Raise it when a request can take
// longer to reach the server (see the package doc).
func WithDeadTokenTTL(d time.Duration) Option { return func(b *Backend) { b.deadTTL = d } }

// New returns a backend that keeps its locks in the database of pool,
// whose schema CreateSchema made. The pool stays the caller's: Close does
// not close it.
func New(pool *pgxpool.Pool, opts ...Option) (*Backend, error) {
	b := &Backend{pool: pool, maxTTL: DefaultMaxTTL, deadTTL: backend.MinDeadTokenTTL}
	for _, o := range opts {
		o(b)
	}
	if b.maxTTL < MinTTL {
		return nil, fmt.Errorf("pgbackend: maximum TTL %v below the minimum %v: %w", b.maxTTL, MinTTL, backend.ErrInvalid)
	}
	if b.deadTTL < backend.MinDeadTokenTTL {
		return nil, fmt.Errorf("pgbackend: dead token TTL %v below backend.MinDeadTokenTTL: %w", b.deadTTL, backend.ErrInvalid)
	}
	b.listener = newListener(pool)
	return b, nil
}

var (
	_ backend.Backend   = (*Backend)(nil)
	_ backend.Inspector = (*Backend)(nil)
	_ backend.Describer = (*Backend)(nil)
	_ backend.Notifier  = (*Backend)(nil)
)

// Capabilities implements backend.Describer (see the package doc, time).
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		MinTTL:       MinTTL,
		MaxTTL:       b.maxTTL,
		Granularity:  time.Microsecond, // timestamptz's resolution
		ExpiryFactor: 1,
		ExpirySlack:  time.Millisecond, // the server clock's microseconds, rounded
		DurableFence: true,             // with fsync and synchronous_commit on, the defaults
		Labels:       true,
	}
}

// micros returns ttl in whole microseconds, rounded up, or an error when
// the backend does not accept it.
func (b *Backend) micros(ttl time.Duration) (int64, error) {
	if ttl < MinTTL || ttl > b.maxTTL {
		return 0, fmt.Errorf("pgbackend: TTL %v outside [%v, %v]: %w", ttl, MinTTL, b.maxTTL, backend.ErrInvalid)
	}
	return int64((ttl + time.Microsecond - 1) / time.Microsecond), nil
}

// fail wraps an error of the driver; when ctx has ended, the error wraps
// ctx.Err() too, whatever the driver made of it.
func fail(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("pgbackend: %s: %w (%w)", op, ctx.Err(), err)
	}
	return fmt.Errorf("pgbackend: %s: %w", op, err)
}

// Acquire implements backend.Backend with one call of distlock_acquire.
func (b *Backend) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if b.closed.Load() {
		return backend.Grant{}, backend.ErrClosed
	}
	us, err := b.micros(ttl)
	if err != nil {
		return backend.Grant{}, err
	}
	var result string
	var fence, remaining int64
	err = b.pool.QueryRow(ctx, `SELECT result, fence, remaining_us FROM distlock_acquire($1, $2, $3, $4)`,
		[]byte(key), token, backend.Label(ctx), us).Scan(&result, &fence, &remaining)
	if err != nil {
		return backend.Grant{}, fail(ctx, "acquire", err)
	}
	switch result {
	case "granted":
		return backend.Grant{Fence: uint64(fence), TTL: time.Duration(us) * time.Microsecond}, nil
	case "locked":
		return backend.Grant{}, backend.Locked(time.Duration(remaining) * time.Microsecond)
	case "dead":
		return backend.Grant{}, fmt.Errorf("pgbackend: acquire with a token released before: %w", backend.ErrInvalid)
	}
	return backend.Grant{}, fmt.Errorf("pgbackend: acquire: unknown result %q", result)
}

// Renew implements backend.Backend with one UPDATE, which takes the key's
// row lock and checks the holder after it.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if b.closed.Load() {
		return backend.Grant{}, backend.ErrClosed
	}
	us, err := b.micros(ttl)
	if err != nil {
		return backend.Grant{}, err
	}
	var fence int64
	err = b.pool.QueryRow(ctx, `UPDATE distlock_locks SET expires = statement_timestamp() + $3 * interval '1 microsecond'
		WHERE key = $1 AND token = $2 AND expires > clock_timestamp() RETURNING fence`,
		[]byte(key), token, us).Scan(&fence)
	if errors.Is(err, pgx.ErrNoRows) {
		return backend.Grant{}, backend.ErrNotHeld
	}
	if err != nil {
		return backend.Grant{}, fail(ctx, "renew", err)
	}
	return backend.Grant{Fence: uint64(fence), TTL: time.Duration(us) * time.Microsecond}, nil
}

// Release implements backend.Backend with one call of distlock_release.
func (b *Backend) Release(ctx context.Context, key, token string) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	var result string
	err := b.pool.QueryRow(ctx, `SELECT distlock_release($1, $2, $3)`,
		[]byte(key), token, b.deadTTL.Microseconds()).Scan(&result)
	if err != nil {
		return fail(ctx, "release", err)
	}
	switch result {
	case "released":
		return nil
	case "notheld":
		return backend.ErrNotHeld
	}
	return fmt.Errorf("pgbackend: release: unknown result %q", result)
}

// Inspect implements backend.Inspector: a read, which takes no lock.
func (b *Backend) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	if b.closed.Load() {
		return backend.Holder{}, backend.ErrClosed
	}
	var h backend.Holder
	var fence, remaining int64
	var label *string
	err := b.pool.QueryRow(ctx, `SELECT token, fence, label,
		floor(extract(epoch FROM expires - clock_timestamp()) * 1000000)::bigint
		FROM distlock_locks WHERE key = $1 AND token IS NOT NULL AND expires > clock_timestamp()`,
		[]byte(key)).Scan(&h.Token, &fence, &label, &remaining)
	if errors.Is(err, pgx.ErrNoRows) {
		return backend.Holder{}, nil
	}
	if err != nil {
		return backend.Holder{}, fail(ctx, "inspect", err)
	}
	h.Held, h.Fence, h.Remaining = true, uint64(fence), time.Duration(remaining)*time.Microsecond
	if label != nil {
		h.Label = *label
	}
	return h, nil
}

// Close stops the backend's listener. It does not close the pool, nor
// release held locks: they expire. Calls after Close return
// backend.ErrClosed.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.listener.close()
	return nil
}
