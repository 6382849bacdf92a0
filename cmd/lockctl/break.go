package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/migrate"
)

// breakAbout is break's --help text.
const breakAbout = `Removes a stuck lock. Reads KEY's holder and shows it on stderr (its whole
token, the store's fence, the time the store gives it before it expires),
then asks "remove it? [y/N]". The answer is a line of standard input, read
whether or not it is a terminal (echo y | lockctl break KEY works); anything
but y or yes, or no line at all, removes nothing. --yes removes without
asking. After the answer the holder is read again, and nothing is removed
if it changed meanwhile.
The lock is released with its holder's token, as the holder itself would
release it: the store's fence counter is kept, so the next holder's fence
is above the removed one's, and a holder that changed since it was read
(released, expired, taken over) is left alone. A holder that still runs
finds its lock lost at its next renewal, and a resource that checks fences
refuses its writes once a later holder wrote.
In phases 2 and 3 of a migrate:// URL (both stores), the holder on each
store is shown and removed, one line each ("KEY: from: ...", "KEY: to: ...").
Output: "KEY: removed the holder TOKEN, fence F; ..." for each holder
removed, "KEY: free: nothing to remove" when nothing is held.
Exit status: 0 when every holder found was removed; 1 when a holder was not
removed for a reason of the lock's: nothing was held, the answer was not
yes, the holder changed, or its token is not one of this library's (32
lower-case hex digits), which break cannot release; 2 for bad usage; 69 when a store
failed, did not answer within 10s, or cannot tell who holds a key.`

// storeLimit bounds each read and each release of break: a store that
// does not answer is a failure, not a hang.
const storeLimit = 10 * time.Second

// maxAnswer bounds the line read as the answer to break's question.
const maxAnswer = 1 << 10

// breakStore is one store that break reads and releases KEY on.
type breakStore struct {
	name string // "from" or "to" in phases 2 and 3 of a move; "" for the only store
	b    backend.Backend
	h    backend.Holder // as read
}

// label is "" for the only store, else "NAME: ", for the lines of a store.
func (s *breakStore) label() string {
	if s.name == "" {
		return ""
	}
	return s.name + ": "
}

// breakLock: lockctl break [flags] KEY
func (e *environment) breakLock(ctx context.Context, args []string) int {
	const cmd = "break"
	fs := newFlags(cmd, "[--backend URL | --backend-file PATH] [--yes] KEY")
	fs.about = breakAbout
	bf := addBackendFlags(fs, "", "")
	yes := fs.Bool("yes", false, "remove the holder without asking")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	rest := fs.Args()
	if len(rest) >= 2 && strings.HasPrefix(rest[1], "-") {
		return e.usageError(cmd, "flag %s after KEY %s: flags go before KEY (lockctl break [flags] KEY)", argText(rest[1]), quoted(rest[0]))
	}
	if len(rest) != 1 {
		return e.usageError(cmd, "want exactly one KEY, got %d arguments", len(rest))
	}
	key := rest[0]
	if err := lock.CheckKey(key); err != nil {
		return e.usageError(cmd, "%v", err)
	}
	url, code, ok := e.backend(bf)
	if !ok {
		return code
	}
	locks, code := e.open(ctx, cmd, url)
	if locks == nil {
		return code
	}
	defer locks.Close()
	stores := []*breakStore{{b: locks.Backend()}}
	if from, to, ok := migrate.Stores(locks.Backend()); ok {
		stores = []*breakStore{{name: "from", b: from}, {name: "to", b: to}}
	}
	return e.breakOn(ctx, key, stores, *yes)
}

// breakOn is break of key on stores: read each store's holder, ask
// (unless yes), and release each holder by its token.
func (e *environment) breakOn(ctx context.Context, key string, stores []*breakStore, yes bool) int {
	if code, ok := e.readHolders(ctx, key, stores); !ok {
		return code
	}
	var held []*breakStore
	for _, s := range stores {
		if !s.h.Held {
			continue
		}
		held = append(held, s)
		if !isLockToken(s.h.Token) {
			// A value that this library did not write (or none): a
			// release compares the store's value with a token, and no
			// owner has this one.
			why := fmt.Sprintf("held by %s, which is not a token of this library (32 lower-case hex digits)", quoted(s.h.Token))
			if s.h.Token == "" {
				why = "held, and the store does not say by which token"
			}
			e.printf(e.stderr, "lockctl break: %s: %s%s: break releases a lock by its holder's token, so it cannot remove this one; nothing removed\n", quoted(key), s.label(), why)
			return exitNotBroken
		}
	}
	if len(held) == 0 {
		for _, s := range stores {
			e.printf(e.stdout, "%s: %sfree: nothing to remove\n", key, s.label())
		}
		return exitNotBroken
	}
	if !yes {
		if code, ok := e.confirm(key, stores); !ok {
			return code
		}
		// The answer may have taken minutes: read again, and go on only
		// when every store's holder is still the one shown. (The
		// release is token-checked all the same; this read tells a
		// holder that changed meanwhile from one removed.)
		shown := make([]backend.Holder, len(stores))
		for i, s := range stores {
			shown[i] = s.h
		}
		if code, ok := e.readHolders(ctx, key, stores); !ok {
			return code
		}
		changed := false
		for i, s := range stores {
			if s.h.Held != shown[i].Held || s.h.Token != shown[i].Token {
				changed = true
				e.printf(e.stderr, "lockctl break: %s: %sthe holder changed while the question waited; now %s\n", quoted(key), s.label(), holderText(s.h, s.h.Token))
			}
		}
		if changed {
			e.printf(e.stderr, "lockctl break: %s: nothing removed; run lockctl break again to see the holder now\n", quoted(key))
			return exitNotBroken
		}
	}
	return e.releaseHolders(ctx, key, held)
}

// readHolders reads key's holder on each store into its h. ok is false,
// with the status to return, when a store cannot say or failed.
func (e *environment) readHolders(ctx context.Context, key string, stores []*breakStore) (code int, ok bool) {
	for _, s := range stores {
		in, ok := s.b.(backend.Inspector)
		if !ok {
			e.printf(e.stderr, "lockctl break: %sthis backend cannot tell who holds a key, so break cannot release its holder by token; nothing removed\n", storeOf(s))
			return exitBackend, false
		}
		ictx, cancel := context.WithTimeout(ctx, storeLimit)
		h, err := in.Inspect(ictx, key)
		late := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		switch {
		case late:
			e.printf(e.stderr, "lockctl break: %sdid not answer within %v: %v; nothing removed\n", storeOf(s), storeLimit, err)
			return exitBackend, false
		case err != nil:
			e.printf(e.stderr, "lockctl break: %s%v; nothing removed\n", storeOf(s), err)
			return exitBackend, false
		}
		s.h = h
	}
	return exitOK, true
}

// confirm shows each store's holder of key on stderr and asks whether to
// remove it; the answer is a line of e.stdin. ok is true for y or yes.
func (e *environment) confirm(key string, stores []*breakStore) (code int, ok bool) {
	for _, s := range stores {
		e.printf(e.stderr, "%s: %s%s\n", key, s.label(), holderText(s.h, s.h.Token))
	}
	fmt.Fprint(e.stderr, "remove it? [y/N] ")
	answer, err := readAnswer(e.stdin)
	if !isTerminal(e.stdin) {
		// Nobody typed it where the question was shown: say what was
		// read.
		if err == nil {
			e.printf(e.stderr, "%s (read from standard input)\n", quoted(answer))
		} else {
			fmt.Fprintln(e.stderr)
		}
	}
	switch a := strings.ToLower(strings.TrimSpace(answer)); {
	case err != nil && answer == "":
		e.printf(e.stderr, "lockctl break: no answer (%v): nothing removed; answer y or yes, or give --yes\n", err)
		return exitNotBroken, false
	case a != "y" && a != "yes":
		e.printf(e.stderr, "lockctl break: the answer was %s, not y or yes: nothing removed\n", quoted(strings.TrimSpace(answer)))
		return exitNotBroken, false
	}
	return exitOK, true
}

// releaseHolders releases key on each store of held for the holder read
// there (its h), with the holder's token: a store whose holder changed
// since keeps its lock, and says so (ErrNotHeld).
func (e *environment) releaseHolders(ctx context.Context, key string, held []*breakStore) int {
	code := exitOK
	for _, s := range held {
		rctx, cancel := context.WithTimeout(ctx, storeLimit)
		err := s.b.Release(rctx, key, s.h.Token)
		late := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		switch {
		case err == nil:
			e.printf(e.stdout, "%s: %sremoved the holder %s, fence %d; the fence counter is kept: the next holder's fence is above %d\n", key, s.label(), s.h.Token, s.h.Fence, s.h.Fence)
		case errors.Is(err, backend.ErrNotHeld):
			e.printf(e.stderr, "lockctl break: %s: %sthe holder changed since it was read (released, expired or taken by another owner): nothing removed\n", quoted(key), s.label())
			if code == exitOK {
				code = exitNotBroken
			}
		case late:
			e.printf(e.stderr, "lockctl break: %s: %sthe store did not answer the release within %v: %v; whether the holder was removed is unknown (see lockctl status)\n", quoted(key), s.label(), storeLimit, err)
			code = exitBackend
		default:
			e.printf(e.stderr, "lockctl break: %s: %srelease: %v; whether the holder was removed is unknown (see lockctl status)\n", quoted(key), s.label(), err)
			code = exitBackend
		}
	}
	return code
}

// storeOf is "the NAME store: " for a store of a move, else "".
func storeOf(s *breakStore) string {
	if s.name == "" {
		return ""
	}
	return "the " + s.name + " store: "
}

// isLockToken reports whether s is an owner token as package lock makes
// them: 32 lower-case hex digits.
func isLockToken(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// readAnswer reads one line from r, one byte at a time so that nothing
// after it is consumed, without its line ending; at most maxAnswer bytes.
// err is io.EOF (or the read's error) when the input ended before a
// newline.
func readAnswer(r io.Reader) (string, error) {
	var b strings.Builder
	var c [1]byte
	for b.Len() < maxAnswer {
		n, err := r.Read(c[:])
		if n == 1 {
			if c[0] == '\n' {
				return strings.TrimSuffix(b.String(), "\r"), nil
			}
			b.WriteByte(c[0])
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) && b.Len() > 0 {
				return b.String(), nil // a last line without a newline
			}
			if errors.Is(err, io.EOF) {
				err = errors.New("end of standard input")
			}
			return b.String(), err
		}
	}
	return b.String(), nil
}

// isTerminal reports whether r is a terminal.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
