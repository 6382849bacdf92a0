package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/migrate"
)

// run: lockctl run [flags] KEY -- CMD [ARGS...]
func (e *environment) run(ctx context.Context, args []string) int {
	fs := newFlags("run", "[flags] KEY -- CMD [ARGS...]")
	bf := addBackendFlags(fs, "", "")
	ttl := fs.Duration("ttl", lock.DefaultTTL, "lock TTL, renewed while the command runs; at most the backend's maximum, 1m unless the URL's maxttl raises it (default: the URL's ttl, else 10s)")
	wait := fs.Bool("wait", true, "wait for the lock while another owner holds it")
	noWait := fs.Bool("no-wait", false, "fail at once (status 75) when another owner holds the lock")
	timeout := fs.Duration("timeout", 0, "give up waiting after this long, status 75; at most a year (0: wait forever; with --no-wait, the store has 3s to answer)")
	grace := fs.Duration("grace", 0, "when renewals fail, SIGTERM the command this long before the lock's deadline; at most TTL/2 (default TTL/4)")
	holder := fs.String("holder", "", "the holder description stored with the lock, which lockctl status shows (default: \"HOST PID CMD\": this host, lockctl's pid and the command's name; the command's arguments are left out, as they may carry secrets); at most 256 bytes, no control characters")
	keepEnv := fs.Bool("keep-backend-env", false, "pass "+backendEnv+" on to the command (by default it is taken out of the command's environment)")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	rest := fs.Args()
	if len(rest) >= 2 && rest[1] != "--" && strings.HasPrefix(rest[1], "-") {
		return e.usageError("run", "flag %s after KEY %s: flags go before KEY (lockctl run [flags] KEY -- CMD)", argText(rest[1]), quoted(rest[0]))
	}
	if len(rest) < 3 || rest[1] != "--" {
		return e.usageError("run", "want KEY -- CMD [ARGS...], got %s", quoted(argsText(rest)))
	}
	key, command := rest[0], slices.Clone(rest[2:])
	if err := lock.CheckKey(key); err != nil {
		return e.usageError("run", "%v", err)
	}
	if fs.set("ttl") && *ttl == 0 {
		return e.usageError("run", "--ttl must be more than 0, such as 10s")
	}
	// --grace against the TTL asked for, before any lock is taken: the
	// store grants at least that (some grant more: Consul's minimum).
	if fs.set("ttl") && fs.set("grace") && *grace > *ttl/2 {
		return e.graceError(*grace, *ttl)
	}
	url, code, ok := e.backend(bf)
	if !ok {
		return code
	}
	path, err := exec.LookPath(command[0])
	if err != nil {
		e.printf(e.stderr, "lockctl run: %v\n", err)
		return startFailure(err)
	}
	command[0] = path
	desc := *holder
	if !fs.set("holder") {
		desc = runHolder(command[0])
	} else if err := lock.CheckHolder(desc); err != nil {
		return e.usageError("run", "--holder: %v", err)
	}
	opts := []lock.Option{lock.WithHolder(desc)}
	if fs.set("ttl") { // a default must not override the URL's ttl
		opts = append(opts, lock.WithTTL(*ttl))
	}
	locks, code := e.open(ctx, "run", url, opts...)
	if locks == nil {
		return code
	}
	defer locks.Close()
	if !fs.set("ttl") {
		asked := lock.DefaultTTL
		if d, ok := urlTTL(url); ok {
			asked = d
		}
		if fs.set("grace") && *grace > asked/2 {
			return e.graceError(*grace, asked)
		}
	}

	l, code := e.acquire(ctx, locks, key, *wait && !*noWait, *timeout)
	if l == nil {
		return code
	}
	g := *grace
	switch {
	case !fs.set("grace"):
		g = l.TTL() / 4
	case g > l.TTL()/2: // a store that granted less than asked
		release(ctx, l, l.TTL())
		return e.graceError(g, l.TTL())
	}
	return e.runHolding(ctx, l, command, g, *keepEnv)
}

// graceError reports a --grace too long for the TTL.
func (e *environment) graceError(grace, ttl time.Duration) int {
	return e.usageError("run", "--grace %v is more than half the TTL %v: renewals keep at most 2/3 of the TTL ahead, so the command would be stopped while they work; use at most %v", grace, ttl, ttl/2)
}

func (e *environment) acquire(ctx context.Context, locks *lock.Client, key string, wait bool, timeout time.Duration) (*lock.Lease, int) {
	actx := ctx
	if !wait && timeout == 0 {
		timeout = noWaitLimit // one attempt; a store that does not answer is a failure
	}
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
		return nil, e.usageError("run", "%v", err)
	case errors.Is(err, lock.ErrLocked), errors.Is(err, lock.ErrContended):
		// Held by another owner: at once (--no-wait), or still when
		// --timeout ran out (the error wraps both).
		why := "held by another owner"
		if errors.Is(err, context.DeadlineExceeded) {
			why = fmt.Sprintf("still held by another owner when --timeout %v ran out", timeout)
		}
		e.printf(e.stderr, "lockctl run: %s not acquired: %s\n", quoted(key), why)
		return nil, exitNotAcquired
	case errors.Is(err, context.DeadlineExceeded):
		e.printf(e.stderr, "lockctl run: the backend did not answer in time: %v\n", err)
		return nil, exitBackend
	}
	e.printf(e.stderr, "lockctl run: the backend failed: %v\n", err)
	return nil, exitBackend
}

// noWaitLimit bounds a --no-wait attempt given no --timeout.
const noWaitLimit = 3 * time.Second

// release releases l, waiting at most limit.
func release(ctx context.Context, l *lock.Lease, limit time.Duration) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
	defer cancel()
	if err := l.Release(rctx); err != nil && !errors.Is(err, lock.ErrLost) {
		return err
	}
	return nil
}

// runHolding runs the command while l is held and releases l when the
// command and every process of its group are gone. The timeline:
//
//   - lockctl renews the lease every TTL/3 while the command runs, and
//     tells the guard each new deadline: the guard kills the command's
//     group when the deadline it knows passes, even while lockctl is
//     stopped or starved of CPU (see guard.go);
//   - when renewals fail and the lease's remaining validity falls to
//     grace, the command's process group gets SIGTERM: it has until the
//     deadline to finish;
//   - at the deadline (or at once when the store says the lock is gone),
//     the group gets SIGKILL and lockctl exits 76;
//   - SIGTSTP stops the command's group and lockctl; SIGCONT continues
//     both. The lease is not renewed while lockctl is stopped: a stop that
//     outlasts the deadline ends the command there.
//
// The deadline comes before the store can expire the lock (package lock
// subtracts a drift allowance), so the command is stopped before another
// owner can get the lock, unless the store itself drops it early (a key
// deleted from outside, a store that lost its data): then only fencing
// protects the resource.
func (e *environment) runHolding(ctx context.Context, l *lock.Lease, command []string, grace time.Duration, keepBackendEnv bool) int {
	env := os.Environ()
	if !keepBackendEnv {
		// The URL may carry credentials: not for the command and all it
		// starts. The guard passes on the environment it is given.
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, backendEnv+"=") })
	}
	env = append(env,
		"LOCK_KEY="+l.Key(),
		"LOCK_FENCE="+strconv.FormatUint(l.Fence(), 10),
		"LOCK_TOKEN="+l.Token(),
		"LOCK_TTL="+l.TTL().String(),
	)
	// Pass on the signals that ask lockctl to end, stop or continue, to the
	// whole group: caught from before the command starts, so that none
	// reaches lockctl alone. One channel keeps a stop and a continue in
	// their order.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGTSTP, syscall.SIGCONT)
	defer signal.Stop(sigs)

	g, err := startGroup(command, env, os.Stdin, e.stdout, e.stderr, l.Deadline)
	if err != nil {
		e.printf(e.stderr, "lockctl run: %v\n", err)
		release(ctx, l, min(l.TTL(), 5*time.Second))
		return exitBackend
	}
	defer g.close()

	// The guard learns of renewals from here: look at the deadline often
	// enough that it hears of one long before the deadline it knows.
	tell := time.NewTicker(max(l.TTL()/10, time.Millisecond))
	defer tell.Stop()

	term := time.NewTimer(time.Until(l.Deadline().Add(-grace)))
	defer term.Stop()
	stopped := "" // why lockctl stopped the command, if it did
	for {
		select {
		case x := <-g.exited: // the guard killed what the command left behind
			g.close()
			if stopped == "" && x.atDeadline {
				stopped = "its deadline passed before lockctl could tell the guard of a renewal (lockctl stopped or starved of CPU, or renewals failing); the guard killed the command"
			}
			if stopped == "" {
				if err := release(ctx, l, min(l.TTL(), 5*time.Second)); err != nil {
					e.printf(e.stderr, "lockctl run: release: %v\n", err)
				}
				return x.status
			}
			release(ctx, l, time.Second)
			e.printf(e.stderr, "lockctl run: lock %s: %s\n", quoted(l.Key()), stopped)
			return exitLost
		case <-tell.C:
			if d := l.Deadline(); !d.Equal(g.told) {
				g.tell(d) // fails only when the guard is gone: g.exited says so
			}
		case s := <-sigs:
			g.signal(s.(syscall.Signal))
			if s == syscall.SIGTSTP {
				// Stop with the command. SIGSTOP, not SIGTSTP: see guard.go.
				e.printf(e.stderr, "lockctl run: stopped: lock %s is not renewed while lockctl is stopped; continue it within %v or the command is killed\n", quoted(l.Key()), time.Until(l.Deadline()).Round(time.Millisecond))
				syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			}
		case <-term.C:
			left := time.Until(l.Deadline())
			if left > grace {
				term.Reset(left - grace) // renewed meanwhile
				continue
			}
			if stopped == "" && l.Err() == nil {
				stopped = fmt.Sprintf("renewals failed; SIGTERM sent to the command %v before the lock's deadline", left.Round(time.Millisecond))
				e.printf(e.stderr, "lockctl run: lock %s: renewals are failing and the lock is valid for %v more: sending SIGTERM to the command\n", quoted(l.Key()), left.Round(time.Millisecond))
				g.signal(syscall.SIGTERM)
			}
		case <-l.Done():
			if errors.Is(l.Err(), lock.ErrReleased) {
				continue
			}
			stopped = fmt.Sprintf("lost while the command ran (%v); the command was killed", e.msg(l.Err()))
			e.printf(e.stderr, "lockctl run: lock %s lost: %v; sending SIGKILL to the command\n", quoted(l.Key()), l.Err())
			g.signal(syscall.SIGKILL)
			<-g.exited
			g.close()
			release(ctx, l, time.Second)
			e.printf(e.stderr, "lockctl run: lock %s: %s\n", quoted(l.Key()), stopped)
			return exitLost
		}
	}
}

// runHolder is run's default holder description: "HOST PID CMD", this
// host, lockctl's pid (the process that holds the lock) and the command's
// base name, without its arguments: they may carry secrets, and anyone who
// can read the store reads the description.
func runHolder(path string) string { return lock.HolderFor(filepath.Base(path)) }

// status: lockctl status [--backend URL | --backend-file PATH] KEY
//
// In phases 2 and 3 of a migrate:// URL, which hold each lock on both
// stores, it shows the holder on each store, one line each.
func (e *environment) status(ctx context.Context, args []string) int {
	fs := newFlags("status", "[--backend URL | --backend-file PATH] KEY")
	fs.about = `Shows who holds KEY: its holder's token (the first 8 characters) and
description (lock.WithHolder; lockctl run stores "HOST PID CMD"), the store's
fence and the time left before the store expires it. In phases 2 and 3 of a
migrate:// URL (both stores), one line for each store: "KEY: from: ...",
"KEY: to: ...", each with the store's own fence (a lease's fence adds the
fence epoch in its top bits).`
	bf := addBackendFlags(fs, "", "")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return e.usageError("status", "want exactly one KEY, got %d arguments", fs.NArg())
	}
	key := fs.Arg(0)
	if err := lock.CheckKey(key); err != nil {
		return e.usageError("status", "%v", err)
	}
	url, code, ok := e.backend(bf)
	if !ok {
		return code
	}
	locks, code := e.open(ctx, "status", url)
	if locks == nil {
		return code
	}
	defer locks.Close()
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if from, to, ok := migrate.Stores(locks.Backend()); ok {
		return e.statusOfStores(ictx, key, from, to)
	}
	in, ok := locks.Backend().(backend.Inspector)
	if !ok {
		e.printf(e.stderr, "lockctl status: this backend cannot tell who holds a key\n")
		return exitBackend
	}
	h, err := in.Inspect(ictx, key)
	if err != nil {
		e.printf(e.stderr, "lockctl status: %v\n", err)
		return exitBackend
	}
	e.printf(e.stdout, "%s: %s\n", key, holderText(h, short(h.Token)))
	return exitOK
}

// statusOfStores is status in phases 2 and 3 of a move: the holder of key
// on each of the two stores, one line each, read at once. Nothing is
// printed to stdout unless both stores answer.
func (e *environment) statusOfStores(ctx context.Context, key string, from, to backend.Backend) int {
	stores := []struct {
		name string
		b    backend.Backend
		h    backend.Holder
		err  error
	}{{name: "from", b: from}, {name: "to", b: to}}
	var wg sync.WaitGroup
	for i := range stores {
		s := &stores[i]
		in, ok := s.b.(backend.Inspector)
		if !ok {
			e.printf(e.stderr, "lockctl status: the %s store cannot tell who holds a key\n", s.name)
			return exitBackend
		}
		wg.Go(func() { s.h, s.err = in.Inspect(ctx, key) })
	}
	wg.Wait()
	for _, s := range stores {
		if s.err != nil {
			e.printf(e.stderr, "lockctl status: the %s store: %v\n", s.name, s.err)
			return exitBackend
		}
	}
	for _, s := range stores {
		e.printf(e.stdout, "%s: %s: %s\n", key, s.name, holderText(s.h, short(s.h.Token)))
	}
	return exitOK
}

// holderText says who holds a key: "free", or "held by TOKEN, fence F,
// expires in D unless renewed", or "..., time left unknown" when the store
// does not say (a Consul session's); with the holder's description after
// the token, in parentheses, when the store keeps one. tok is the token as shown: status cuts
// it short, break shows it whole. Not escaped: print it through printf.
func holderText(h backend.Holder, tok string) string {
	if h.Label != "" {
		tok += " (" + h.Label + ")"
	}
	switch {
	case !h.Held:
		return "free"
	case h.Remaining <= 0:
		return fmt.Sprintf("held by %s, fence %d, time left unknown", tok, h.Fence)
	}
	return fmt.Sprintf("held by %s, fence %d, expires in %v unless renewed", tok, h.Fence, h.Remaining.Round(time.Millisecond))
}

// short is the first 8 characters of token (the store's text: print it
// shown).
func short(token string) string {
	if utf8.RuneCountInString(token) <= 8 {
		return token
	}
	n := 0
	for i := range token {
		if n == 8 {
			return token[:i] + "…"
		}
		n++
	}
	return token
}
