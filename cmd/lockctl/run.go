package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// newFlags returns a flag set that reports errors through usageError.
func newFlags(cmd string) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func (e *environment) parse(cmd string, fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(e.stdout, "see: lockctl help\n")
			return exitOK, false
		}
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, "--"+f.Name) })
		return e.usageError(cmd, "%v; valid flags: %s", err, strings.Join(names, ", ")), false
	}
	return exitOK, true
}

// run: lockctl run [flags] KEY -- CMD [ARGS...]
func (e *environment) run(ctx context.Context, args []string) int {
	fs := newFlags("run")
	backendFlag := fs.String("backend", "", "backend URL")
	ttl := fs.Duration("ttl", 10*time.Second, "lock TTL; renewed automatically while the command runs")
	wait := fs.Bool("wait", true, "wait for the lock while another owner holds it")
	noWait := fs.Bool("no-wait", false, "fail at once (status 75) when another owner holds the lock")
	timeout := fs.Duration("timeout", 0, "give up waiting after this long (0: wait forever)")
	grace := fs.Duration("grace", 10*time.Second, "after a lost lock, how long the command has between SIGTERM and SIGKILL")
	if code, ok := e.parse("run", fs, args); !ok {
		return code
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" {
		return e.usageError("run", "want KEY -- CMD [ARGS...]")
	}
	key, command := rest[0], rest[2:]
	if *ttl <= 0 || *timeout < 0 || *grace < 0 {
		return e.usageError("run", "--ttl must be > 0, --timeout and --grace >= 0")
	}
	locks, code := e.open(ctx, "run", e.backendURL(*backendFlag, ""), lock.WithTTL(*ttl))
	if locks == nil {
		return code
	}
	defer locks.Close()

	l, code := e.acquire(ctx, locks, key, *wait && !*noWait, *timeout)
	if l == nil {
		return code
	}
	return e.runHolding(ctx, l, command, *grace)
}

func (e *environment) acquire(ctx context.Context, locks *lock.Client, key string, wait bool, timeout time.Duration) (*lock.Lease, int) {
	actx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var l *lock.Lease
	var err error
	if wait {
		l, err = locks.Acquire(actx, key)
	} else {
		l, err = locks.TryAcquire(actx, key)
	}
	switch {
	case err == nil:
		return l, exitOK
	case errors.Is(err, lock.ErrInvalid):
		return nil, e.usageError("run", "%v", oneLine(err))
	case errors.Is(err, lock.ErrLocked), errors.Is(err, context.DeadlineExceeded), errors.Is(err, lock.ErrContended):
		fmt.Fprintf(e.stderr, "lockctl run: %q not acquired: %v\n", key, oneLine(err))
		return nil, exitNotAcquired
	}
	fmt.Fprintf(e.stderr, "lockctl run: %v\n", oneLine(err))
	return nil, exitBackend
}

// runHolding runs the command while l is held, stops it if l is lost, and
// releases l when it exits.
func (e *environment) runHolding(ctx context.Context, l *lock.Lease, command []string, grace time.Duration) int {
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.TTL())
		defer cancel()
		if err := l.Release(rctx); err != nil && !errors.Is(err, lock.ErrLost) {
			fmt.Fprintf(e.stderr, "lockctl run: release: %v\n", oneLine(err))
		}
	}()
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, e.stdout, e.stderr
	cmd.Env = append(os.Environ(),
		"LOCK_KEY="+l.Key(),
		"LOCK_FENCE="+strconv.FormatUint(l.Fence(), 10),
		"LOCK_TOKEN="+l.Token(),
		"LOCK_TTL="+l.TTL().String(),
	)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(e.stderr, "lockctl run: %v\n", err)
		return 127
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	// Pass on the signals that ask lockctl to stop.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	lost := false
	var kill *time.Timer
	for {
		select {
		case err := <-exited:
			if kill != nil {
				kill.Stop()
			}
			if lost {
				fmt.Fprintf(e.stderr, "lockctl run: lock %q lost while the command ran (%v); the command was stopped\n", l.Key(), oneLine(l.Err()))
				return exitLost
			}
			return exitStatus(err)
		case s := <-sigs:
			cmd.Process.Signal(s)
		case <-l.Done():
			if lost || errors.Is(l.Err(), lock.ErrReleased) {
				continue
			}
			lost = true
			fmt.Fprintf(e.stderr, "lockctl run: lock %q lost: %v; sending SIGTERM\n", l.Key(), oneLine(l.Err()))
			cmd.Process.Signal(syscall.SIGTERM)
			kill = time.AfterFunc(grace, func() { cmd.Process.Kill() })
		}
	}
}

// exitStatus maps a child's exit to lockctl's exit status: its code, or
// 128+signal when a signal ended it.
func exitStatus(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return exitBackend
}

// status: lockctl status [--backend URL] KEY
func (e *environment) status(ctx context.Context, args []string) int {
	fs := newFlags("status")
	backendFlag := fs.String("backend", "", "backend URL")
	if code, ok := e.parse("status", fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("status", "want exactly one KEY")
	}
	key := fs.Arg(0)
	locks, code := e.open(ctx, "status", e.backendURL(*backendFlag, ""))
	if locks == nil {
		return code
	}
	defer locks.Close()
	in, ok := locks.Backend().(backend.Inspector)
	if !ok {
		fmt.Fprintf(e.stderr, "lockctl status: this backend cannot tell who holds a key\n")
		return exitBackend
	}
	h, err := in.Inspect(ctx, key)
	if err != nil {
		fmt.Fprintf(e.stderr, "lockctl status: %v\n", oneLine(err))
		return exitBackend
	}
	if !h.Held {
		fmt.Fprintf(e.stdout, "%s: free\n", key)
		return exitOK
	}
	fmt.Fprintf(e.stdout, "%s: held by %s, fence %d, expires in %v unless renewed\n", key, short(h.Token), h.Fence, h.Remaining.Round(time.Millisecond))
	return exitOK
}

func short(token string) string {
	if len(token) > 8 {
		return token[:8] + "…"
	}
	return token
}
