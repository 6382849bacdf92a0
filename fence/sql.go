package fence

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"regexp"
)

// Dialect is the SQL dialect of a database: it decides the placeholders of
// the statements a Table sends.
type Dialect int

// The dialects a Table supports: those with INSERT ... ON CONFLICT ... DO
// UPDATE ... WHERE.
const (
	// Postgres: PostgreSQL 9.5 or later (the tests use PostgreSQL 15
	// through pgx's stdlib driver); placeholders $1, $2, $3.
	Postgres Dialect = iota + 1
	// SQLite: SQLite 3.24 or later (the tests use modernc.org/sqlite);
	// placeholders ?.
	SQLite
)

func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "Postgres"
	case SQLite:
		return "SQLite"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// Execer runs a statement: *sql.DB, *sql.Tx and *sql.Conn are Execers.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Table is a table of fences in a SQL database, one row per resource: the
// newest fence accepted for it and that fence's holder. Create makes it;
// this is the statement, the same for both dialects, for a migration tool
// (with the table's name for fences):
//
//	CREATE TABLE IF NOT EXISTS fences (
//		resource TEXT PRIMARY KEY,
//		fence    BIGINT NOT NULL CHECK (fence > 0),
//		holder   TEXT NOT NULL
//	)
//
// Delete a resource's row to start it over, as when the lock moves to
// another backend (fences of different backends are not comparable).
// A Table is safe for concurrent use.
type Table struct {
	name    string
	dialect Dialect
	create  string
	upsert  string // accepts the fence; 1 row affected when it did
	current string // the newest fence accepted, for ErrStale's message
}

// tableName: letters, digits and underscores, not starting with a digit,
// optionally after a schema name of the same form; 63 bytes each at most
// (PostgreSQL's limit). The name goes into statements unquoted.
var tableName = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// NewTable returns the fence table name, such as "fences" or
// "app.fences", in a database of dialect d. It checks its input and sends
// nothing: call Create to make the table.
func NewTable(d Dialect, name string) (*Table, error) {
	if d != Postgres && d != SQLite {
		return nil, invalid("unknown %v; use Postgres or SQLite", d)
	}
	if !tableName.MatchString(name) {
		return nil, invalid("table name %q; a name is letters, digits and underscores, not starting with a digit, at most 63 bytes, optionally after \"schema.\"", name)
	}
	p1, p2, p3 := "$1", "$2", "$3"
	if d == SQLite {
		p1, p2, p3 = "?", "?", "?"
	}
	return &Table{
		name:    name,
		dialect: d,
		create: "CREATE TABLE IF NOT EXISTS " + name + ` (
	resource TEXT PRIMARY KEY,
	fence    BIGINT NOT NULL CHECK (fence > 0),
	holder   TEXT NOT NULL
)`,
		upsert: "INSERT INTO " + name + " AS f (resource, fence, holder) VALUES (" + p1 + ", " + p2 + ", " + p3 + ")" +
			" ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, holder = excluded.holder" +
			" WHERE f.fence < excluded.fence OR (f.fence = excluded.fence AND f.holder = excluded.holder)",
		current: "SELECT fence FROM " + name + " WHERE resource = " + p1,
	}, nil
}

// Name returns the table's name.
func (t *Table) Name() string { return t.name }

// Create creates the table if it does not exist.
func (t *Table) Create(ctx context.Context, db Execer) error {
	if ctx == nil || db == nil {
		return invalid("create table %s: nil context or database", t.name)
	}
	if _, err := db.ExecContext(ctx, t.create); err != nil {
		return fmt.Errorf("fence: create table %s: %w", t.name, err)
	}
	return nil
}

// Apply accepts fence from holder for resource inside tx, or returns an
// error wrapping ErrStale: call it in the transaction that writes the
// resource, before the write, and commit only when it returns nil. The
// fence is accepted when it is higher than the newest accepted for the
// resource, or equal to it with the same holder (one lease writing twice);
// holder identifies the lease (pass Lease.Token, unique to each
// acquisition).
//
// Apply is one statement, an upsert of the resource's row:
//
//	INSERT INTO fences AS f (resource, fence, holder) VALUES ($1, $2, $3)
//	ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, holder = excluded.holder
//	WHERE f.fence < excluded.fence OR (f.fence = excluded.fence AND f.holder = excluded.holder)
//
// One row affected means accepted; none means stale.
//
// # Why the check and the write are atomic
//
// In PostgreSQL the upsert locks the resource's row until tx ends: a row
// it inserts or updates, and also, as PostgreSQL documents, a row it
// leaves alone because the WHERE refused the fence. Any other
// transaction's Apply for the same resource waits for that lock. So from
// the moment Apply accepts a fence until tx commits or rolls back, no other
// fence can be accepted for the resource: tx's writes commit before any
// newer holder's can, the resource's fenced writes commit in fence order,
// and a write guarded by a stale fence never commits after a newer one.
//
// READ COMMITTED, PostgreSQL's default, is enough: an Apply that waited
// re-reads the row as the other transaction left it and decides on that
// (ErrStale if it committed a newer fence, accepted if it rolled back or
// committed an older one). At REPEATABLE READ and SERIALIZABLE, Apply
// fails instead with PostgreSQL's serialization error (SQLSTATE 40001)
// when the row was changed by a transaction that committed after tx's
// snapshot, as when Apply waited for it: roll back and run the transaction
// again. The package's tests check these cases at each level.
//
// A transaction that stalls after Apply holds up the next holder's Apply
// for the resource until it ends: bound transactions with a context
// deadline, or with PostgreSQL's idle_in_transaction_session_timeout.
//
// In SQLite a write transaction excludes every other writer of the
// database until it ends, so nothing can come between the check and the
// commit. Begin transactions with BEGIN IMMEDIATE (modernc.org/sqlite:
// _txlock=immediate in the DSN) and set a busy timeout (_busy_timeout), so
// that concurrent writers wait for each other instead of failing with
// SQLITE_BUSY.
//
// The guarantee covers writes made in transactions that called Apply and
// committed; a write made without Apply, or in another transaction, is not
// fenced.
//
// Bad input (fence 0 or above math.MaxInt64, which a BIGINT cannot hold;
// an empty or invalid resource name or holder; a nil context or tx) returns
// an error wrapping ErrInvalid and sends nothing. A database error is
// returned wrapped (errors.As reaches the driver's error) and leaves the
// outcome to tx: roll it back.
func (t *Table) Apply(ctx context.Context, tx *sql.Tx, resource string, fence uint64, holder string) error {
	if err := check(resource, fence, holder); err != nil {
		return err
	}
	if fence > math.MaxInt64 {
		return invalid("fence %d for resource %q does not fit a BIGINT column; fences are 1 to %d", fence, resource, int64(math.MaxInt64))
	}
	if ctx == nil || tx == nil {
		return invalid("apply fence %d for resource %q: nil context or transaction", fence, resource)
	}
	res, err := tx.ExecContext(ctx, t.upsert, resource, int64(fence), holder)
	if err != nil {
		return fmt.Errorf("fence: apply fence %d for %q to table %s: %w", fence, resource, t.name, err)
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return fmt.Errorf("fence: apply fence %d for %q to table %s: rows affected: %w", fence, resource, t.name, err)
	case n == 1:
		return nil
	case n != 0:
		return fmt.Errorf("fence: apply fence %d for %q to table %s: %d rows affected, want 0 or 1: is resource the table's primary key?", fence, resource, t.name, n)
	}
	// Refused. The row is locked by this transaction (PostgreSQL) or the
	// database is (SQLite): the fence read is the one that refused.
	var seen int64
	if err := tx.QueryRowContext(ctx, t.current, resource).Scan(&seen); err != nil {
		return fmt.Errorf("%w %d for %q (reading the accepted fence failed: %w)", ErrStale, fence, resource, err)
	}
	return stale(resource, fence, uint64(seen))
}
