package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/migrate"
)

// migrateUsage is what "lockctl migrate" says of its subcommands.
const migrateUsage = `usage: lockctl migrate check [BACKEND] [--settle D] [--keys-file PATH | KEY...]
  check: are the keys clear to move from the phase of BACKEND, a migrate:// URL
  (migrate://?from=URL&to=URL&phase=N), to phase N+1?
"lockctl migrate check --help" says more.`

// migrate: lockctl migrate SUBCOMMAND ...
func (e *environment) migrate(ctx context.Context, args []string) int {
	if len(args) == 0 {
		return e.usageError("migrate", "want a subcommand: lockctl migrate check [BACKEND] [--settle D] [--keys-file PATH | KEY...]")
	}
	switch args[0] {
	case "check":
		return e.migrateCheck(ctx, args[1:])
	case "help", "-h", "--help":
		fmt.Fprintln(e.stdout, migrateUsage)
		return exitOK
	}
	return e.usageError("migrate", "unknown subcommand %s; valid: check", quoted(argText(args[0])))
}

// migrateCheckAbout is migrate check's --help text.
const migrateCheckAbout = `Says whether each KEY is clear for the deployment to move from phase N of
BACKEND, a migrate:// URL (migrate://?from=URL&to=URL&phase=N, N from 1 to 3),
to phase N+1: whether no holder is left on a store that phase N+1 drops.
For phase 2 (N=1) every key is clear: it shares the from store with phase 1.
Phases 3 and 4 must not meet a phase 1 instance, which holds its locks on the
from store only: a key held on the from store and not, for the same token, on
the to store is not clear. Such a key is read again after --settle first:
phases 2 and 3 hold a key on one store for a moment while they take or
release it. Both stores are read, in every phase; each must tell who holds a
key. lockctl sees holders, not instances: roll phase N out to every instance,
wait the longest TTL in use, run this check, then start phase N+1.
Keys: the KEY arguments, or --keys-file PATH: one key a line, surrounding
whitespace trimmed, blank lines and lines starting with # skipped; PATH -
reads standard input. There is no --prefix: the stores cannot list their
keys, so name every key the deployment locks.
Output: one line a key, "KEY: clear" or "KEY: NOT clear: WHY (each store's
holder)", then a summary. Exit status: 0 when every key is clear, 1 when one
is not, 2 for bad usage, 69 when a store failed or did not answer in time.`

// Limits of migrate check's key list.
const (
	maxKeysFile = 64 << 20 // bytes read from --keys-file
	maxKeyLine  = 64 << 10 // bytes of one line of it
)

// migrateCheck: lockctl migrate check [flags] [--keys-file PATH | KEY...]
func (e *environment) migrateCheck(ctx context.Context, args []string) int {
	const cmd = "migrate check"
	fs := newFlags(cmd, "[--backend URL | --backend-file PATH] [--settle D] [--keys-file PATH | KEY...]")
	fs.about = migrateCheckAbout
	bf := addBackendFlags(fs, "", ", a migrate:// URL")
	settle := fs.Duration("settle", time.Second, "read a key found not clear again after this long, for an acquire or release of phases 2 and 3 to finish; at most a year (0: once)")
	keysFile := fs.String("keys-file", "", "read the keys from the file at `PATH`, one a line (blank lines and # lines skipped); - for standard input")
	prefix := fs.String("prefix", "", "not supported for any `PREFIX`: the stores cannot list their keys; give the keys as KEY... or --keys-file")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.set("prefix") {
		return e.usageError(cmd, "--prefix %s: the stores cannot list their keys, so lockctl cannot find the keys under a prefix; name them as KEY arguments or in --keys-file PATH (one a line)", quoted(*prefix))
	}
	for _, a := range fs.Args() {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && fs.Lookup(name) != nil {
			return e.usageError(cmd, "flag %s after a KEY: flags go before the keys (lockctl migrate check [flags] KEY...)", argText(a))
		}
	}
	var keys []string
	switch {
	case fs.set("keys-file") && fs.NArg() > 0:
		return e.usageError(cmd, "give KEY arguments or --keys-file, not both")
	case fs.set("keys-file"):
		var err error
		if keys, err = e.readKeys(*keysFile); err != nil {
			return e.usageError(cmd, "--keys-file: %s", err.Error())
		}
	default:
		keys = fs.Args()
	}
	keys = dedupe(keys)
	for _, k := range keys {
		if err := lock.CheckKey(k); err != nil {
			return e.usageError(cmd, "key %s: %v", quoted(cut(k)), err)
		}
	}
	if len(keys) == 0 {
		return e.usageError(cmd, "no keys: give KEY arguments or --keys-file PATH (one key a line, - for standard input); the stores cannot list their keys")
	}
	raw, code, ok := e.backend(bf)
	if !ok {
		return code
	}
	phase, code, ok := e.migratePhase(raw)
	if !ok {
		return code
	}
	from, to, closeStores, code := e.openStores(ctx, raw, phase)
	if closeStores == nil {
		return code
	}
	defer closeStores()
	for _, s := range []struct {
		name string
		b    backend.Backend
	}{{"from", from}, {"to", to}} {
		if _, ok := s.b.(backend.Inspector); !ok {
			e.printf(e.stderr, "lockctl %s: the %s store cannot tell who holds a key, so its keys cannot be checked\n", cmd, s.name)
			return exitBackend
		}
	}

	// The stores have 10s, plus 50ms a key and the settle time, for every
	// read: a store that does not answer is a failure, not a hang.
	limit := 10*time.Second + *settle + time.Duration(len(keys))*50*time.Millisecond
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	next := phase + 1
	checks, err := migrate.Check(cctx, from, to, next, keys, *settle)
	switch {
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		e.printf(e.stderr, "lockctl %s: the stores did not answer in time (%v for %d keys): %s\n", cmd, limit, len(keys), strings.TrimPrefix(e.msg(err), "migrate: "))
		return exitBackend
	case err != nil:
		e.printf(e.stderr, "lockctl %s: %s\n", cmd, strings.TrimPrefix(e.msg(err), "migrate: "))
		return exitBackend
	}
	notClear := 0
	for _, c := range checks {
		if c.Clear {
			e.printf(e.stdout, "%s: clear\n", c.Key)
			continue
		}
		notClear++
		e.printf(e.stdout, "%s: NOT clear: %s (from: %s; to: %s)\n", c.Key, c.Why, holderText(c.From, short(c.From.Token)), holderText(c.To, short(c.To.Token)))
	}
	move := fmt.Sprintf("to move from phase %v to phase %v", phase, next)
	if notClear == 0 {
		all := "all "
		if len(checks) == 1 {
			all = ""
		}
		e.printf(e.stdout, "%s%d %s clear %s\n", all, len(checks), plural(len(checks), "key", "keys"), move)
		return exitOK
	}
	e.printf(e.stdout, "%d of %d %s NOT clear %s: make sure every instance runs phase %d, wait the longest TTL in use, and check again\n", notClear, len(checks), plural(len(checks), "key", "keys"), move, int(phase))
	return exitNotClear
}

// plural is one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// migratePhase returns the phase of raw, a migrate:// URL, for a check of
// the next phase: 1 to 3. Any other URL, or phase 4, is a usage error; a
// phase that is no phase is left to the scheme to refuse (openStores),
// with its message.
func (e *environment) migratePhase(raw string) (migrate.Phase, int, bool) {
	const cmd = "migrate check"
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != migrate.SchemeName {
		return 0, e.usageError(cmd, "want a %s:// URL (migrate://?from=URL&to=URL&phase=N) as the backend, got %s", migrate.SchemeName, quoted(lock.RedactURL(raw))), false
	}
	p, err := strconv.Atoi(u.Query().Get("phase"))
	switch {
	case err != nil:
		return 0, exitOK, true // refused when opened, as lock.Open refuses it
	case p == int(migrate.ToOnly):
		return 0, e.usageError(cmd, "phase %v is the last phase of a move: there is no next phase to check for", migrate.ToOnly), false
	}
	return migrate.Phase(p), exitOK, true
}

// openStores opens the two stores of raw, a migrate:// URL of the given
// phase: as the scheme opens them (which also checks the whole URL), and
// in phase 1, which opens only From, To beside it. closeStores closes
// them; it is nil, with the status to return, on an error.
func (e *environment) openStores(ctx context.Context, raw string, phase migrate.Phase) (from, to backend.Backend, closeStores func(), code int) {
	const cmd = "migrate check"
	failed := func(store string, err error) int {
		if store != "" {
			store = "the " + store + " store: "
		}
		if errors.Is(err, lock.ErrUnknownScheme) || errors.Is(err, lock.ErrInvalid) {
			return e.usageError(cmd, "%s%v", store, err)
		}
		e.printf(e.stderr, "lockctl %s: %s%v\n", cmd, store, err)
		return exitBackend
	}
	b, _, err := lock.DefaultURLMux().OpenBackend(ctx, raw)
	if err != nil {
		return nil, nil, nil, failed("", err)
	}
	if from, to, ok := migrate.Stores(b); ok { // phases 2 and 3
		return from, to, func() { b.Close() }, exitOK
	}
	if phase != migrate.FromOnly {
		b.Close()
		e.printf(e.stderr, "lockctl %s: the %s:// URL of phase %v did not open both stores\n", cmd, migrate.SchemeName, phase)
		return nil, nil, nil, exitBackend
	}
	// Phase 1: b is From itself. To as the scheme opens it in the later
	// phases: a store's URL, without the client's parameters.
	u, _ := url.Parse(raw) // migratePhase parsed it
	toURL := u.Query().Get("to")
	if tu, err := url.Parse(toURL); err == nil && tu.Scheme == migrate.SchemeName {
		b.Close()
		return nil, nil, nil, e.usageError(cmd, "to is a %s:// URL; want a store's URL", migrate.SchemeName)
	}
	t, opts, err := lock.DefaultURLMux().OpenBackend(ctx, toURL)
	if err != nil {
		b.Close()
		return nil, nil, nil, failed("to", err)
	}
	if len(opts) > 0 {
		b.Close()
		t.Close()
		return nil, nil, nil, e.usageError(cmd, "to has client parameters (ttl, drift, maxhold, autorenew), which phases 2 to 4 refuse there; give them on the migrate URL")
	}
	return b, t, func() { b.Close(); t.Close() }, exitOK
}

// readKeys reads the keys of --keys-file path ("-": standard input): one
// a line, surrounding whitespace trimmed, blank lines and lines starting
// with # skipped. Its errors are for a usage error.
func (e *environment) readKeys(path string) ([]string, error) {
	var r io.Reader
	name := path
	switch path {
	case "":
		return nil, errors.New("empty path; want --keys-file PATH, a file of keys one a line, or - for standard input")
	case "-":
		r, name = e.stdin, "standard input"
	default:
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	lr := &io.LimitedReader{R: r, N: maxKeysFile + 1}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, 4096), maxKeyLine)
	var keys []string
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := lock.CheckKey(line); err != nil {
			return nil, fmt.Errorf("%s, line %d: key %s: %s", name, n, quoted(cut(line)), strings.TrimPrefix(err.Error(), "lock: "))
		}
		keys = append(keys, line)
	}
	switch err := sc.Err(); {
	case errors.Is(err, bufio.ErrTooLong):
		return nil, fmt.Errorf("%s: a line longer than %d KiB; want one key a line", name, maxKeyLine>>10)
	case err != nil:
		return nil, fmt.Errorf("%s: %v", name, err)
	case lr.N <= 0:
		return nil, fmt.Errorf("%s is larger than %d MiB", name, maxKeysFile>>20)
	case len(keys) == 0:
		return nil, fmt.Errorf("%s holds no keys (one a line; blank lines and # lines are skipped)", name)
	}
	return keys, nil
}

// cut is a key cut to its first 64 bytes, for a message about a key that
// may be far too long.
func cut(key string) string {
	if len(key) <= 64 {
		return key
	}
	return key[:64] + "…"
}

// dedupe returns keys without repeats, in their first order.
func dedupe(keys []string) []string {
	seen := make(map[string]bool, len(keys))
	out := keys[:0:0]
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}
