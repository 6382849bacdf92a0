// Package gcpause_test is the GC-pause story with real processes: a holder
// takes a lock and its fence, is stopped (SIGSTOP, as a long GC pause or a
// stopped VM would stop it) past its TTL, a successor takes the lock and
// writes, and the old holder resumes and writes with its old fence. A
// fenced resource (package fence, a SQLite table shared by both processes)
// refuses the late write; an unfenced one takes it, and the test requires
// that lost update to be seen: the negative control that proves the check
// can fail.
package gcpause_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/distlock/lock"
	"github.com/distlock/lock/fence"
	"github.com/distlock/lock/internal/redistest"
	_ "github.com/distlock/lock/redis"
)

const (
	childEnv = "LOCK_GCPAUSE_CHILD" // the mode: fenced or unfenced
	ttl      = 300 * time.Millisecond
	resource = "invoice:7"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode, os.Getenv("LOCK_GCPAUSE_URL"), os.Getenv("LOCK_GCPAUSE_DB")))
	}
	goleak.VerifyTestMain(m)
}

func openDB(path string) (*sql.DB, error) {
	return sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
}

// pay sets the invoice's status, with the fence check in the same
// transaction when fences is not nil.
func pay(ctx context.Context, db *sql.DB, fences *fence.Table, l *lock.Lease, status string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if fences != nil {
		if err := fences.Apply(ctx, tx, resource, l.Fence(), l.Token()); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE invoices SET status = ? WHERE id = 7`, status); err != nil {
		return err
	}
	return tx.Commit()
}

// child takes the lock, prints its fence, waits for a line on stdin (it is
// stopped meanwhile), and then writes as if it still held the lock.
func child(mode, url, dbPath string) int {
	ctx := context.Background()
	fail := func(err error) int { fmt.Println("error", err); return 1 }
	locks, err := lock.Open(ctx, url, lock.WithTTL(ttl))
	if err != nil {
		return fail(err)
	}
	defer locks.Close()
	db, err := openDB(dbPath)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	var fences *fence.Table
	if mode == "fenced" {
		if fences, err = fence.NewTable(fence.SQLite, "fences"); err != nil {
			return fail(err)
		}
	}
	l, err := locks.TryAcquire(ctx, resource)
	if err != nil {
		return fail(err)
	}
	fmt.Println("fence", l.Fence())
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return fail(err)
	}
	// The pause came between the holder's last look at its lease and
	// its write: it writes.
	switch err := pay(ctx, db, fences, l, "paid by A"); {
	case errors.Is(err, fence.ErrStale):
		fmt.Println("stale")
	case err != nil:
		return fail(err)
	default:
		fmt.Println("accepted")
	}
	return 0
}

func TestGCPause(t *testing.T) {
	srv := redistest.Start(t, redistest.AOFAlways)
	url := "redis://" + srv.Addr
	for _, mode := range []string{"fenced", "unfenced"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			dbPath := filepath.Join(t.TempDir(), "shop.db")
			db, err := openDB(dbPath)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			for _, q := range []string{
				`CREATE TABLE invoices (id INTEGER PRIMARY KEY, status TEXT)`,
				`INSERT INTO invoices VALUES (7, 'open')`,
			} {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			fences, err := fence.NewTable(fence.SQLite, "fences")
			if err != nil {
				t.Fatal(err)
			}
			if err := fences.Create(ctx, db); err != nil {
				t.Fatal(err)
			}

			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+mode, "LOCK_GCPAUSE_URL="+url, "LOCK_GCPAUSE_DB="+dbPath, "GORACE=atexit_sleep_ms=0")
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				cmd.Process.Signal(syscall.SIGCONT)
				stdin.Close()
				cmd.Process.Kill()
				cmd.Wait()
			}()
			out := bufio.NewReader(stdout)
			line := func() string {
				s, err := out.ReadString('\n')
				if err != nil && !errors.Is(err, io.EOF) {
					t.Fatalf("reading the holder process: %v", err)
				}
				return strings.TrimSpace(s)
			}
			first := line()
			old, err := strconv.ParseUint(strings.TrimPrefix(first, "fence "), 10, 64)
			if err != nil {
				t.Fatalf("the holder process said %q; want its fence", first)
			}

			// The holder stops, as in a GC pause; its lock expires on
			// the store (waiting out a TTL is the one sleep tests use).
			if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			time.Sleep(ttl + 100*time.Millisecond)
			locks, err := lock.Open(ctx, url, lock.WithTTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer locks.Close()
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			b, err := locks.Acquire(actx, resource)
			if err != nil {
				t.Fatalf("the successor's Acquire: %v", err)
			}
			defer b.Release(ctx)
			if b.Fence() <= old {
				t.Fatalf("successor's fence %d, old holder's %d: fences must grow", b.Fence(), old)
			}
			var f *fence.Table
			if mode == "fenced" {
				f = fences
			}
			if err := pay(ctx, db, f, b, "paid by B"); err != nil {
				t.Fatalf("the successor's write: %v", err)
			}

			// The old holder resumes and writes with its old fence.
			if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(stdin, "write\n"); err != nil {
				t.Fatal(err)
			}
			said := line()
			var status string
			if err := db.QueryRowContext(ctx, `SELECT status FROM invoices WHERE id = 7`).Scan(&status); err != nil {
				t.Fatal(err)
			}
			lost := status != "paid by B"
			t.Logf("%s: old holder (fence %d) said %q, successor (fence %d); status %q", mode, old, said, b.Fence(), status)
			switch mode {
			case "fenced":
				if said != "stale" || lost {
					t.Fatalf("fenced resource: the old holder's late write was %q and the status is %q; want it refused (stale) and %q kept", said, status, "paid by B")
				}
			case "unfenced":
				// The negative control: without the check the late
				// write goes through, and the test must see it.
				if said != "accepted" || !lost {
					t.Fatalf("unfenced resource: the old holder said %q and the status is %q; the lost update was not seen, so the fenced case proves nothing", said, status)
				}
			}
		})
	}
}
