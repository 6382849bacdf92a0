// Command lockctl runs a command under a distributed lock, inspects locks,
// tells the story of the problem locks solve, and measures a backend.
//
//	lockctl demo                                   # flash sale and GC pause, in memory
//	lockctl run --backend redis://localhost:6379 nightly-report -- ./report.sh
//	lockctl status --backend redis://localhost:6379 nightly-report
//	lockctl bench --backend redis://localhost:6379
//	lockctl init-nodes --backend redlock://h1:6379,h2:6379,h3:6379  # once, new deployment
//
// The backend is a URL (--backend, or the LOCK_BACKEND environment variable);
// every scheme of this module is registered: mem, redis, rediss, unix,
// redlock, consul, consuls, etcd and etcds.
//
// Exit status: for run, the command's own status (128+N when signal N ended
// it), 127 when the command is not found and 126 when it cannot be
// executed (as a shell says); 2 for bad usage (flags, key, URL, unknown
// scheme); 75 when run could not get the lock because another owner held
// it (at once with --no-wait, or still when --timeout ran out); 76 when run
// lost the lock, or its renewals failed, while the command ran (the
// command was stopped); 69 when the backend failed: it could not be
// reached, did not answer in time, or returned an error.
//
// run starts the command in a process group of its own and signals the
// whole group; see the README's "lockctl run: the timeline" for when.
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
	_ "github.com/distlock/lock/redis"
)

// Exit statuses of lockctl's own outcomes.
const (
	exitOK          = 0
	exitUsage       = 2
	exitBackend     = 69
	exitNotAcquired = 75
	exitLost        = 76
	exitCannotExec  = 126
	exitNotFound    = 127
)

func main() {
	if isGuard() {
		os.Exit(guardMain(os.Args[1:]))
	}
	os.Exit(lockctl(context.Background(), os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
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
  run     [--backend URL] [--ttl D] [--wait|--no-wait] [--timeout D] [--grace D] KEY -- CMD [ARGS...]
  status  [--backend URL] KEY
  demo    [--backend URL] [--buyers N] [--units N]
  bench   [--backend URL] [--duration D]
  init-nodes [--backend redlock://...]   (once, for a new Redlock deployment)
  version
"lockctl CMD --help" lists a command's flags with their defaults.
the backend URL comes from --backend or LOCK_BACKEND; schemes: `

// lockctl runs one command line and returns the exit status.
func lockctl(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage+strings.Join(lock.Schemes(), ", ")+"\n")
		return exitUsage
	}
	env := &environment{stdout: stdout, stderr: stderr, getenv: getenv}
	switch args[0] {
	case "run":
		return env.run(ctx, args[1:])
	case "status":
		return env.status(ctx, args[1:])
	case "demo":
		return env.demo(ctx, args[1:])
	case "bench":
		return env.bench(ctx, args[1:])
	case "init-nodes":
		return env.initNodes(ctx, args[1:])
	case "version", "--version":
		fmt.Fprintln(stdout, version())
		return exitOK
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage+strings.Join(lock.Schemes(), ", ")+"\n")
		return exitOK
	}
	return env.usageError("", "unknown command %q; valid: run, status, demo, bench, init-nodes, version", args[0])
}

type environment struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// usageError prints a one-line message and returns exitUsage.
func (e *environment) usageError(cmd, format string, args ...any) int {
	prefix := "lockctl"
	if cmd != "" {
		prefix += " " + cmd
	}
	fmt.Fprintf(e.stderr, "%s: %s\n", prefix, fmt.Sprintf(format, args...))
	return exitUsage
}

// backendURL picks the backend: the flag, else LOCK_BACKEND, else def.
func (e *environment) backendURL(flagValue, def string) string {
	if flagValue != "" {
		return flagValue
	}
	if v := e.getenv("LOCK_BACKEND"); v != "" {
		return v
	}
	return def
}

// open opens the backend, mapping bad URLs to a usage error.
func (e *environment) open(ctx context.Context, cmd, url string, opts ...lock.Option) (*lock.Client, int) {
	if url == "" {
		return nil, e.usageError(cmd, "no backend: give --backend URL or set LOCK_BACKEND (schemes: %s)", strings.Join(lock.Schemes(), ", "))
	}
	c, err := lock.Open(ctx, url, opts...)
	switch {
	case err == nil:
		return c, exitOK
	case errors.Is(err, lock.ErrUnknownScheme), errors.Is(err, lock.ErrInvalid):
		return nil, e.usageError(cmd, "%v", msg(err))
	}
	fmt.Fprintf(e.stderr, "lockctl %s: %v\n", cmd, msg(err))
	return nil, exitBackend
}

// msg is err on one line, without the library's "lock: " prefix (lockctl
// says its own).
func msg(err error) string {
	return strings.ReplaceAll(strings.TrimPrefix(err.Error(), "lock: "), "\n", "; ")
}
