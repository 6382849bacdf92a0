package fence_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/fence"
	"github.com/distlock/lock/memory"
)

// The example needs a SQL driver: it uses SQLite (import _
// "modernc.org/sqlite"), which this module does not require, so it is
// compiled but not run here; internal/sqltest/fencesql runs the same
// writes against SQLite and PostgreSQL. Its output would be:
//
//	B: <nil>
//	A: fence: stale fence 1 for "invoice:7": fence 2 was already accepted
//	status: paid by B
func ExampleTable_Apply() {
	ctx := context.Background()
	db, _ := sql.Open("sqlite", ":memory:")
	db.SetMaxOpenConns(1) // each connection to ":memory:" is a database of its own
	defer db.Close()
	db.ExecContext(ctx, `CREATE TABLE invoices (id INTEGER PRIMARY KEY, status TEXT)`)
	db.ExecContext(ctx, `INSERT INTO invoices VALUES (7, 'open')`)
	fences, _ := fence.NewTable(fence.SQLite, "fences")
	fences.Create(ctx, db)

	// pay writes invoice 7 in one transaction with the fence check.
	pay := func(l *lock.Lease, status string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := fences.ApplyLease(ctx, tx, "invoice:7", l); err != nil {
			return err // fence.ErrStale: a newer holder wrote first
		}
		if _, err := tx.ExecContext(ctx, `UPDATE invoices SET status = ? WHERE id = 7`, status); err != nil {
			return err
		}
		return tx.Commit()
	}

	store := memory.NewStore()
	clientA, _ := lock.New(store.NewBackend(), lock.WithAutoRenew(false))
	clientB, _ := lock.New(store.NewBackend())
	defer clientA.Close()
	defer clientB.Close()

	// A takes the lock, then pauses (a long GC, say) past its TTL.
	a, _ := clientA.TryAcquire(ctx, "invoice:7", lock.WithTTL(20*time.Millisecond))
	<-a.Done()

	// B takes over and writes; A wakes up and writes too, too late.
	b, _ := clientB.Acquire(ctx, "invoice:7")
	defer b.Release(ctx)
	fmt.Println("B:", pay(b, "paid by B"))
	fmt.Println("A:", pay(a, "paid by A"))

	var status string
	db.QueryRowContext(ctx, `SELECT status FROM invoices WHERE id = 7`).Scan(&status)
	fmt.Println("status:", status)
}

func ExampleGuard_Do() {
	var guard fence.Guard // one per process; zero value ready
	var file []string     // the protected resource

	write := func(fenceNo uint64, holder, line string) error {
		return guard.Do("report.txt", fenceNo, holder, func() error {
			file = append(file, line) // runs only while fenceNo is the newest
			return nil
		})
	}
	fmt.Println(write(7, "lease-a", "A, fence 7"))
	fmt.Println(write(8, "lease-b", "B, fence 8"))
	fmt.Println(write(7, "lease-a", "A again, after its pause"))
	fmt.Println(file)
	// Output:
	// <nil>
	// <nil>
	// fence: stale fence 7 for "report.txt": fence 8 was already accepted
	// [A, fence 7 B, fence 8]
}

// DoLease takes the lease whole: its fence and its token as the holder.
func ExampleGuard_DoLease() {
	ctx := context.Background()
	store := memory.NewStore()
	clientA, err := lock.New(store.NewBackend(), lock.WithAutoRenew(false))
	if err != nil {
		panic(err)
	}
	defer clientA.Close()
	clientB, err := lock.New(store.NewBackend())
	if err != nil {
		panic(err)
	}
	defer clientB.Close()

	var guard fence.Guard
	var file []string
	write := func(l *lock.Lease, line string) error {
		return guard.DoLease("report.txt", l, func() error {
			file = append(file, line)
			return nil
		})
	}

	// A takes the lock and pauses past its TTL; B takes over and writes.
	a, err := clientA.TryAcquire(ctx, "report", lock.WithTTL(20*time.Millisecond))
	if err != nil {
		panic(err)
	}
	<-a.Done()
	b, err := clientB.Acquire(ctx, "report")
	if err != nil {
		panic(err)
	}
	defer b.Release(ctx)
	fmt.Println("B:", write(b, "B"))
	fmt.Println("A:", write(a, "A, after its pause"))
	fmt.Println(file)
	// Output:
	// B: <nil>
	// A: fence: stale fence 1 for "report.txt": fence 2 was already accepted
	// [B]
}
