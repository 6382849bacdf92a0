// Package pgtest starts a PostgreSQL server for a test, from $LOCK_PG_BIN,
// PATH or Debian's packages (scripts/test installs them), with a database
// of its own, and stops it at the test's cleanup.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
)

// Start starts a PostgreSQL server for the test: initdb into a
// temporary directory, postgres on a free loopback port, a database of its
// own; the server is stopped, and its processes checked gone, at cleanup.
// It returns a pool of up to 12 connections to the database.
func Start(t testing.TB) *sql.DB {
	t.Helper()
	bin := postgresBin(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	attr := &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 {
		// postgres refuses to run as root: run it as nobody, in a
		// directory nobody owns, under a parent nobody can enter.
		attr.Credential = nobody(t)
		if err := os.Chown(dir, int(attr.Credential.Uid), int(attr.Credential.Gid)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC"}

	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir, initdb.Env, initdb.SysProcAttr = dir, env, attr
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}

	port := freePort(t)
	logPath := filepath.Join(dir, "postgres.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=40")
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, log, log
	attr.Pdeathsig = syscall.SIGQUIT // immediate shutdown should the test binary die first
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { stopPostgres(t, cmd.Process.Pid, exited) })
	logTail := func() string { b, _ := os.ReadFile(logPath); return string(b) }

	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%%s?sslmode=disable&connect_timeout=5", port)
	admin, err := sql.Open("pgx", fmt.Sprintf(dsn, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		err := admin.PingContext(ctx)
		if err == nil {
			break
		}
		select {
		case <-exited:
			t.Fatalf("postgres exited: %s", logTail())
		case <-ctx.Done():
			t.Fatalf("postgres not ready after a minute: %v\n%s", err, logTail())
		case <-time.After(20 * time.Millisecond): // poll until the server answers
		}
	}
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE fence`); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", fmt.Sprintf(dsn, "fence"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // before the server stops
	db.SetMaxOpenConns(12)
	var version string
	if err := db.QueryRowContext(ctx, `SHOW server_version`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL %s from %s", version, bin)
	return db
}

// stopPostgres stops the server whose postmaster is pid and fails the test
// if any of its processes outlives it. The postmaster's children make
// themselves leaders of process groups of their own, so a signal to its
// group does not reach them: fast shutdown (SIGINT) ends every session and
// the postmaster exits only after its children have. Should it hang,
// immediate shutdown (SIGQUIT), then SIGKILL to its group.
func stopPostgres(t testing.TB, pid int, exited <-chan struct{}) {
	children := childPIDs(pid)
	syscall.Kill(pid, syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Errorf("postgres still running 30s after SIGINT; sending SIGQUIT")
		syscall.Kill(pid, syscall.SIGQUIT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-pid, syscall.SIGKILL)
			<-exited
		}
	}
	for _, c := range children {
		if syscall.Kill(c, 0) == nil {
			t.Errorf("postgres process %d outlived the server; killing it", c)
			syscall.Kill(c, syscall.SIGKILL)
		}
	}
}

// childPIDs returns the children of pid, from Linux's /proc; none where
// there is no /proc.
func childPIDs(pid int) []int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// postgresBin returns the directory of initdb and postgres: $LOCK_PG_BIN,
// else the directory on PATH that has both, else the newest
// /usr/lib/postgresql/VERSION/bin (Debian keeps them off PATH). Without
// them the test fails when $CI is set and is skipped otherwise.
func postgresBin(t testing.TB) string {
	t.Helper()
	has := func(dir string) bool {
		for _, name := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv("LOCK_PG_BIN"); dir != "" {
		if !has(dir) {
			t.Fatalf("LOCK_PG_BIN=%s has no initdb and postgres", dir)
		}
		return dir
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(dir string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
		return v
	}
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, dir := range dirs {
		if has(dir) {
			return dir
		}
	}
	msg := "PostgreSQL not found: no initdb and postgres in $LOCK_PG_BIN, on PATH or in /usr/lib/postgresql/*/bin; run scripts/test, which installs it, or apt-get install -y postgresql"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg + "; skipped because CI is not set")
	return ""
}

// nobody returns the credentials of the user nobody, for running postgres
// when the test runs as root.
func nobody(t testing.TB) *syscall.Credential {
	t.Helper()
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("running as root, and postgres refuses to: no user nobody to run it as: %v", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatalf("user nobody: %v", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("no free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Cluster is a PostgreSQL cluster initialised by InitDB, for a server
// that the test starts on its own (with conformance/serverproc, say).
type Cluster struct {
	Bin  string // the directory of postgres and initdb
	Dir  string // a directory the server's user owns: run the server in it
	Data string // the data directory, Dir/data
	// User to run postgres as: "nobody" when the test runs as root
	// (postgres refuses root), "" otherwise.
	User string
}

// InitDB finds the binaries (as Start does), makes a directory that the
// server's user owns, removed at the end of the test, and runs initdb
// into its subdirectory data: superuser postgres, trust authentication,
// UTF8, locale C.
func InitDB(t testing.TB) Cluster {
	t.Helper()
	c := Cluster{Bin: postgresBin(t)}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c.Dir, c.Data = dir, filepath.Join(dir, "data")
	if os.Geteuid() == 0 {
		cred := nobody(t)
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
		c.User = "nobody"
	}
	c.Reinit(t)
	return c
}

// Reinit removes the data directory, if any, and runs initdb again: for a
// restart that loses the data. The server must not run.
func (c Cluster) Reinit(t testing.TB) {
	t.Helper()
	if err := os.RemoveAll(c.Data); err != nil {
		t.Fatal(err)
	}
	initdb := exec.Command(filepath.Join(c.Bin, "initdb"), "-D", c.Data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir, initdb.Env = c.Dir, []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC"}
	if c.User != "" {
		initdb.SysProcAttr = &syscall.SysProcAttr{Credential: nobody(t)}
	}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
}
