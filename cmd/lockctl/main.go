// Command lockctl runs a command under a distributed lock, inspects locks,
// tells the story of the problem locks solve, and measures a backend.
//
//	lockctl demo                                   # flash sale and GC pause, in memory
//	export LOCK_BACKEND=redis://localhost:6379     # or redis://:PASSWORD@host:6379
//	lockctl run nightly-report -- ./report.sh
//	lockctl status nightly-report
//	lockctl break nightly-report                   # a stuck lock: shows its holder, asks, removes it
//	lockctl bench
//	lockctl init-nodes --backend-file /run/secrets/lock-url  # once, new Redlock deployment
//	lockctl migrate check --keys-file keys.txt     # LOCK_BACKEND=migrate://?from=...&to=...&phase=2
//
// The backend is a URL; every scheme of this module is registered (mem,
// redis, rediss, unix, redlock, redis+cluster, redis+sentinel, consul,
// etcd and their TLS forms, and migrate, a move between two stores;
// "lockctl help" lists them). Every command that
// takes a backend takes it, in this order, from:
//
//   - --backend URL: on the command line, which every local user can read
//     in ps and /proc/PID/cmdline for as long as lockctl runs. A URL that
//     carries credentials (user:password@, password=, token=,
//     sentinel_password=, ...) makes lockctl print a one-line warning to
//     stderr, and the command goes on.
//   - --backend-file PATH: the URL read from a file (a secrets manager's,
//     a mounted secret), surrounding whitespace and newline trimmed. An
//     unreadable or empty file, or one given with --backend, is a usage
//     error.
//   - LOCK_BACKEND, an environment variable, which only the user and root
//     can read. lockctl run takes it out of the command's environment (and
//     so of everything the command starts) unless --keep-backend-env is
//     given.
//
// For a URL with credentials, use LOCK_BACKEND or --backend-file. lockctl
// never prints the URL as given: it shows lock.RedactURL's form (secrets
// replaced by xxxxx) and cuts the URL's secrets out of every error. A URL
// with skip_verify=true makes lockctl print a one-line warning that the
// backend's TLS certificate is not checked.
//
// Keys, tokens, holder details and every other text that lockctl did not
// write itself (errors from the store, command names) are printed with
// control characters, other non-printable characters and bytes that are
// not UTF-8 escaped as in Go (\x1b, \n, \u202e, \xff): a key cannot send
// escape sequences to the terminal.
//
// Every flag is checked before a lock is taken or waited for: durations
// (--ttl, --timeout, --grace, bench's --duration) are at most a year
// (lock.MaxTTL), run's --grace at most half the TTL asked for (--ttl,
// else the URL's ttl, else 10s), and the TTL at most the backend's
// maximum (1m unless the URL's maxttl raises it): a usage error (exit 2)
// otherwise.
//
// A migrate:// URL (package migrate) names two stores and a phase of a
// move between them. In phases 2 and 3, which hold each lock on both
// stores, lockctl status shows the holder on each store. lockctl migrate
// check reads keys, given as arguments or in a file, on both stores (in
// every phase) and says whether each is clear for the deployment to start
// the next phase: whether no holder is left on a store that phase drops.
// The stores cannot list their keys, so the keys must be named.
//
// lockctl break removes a stuck lock. It reads the key's holder, shows
// it (whole token, the store's fence, the time the store gives it) and
// asks "remove it? [y/N]" on stderr, unless --yes is given. The answer
// is a line of standard input, read whether or not it is a terminal, so
// that "echo y | lockctl break KEY" works; anything but y or yes, or no
// line at all, removes nothing, and so does a holder that changed while
// the question waited (it is read again). The lock is released with its
// holder's token, as the holder would release it, not deleted: the fence
// counter is kept, so later fences are above the removed holder's, and a
// holder that changed since it was read is left alone. In phases 2 and 3
// of a migrate:// URL it shows and removes the holder on each store.
//
// Exit status: for run, the command's own status (128+N when signal N ended
// it), 127 when the command is not found and 126 when it cannot be
// executed (as a shell says); for migrate check, 0 when every key is
// clear and 1 when one is not; for break, 0 when every holder found was
// removed and 1 when a holder was not removed for a reason of the lock's
// (the key was free, the answer was not yes, the holder changed before
// the release, or its token is not one of this library's); 2 for bad
// usage (flags, key, URL, unknown scheme); 75 when run could not get the
// lock because another owner held it (at once with --no-wait, or still
// when --timeout ran out); 76 when run lost the lock, or its renewals
// failed, while the command ran (the command was stopped); 69 when the backend failed: it could not be
// reached, did not answer in time, or returned an error.
//
// run starts the command in a process group of its own and signals the
// whole group; see the README's "lockctl run: the timeline" for when. It
// does so through a copy of lockctl, the guard, which LOCKCTL_GUARD marks
// in its environment: that variable is lockctl's own, and a lockctl that
// finds it set without having been started by lockctl run says so and
// exits 2.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/distlock/lock"
	_ "github.com/distlock/lock/consul"
	_ "github.com/distlock/lock/etcd"
	_ "github.com/distlock/lock/memory"
	_ "github.com/distlock/lock/migrate" // the migrate:// scheme (migrate.go uses the package too)
	lockredis "github.com/distlock/lock/redis"
)

// Exit statuses of lockctl's own outcomes.
const (
	exitOK          = 0
	exitNotClear    = 1 // migrate check: a key is not clear for the next phase
	exitNotBroken   = 1 // break: a holder was not removed (none held, not confirmed, the holder changed)
	exitUsage       = 2
	exitBackend     = 69
	exitNotAcquired = 75
	exitLost        = 76
	exitCannotExec  = 126
	exitNotFound    = 127
)

func main() {
	quietLibraries()
	if isGuard() {
		os.Exit(guardMain(os.Args[1:]))
	}
	os.Exit(lockctl(context.Background(), os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// quietLibraries sets the process-wide state that the libraries leave to
// the program: go-redis's logger drops its messages about the clients that
// lock.Open created (lockctl reports their failures itself, as errors with
// the URL's secrets cut out) and prints the others to stderr.
func quietLibraries() {
	lockredis.SetQuietGoRedisLogger()
}

// version is lockctl's version: the module version it was built from.
func version() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	return "lockctl " + v + " " + runtime.Version()
}

const usage = `usage: lockctl <command> [flags] [args]
commands:
  run     [BACKEND] [--ttl D] [--wait|--no-wait] [--timeout D] [--grace D] [--keep-backend-env] KEY -- CMD [ARGS...]
  status  [BACKEND] KEY
  break   [BACKEND] [--yes] KEY   (remove a stuck lock by its holder's token, the
          fence counter kept; asks first unless --yes; exit 1 when not removed)
  demo    [BACKEND] [--buyers N] [--units N]
  bench   [BACKEND] [--duration D]
  init-nodes [BACKEND]   (once, for a new Redlock deployment: redlock://...)
  migrate check [BACKEND] [--settle D] [--keys-file PATH | KEY...]
          (BACKEND migrate://?from=URL&to=URL&phase=N: are the keys clear for
          phase N+1? In phases 2 and 3, status shows each store's holder.)
  version
"lockctl CMD --help" lists a command's flags with their defaults.
BACKEND, the backend URL: $LOCK_BACKEND, or --backend-file PATH (the URL read
from a file), or --backend URL. Every local user can read a --backend URL in
ps while lockctl runs: give one with credentials in LOCK_BACKEND or a file
(lockctl warns otherwise). run takes LOCK_BACKEND out of the command's
environment unless --keep-backend-env. skip_verify=true in the URL turns off
TLS certificate checks (lockctl warns). Durations: at most a year.
schemes: `

// lockctl runs one command line and returns the exit status.
func lockctl(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	env := &environment{stdin: os.Stdin, stdout: stdout, stderr: stderr, getenv: getenv}
	return env.command(ctx, args)
}

// command runs one command line in e and returns the exit status.
func (e *environment) command(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usage+strings.Join(lock.Schemes(), ", ")+"\n")
		return exitUsage
	}
	switch args[0] {
	case "run":
		return e.run(ctx, args[1:])
	case "status":
		return e.status(ctx, args[1:])
	case "break":
		return e.breakLock(ctx, args[1:])
	case "demo":
		return e.demo(ctx, args[1:])
	case "bench":
		return e.bench(ctx, args[1:])
	case "init-nodes":
		return e.initNodes(ctx, args[1:])
	case "migrate":
		return e.migrate(ctx, args[1:])
	case "version", "--version":
		fmt.Fprintln(e.stdout, version())
		return exitOK
	case "help", "-h", "--help":
		fmt.Fprint(e.stdout, usage+strings.Join(lock.Schemes(), ", ")+"\n")
		return exitOK
	}
	return e.usageError("", "unknown command %s; valid: run, status, break, demo, bench, init-nodes, migrate, version", quoted(argText(args[0])))
}

type environment struct {
	stdin          io.Reader // read by migrate check --keys-file - and by break's question
	stdout, stderr io.Writer
	getenv         func(string) string
	rawURL         string // the backend URL, whose secrets are cut out of every message (see backend)
}

// usageError prints a one-line message, its arguments shown (see show),
// and returns exitUsage.
func (e *environment) usageError(cmd, format string, args ...any) int {
	prefix := "lockctl"
	if cmd != "" {
		prefix += " " + cmd
	}
	e.printf(e.stderr, "%s: %s\n", prefix, fmt.Sprintf(format, e.shownArgs(args)...))
	return exitUsage
}

// open opens the backend at url (from e.backend), mapping bad URLs to a
// usage error. Its errors are lock.Open's: the URL redacted, its secrets
// cut out.
func (e *environment) open(ctx context.Context, cmd, url string, opts ...lock.Option) (*lock.Client, int) {
	c, err := lock.Open(ctx, url, opts...)
	switch {
	case err == nil:
		return c, exitOK
	case errors.Is(err, lock.ErrUnknownScheme), errors.Is(err, lock.ErrInvalid):
		return nil, e.usageError(cmd, "%v", err)
	}
	e.printf(e.stderr, "lockctl %s: %v\n", cmd, err)
	return nil, exitBackend
}

// msg is err on one line, without the library's "lock: " prefix (lockctl
// says its own), with the backend URL's secrets cut out. Print it through
// printf or show: it may hold a store's text.
func (e *environment) msg(err error) string {
	return e.scrub(strings.ReplaceAll(strings.TrimPrefix(err.Error(), "lock: "), "\n", "; "))
}
