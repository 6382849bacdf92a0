package memory

import "github.com/distlock/lock/internal/flawpatch"

// The deliberate bugs of the self-test (TestSuiteCatchesFlaws,
// TestFaultRunsCatchFlaws), as edits of the production source that
// flawpatch compiles into a child test binary through -overlay. Each
// old text must be found exactly once in its file: when the code moves,
// the self-test fails naming the flaw and the file, and the edit must be
// written again for the new code.

const memoryGo = "memory/memory.go"

// edits is a flaw of memory.go: pairs of old and new text. The functions
// that flaws add to package memory have names that begin with "flaw", to
// stay clear of the test files' names.
func edits(name string, oldNew ...string) flawpatch.Flaw {
	f := flawpatch.Flaw{Name: name}
	for i := 0; i < len(oldNew); i += 2 {
		f.Edits = append(f.Edits, flawpatch.Edit{File: memoryGo, Old: oldNew[i], New: oldNew[i+1]})
	}
	return f
}

// withFile adds a new file of package memory to f.
func withFile(f flawpatch.Flaw, name, text string) flawpatch.Flaw {
	f.Edits = append(f.Edits, flawpatch.Edit{File: "memory/" + name, New: text})
	return f
}

// ttlEnforced is a flaw in the TTL the store enforces: every place that
// sets an expiry (acquire, renew, transfer) enforces enforced(ttl).
func ttlEnforced(name, enforced string, more ...string) flawpatch.Flaw {
	return edits(name, append([]string{
		"sh.locks[key] = entry{token: token, fence: fence, expires: now + ttl, label: backend.Label(ctx)}",
		"sh.locks[key] = entry{token: token, fence: fence, expires: now + " + enforced + ", label: backend.Label(ctx)}",
		"\te.expires = now + ttl\n",
		"\te.expires = now + " + enforced + "\n",
		"sh.locks[key] = entry{token: to, fence: fence, expires: now + ttl, waited: e.waited, label: backend.Label(ctx)}",
		"sh.locks[key] = entry{token: to, fence: fence, expires: now + " + enforced + ", waited: e.waited, label: backend.Label(ctx)}",
	}, more...)...)
}

// keyFlaw is a flaw in how keys are stored: every call but Watch stores
// and looks up flawStoredKey(key), the function defined in body, with the
// import imp (if any).
func keyFlaw(name, imp, body string) flawpatch.Flaw {
	f := edits(name,
		"g, err := c.acquire(ctx, key, token, ttl)", "g, err := c.acquire(ctx, flawStoredKey(key), token, ttl)",
		"g, err := c.renew(ctx, key, token, ttl)", "g, err := c.renew(ctx, flawStoredKey(key), token, ttl)",
		"c.release(ctx, key, token))", "c.release(ctx, flawStoredKey(key), token))",
		"t, err := c.transfer(ctx, key, from, to, ttl, opt)", "t, err := c.transfer(ctx, flawStoredKey(key), from, to, ttl, opt)",
		"\tsh := c.s.shard(key)\n\tsh.mu.Lock()\n\tdefer sh.mu.Unlock()\n\tnow := c.s.now()\n",
		"\tkey = flawStoredKey(key)\n\tsh := c.s.shard(key)\n\tsh.mu.Lock()\n\tdefer sh.mu.Unlock()\n\tnow := c.s.now()\n",
	)
	if imp != "" {
		imp = "\nimport " + imp + "\n"
	}
	return withFile(f, "flaw_key.go", "package memory\n"+imp+"\nfunc flawStoredKey(key string) string {\n"+body+"}\n")
}

// storeFlaws are the bugs of the store, by name.
var storeFlaws = map[string]flawpatch.Flaw{}

func init() {
	for _, f := range []flawpatch.Flaw{
		// Release deletes whoever holds the key.
		edits("release-ignores-token",
			"\tif !ok || e.token != token {\n\t\tif dead, held := sh.deadToken(key, token, now); dead {",
			"\tif !ok {\n\t\tif dead, held := sh.deadToken(key, token, now); dead {"),
		// Renew of a free or expired key takes it again.
		edits("renew-reacquires",
			"\tif !live || e.token != token {\n\t\treturn backend.Grant{}, backend.ErrNotHeld\n",
			"\tif !live || e.token != token {\n\t\tif !live || !ok {\n\t\t\te = entry{token: token, fence: s.nextFence(), expires: now + ttl}\n\t\t\tsh.locks[key] = e\n\t\t\treturn backend.Grant{Fence: e.fence, TTL: ttl}, nil\n\t\t}\n\t\treturn backend.Grant{}, backend.ErrNotHeld\n"),
		// Fences repeat: 1, 1, 2, 2, 3, ...
		edits("repeat-fence",
			"func (s *Store) nextFence() uint64 {\n",
			"func (s *Store) nextFence() uint64 {\n\treturn s.fence.Add(1)/2 + 1\n"),
		// Acquire checks and sets in two critical sections: two callers
		// can both see the key free and both "win".
		withFile(edits("non-atomic-acquire",
			"\ts := c.s\n\tsh := s.shard(key)\n\tsh.mu.Lock()\n\tnow := s.now()\n\tif dead, _ := sh.deadToken(key, token, now); dead {",
			"\treturn c.flawAcquireNonAtomic(key, token, ttl)\n\ts := c.s\n\tsh := s.shard(key)\n\tsh.mu.Lock()\n\tnow := s.now()\n\tif dead, _ := sh.deadToken(key, token, now); dead {"),
			"flaw_nonatomic.go", `package memory

import (
	"runtime"
	"time"

	"github.com/distlock/lock/backend"
)

func (c *Backend) flawAcquireNonAtomic(key, token string, ttl time.Duration) (backend.Grant, error) {
	s := c.s
	sh := s.shard(key)
	sh.mu.Lock()
	now := s.now()
	e, ok := sh.locks[key]
	sh.mu.Unlock()
	if ok && now < e.expires {
		return backend.Grant{}, backend.Locked(e.expires - now)
	}
	runtime.Gosched()
	sh.mu.Lock()
	fence := s.nextFence()
	sh.locks[key] = entry{token: token, fence: fence, expires: now + ttl}
	sh.mu.Unlock()
	return backend.Grant{Fence: fence, TTL: ttl}, nil
}
`),
		// A lock expires after 3/4 of its TTL; conflicts report no
		// remaining TTL.
		ttlEnforced("expire-early", "ttl*3/4",
			"return backend.Grant{}, backend.Locked(e.expires - now)", "return backend.Grant{}, backend.Locked(0)"),
		// TTLs are rounded down to a declared 100ms granularity.
		ttlEnforced("round-down", "ttl/(100*time.Millisecond)*(100*time.Millisecond)",
			"\t\tInProcess:    true,\n", "\t\tInProcess:    true,\n\t\tGranularity: 100 * time.Millisecond,\n"),
		// Renew extends by half the TTL asked for.
		edits("renew-short", "\te.expires = now + ttl\n", "\te.expires = now + ttl/2\n"),
		// Grant.TTL says twice the TTL the store enforces.
		edits("grant-overstated",
			"return backend.Grant{Fence: fence, TTL: ttl}, nil", "return backend.Grant{Fence: fence, TTL: 2 * ttl}, nil",
			"return backend.Grant{Fence: e.fence, TTL: ttl}, nil", "return backend.Grant{Fence: e.fence, TTL: 2 * ttl}, nil",
			"return backend.Transferred{Fence: e.fence, TTL: ttl}, nil", "return backend.Transferred{Fence: e.fence, TTL: 2 * ttl}, nil",
			"return backend.Transferred{Fence: fence, TTL: ttl, Next: next}, nil", "return backend.Transferred{Fence: fence, TTL: 2 * ttl, Next: next}, nil"),
		// Renew, release and transfer compare the first 16 characters of
		// tokens.
		withFile(edits("prefix-token",
			"if !live || e.token != token {", "if !live || !flawSameToken(e.token, token) {",
			"if !ok || e.token != token {", "if !ok || !flawSameToken(e.token, token) {",
			"case e.token == to:", "case flawSameToken(e.token, to):",
			"case e.token != from:", "case !flawSameToken(e.token, from):"),
			"flaw_token.go", `package memory

func flawSameToken(a, b string) bool {
	if len(a) >= 16 && len(b) >= 16 {
		return a[:16] == b[:16]
	}
	return a == b
}
`),
		// Release of one's own expired lock reports success.
		edits("release-expired-ok",
			"\tif now >= e.expires {\n\t\tsh.kill(s, key, token, false, now)\n",
			"\tif false {\n\t\tsh.kill(s, key, token, false, now)\n"),
		// Watch never wakes anyone.
		edits("silent-notifier",
			"\tw := &watch{s: c.s, sh: sh, key: key, ch: make(chan struct{}, 1)}\n",
			"\tw := &watch{s: c.s, sh: sh, key: key, ch: make(chan struct{}, 1)}\n\treturn w, nil // registered nowhere: never woken\n"),
		// Inspect reports expired locks as held.
		edits("inspect-expired",
			"\tif !ok || now >= e.expires {\n\t\treturn backend.Holder{}, nil\n",
			"\tif !ok {\n\t\treturn backend.Holder{}, nil\n"),
		// Inspect reports the key's last released holder, not its current
		// one.
		edits("inspect-stale",
			"\treturn backend.Holder{Held: true, Token: e.token,",
			"\tif prev, ok := sh.released[key]; ok {\n\t\treturn backend.Holder{Held: true, Token: prev, Fence: e.fence - 1, Remaining: max(0, e.expires-now)}, nil\n\t}\n\treturn backend.Holder{Held: true, Token: e.token,"),
		// A lock is stored without its holder's description.
		edits("label-dropped",
			"sh.locks[key] = entry{token: token, fence: fence, expires: now + ttl, label: backend.Label(ctx)}",
			"sh.locks[key] = entry{token: token, fence: fence, expires: now + ttl}"),
		// A lock taken without a description keeps the one of the key's
		// previous (expired or released) holder: the description of a
		// key, not of a holder.
		edits("label-of-key",
			"sh.locks[key] = entry{token: token, fence: fence, expires: now + ttl, label: backend.Label(ctx)}",
			"sh.locks[key] = entry{token: token, fence: fence, expires: now + ttl, label: cmp.Or(backend.Label(ctx), sh.locks[key].label)}",
			"import (\n", "import (\n\t\"cmp\"\n"),
		// The store says it is not in the process (as a store over a
		// network) but keeps no released token dead.
		edits("networked-no-dead-tokens", "\t\tInProcess:    true,\n", "\t\tInProcess:    false,\n"),
		// Capabilities declares FIFO; waiters race newcomers.
		edits("claims-fifo", "\t\tInProcess:    true,\n", "\t\tInProcess:    true,\n\t\tFIFO: true,\n"),
		// The fence counter starts again after 300ms without a grant.
		forgetFenceIdle("forget-fence-idle", "300*time.Millisecond"),
		// The same after 1s: a gap of a few short TTLs does not find it.
		forgetFenceIdle("forget-fence-1s", "time.Second"),
		// Calls wait for a disconnected client or a paused store
		// regardless of their context.
		edits("ignores-context",
			"func (c *Backend) enter(ctx context.Context) error {\n",
			"func (c *Backend) enter(ctx context.Context) error {\n\tctx = context.Background()\n"),
		// A transfer with a reserved fence does not check from.
		edits("transfer-any-from", "case e.token != from:", "case e.token != from && opt.Fence == 0:"),
		// A transfer forgets that an owner elsewhere waits.
		edits("transfer-forgets",
			"expires: now + ttl, waited: e.waited, label: backend.Label(ctx)}", "expires: now + ttl, label: backend.Label(ctx)}"),
		// A transfer keeps the previous expiry instead of the new TTL.
		edits("transfer-keeps-expiry",
			"expires: now + ttl, waited: e.waited, label: backend.Label(ctx)}", "expires: e.expires, waited: e.waited, label: backend.Label(ctx)}"),
		// A waiter's watch lives as long as a short TTL, as a queue
		// record on a lease of the waiter's TTL that nobody renews.
		edits("watch-expires",
			"\tw.elem = ws.PushBack(w)\n\treturn w, nil\n",
			"\tw.elem = ws.PushBack(w)\n\ttime.AfterFunc(200*time.Millisecond, func() {\n\t\tsh.mu.Lock()\n\t\tdefer sh.mu.Unlock()\n\t\tif w.elem != nil {\n\t\t\tws.Remove(w.elem)\n\t\t\tw.elem = nil\n\t\t\tif ws.Len() == 0 && sh.watchers[key] == ws {\n\t\t\t\tdelete(sh.watchers, key)\n\t\t\t}\n\t\t}\n\t})\n\treturn w, nil\n"),
		// A watch that ends stays at its place in the queue, where it
		// takes the wake-ups of the waiters behind it.
		edits("closed-watch-stays",
			"\tws.Remove(w.elem)\n\tw.elem = nil\n",
			"\tw.elem = nil\n"),
		// Keys are stored cut to 64 bytes, as in a column too short.
		keyFlaw("short-keys", "", "\tif len(key) > 64 {\n\t\treturn key[:64]\n\t}\n\treturn key\n"),
		// Keys are stored lower-cased, as under a case-insensitive
		// collation.
		keyFlaw("fold-keys", `"strings"`, "\treturn strings.ToLower(key)\n"),
		// Keys are stored as cleaned paths, as behind an HTTP router.
		keyFlaw("clean-keys", `"path"`, "\treturn path.Clean(key)\n"),
	} {
		storeFlaws[f.Name] = f
	}
}

// libFlaws are the bugs of package lock itself, run on a correct store.
var libFlaws = map[string]flawpatch.Flaw{}

func init() {
	lib := func(name, file, old, new string) {
		libFlaws[name] = flawpatch.Flaw{Name: name, Edits: []flawpatch.Edit{{File: file, Old: old, New: new}}}
	}
	// A lease's deadline counted from the reply instead of the send.
	lib("deadline-from-reply", "acquire.go",
		"\t\t\tg, err = c.b.Acquire(ctx, key, token, cfg.ttl)\n\t\t}\n",
		"\t\t\tg, err = c.b.Acquire(ctx, key, token, cfg.ttl)\n\t\t}\n\t\tsent = cfg.clock.Now()\n")
	// The library's default drift allowance changed to nothing: a bound
	// taken from lock.DefaultDrift would agree with it.
	lib("zero-default-drift", "options.go", "\treturn ttl/100 + 2*time.Millisecond\n", "\treturn 0\n")
	// No drift allowance.
	lib("zero-drift", "validity.go", "validity{ttl: ttl, drift: cfg.driftFor(ttl)}", "validity{ttl: ttl, drift: 0}")
	// A renewal's deadline counted with the client's default TTL, not the
	// lease's.
	lib("renew-longer-ttl", "renew.go",
		"\tl.wd.lastErr = nil\n\tl.extendLocked(sent, g.TTL)\n",
		"\tl.wd.lastErr = nil\n\tl.extendLocked(sent, g.TTL)\n\tl.v.shortestSent = max(l.v.shortestSent, l.c.cfg.ttl)\n\tl.v.update()\n")
	// A renewal of unknown outcome extends the deadline.
	lib("unknown-renew-is-success", "renew.go",
		"\t\tl.wd.lastErr = err\n\t\treturn wrap(\"renew\", l.key, err)\n",
		"\t\tl.wd.lastErr = err\n\t\tl.extendLocked(sent, g.TTL)\n\t\treturn wrap(\"renew\", l.key, err)\n")
	// A renewal that finds the key free takes it again with the lease's
	// token, and the lease goes on.
	lib("watchdog-reacquires", "renew.go",
		"\t\tif errors.Is(err, ErrNotHeld) {\n\t\t\tl.endLocked(stateLost,",
		"\t\tif _, aerr := l.c.b.Acquire(ctx, l.key, l.token, l.v.ttl); errors.Is(err, ErrNotHeld) && aerr == nil {\n\t\t\tl.extendLocked(sent, 0)\n\t\t\treturn nil\n\t\t}\n\t\tif errors.Is(err, ErrNotHeld) {\n\t\t\tl.endLocked(stateLost,")
	// A waiter whose watch begins waits without trying again: a release
	// just before the watch began goes unnoticed.
	lib("no-recheck-after-watch", "acquire.go",
		"\t\t\t\twatch = w\n\t\t\t\tcontinue // the key may have been freed before the watch began\n",
		"\t\t\t\twatch = w\n")
	// 16-bit owner tokens.
	lib("short-tokens", "client.go",
		"func newToken() string {\n",
		"func newToken() string {\n\tvar b [2]byte\n\tcrand.Read(b[:])\n\treturn hex.EncodeToString(b[:])\n")
	// The scheduler's timer is not moved earlier for a lease due sooner.
	lib("scheduler-no-rearm", "scheduler.go",
		"if s.armedAt.IsZero() || due.Before(s.armedAt) {", "if s.armedAt.IsZero() {")
}

// networked is f on a store that does not say it lives in the process, so
// that package lock queues its goroutines per key and hands locks over
// between them with Transfer (the memory store's own Transfer), as it does
// on a networked store. (Its one other effect: the DeadTokens case expects
// dead tokens, which the memory store does not keep: see the flaw
// networked-no-dead-tokens.)
func networked(f flawpatch.Flaw) flawpatch.Flaw {
	f.Name += "-networked"
	f.Edits = append(f.Edits, flawpatch.Edit{File: memoryGo, Old: "\t\tInProcess:    true,\n", New: "\t\tInProcess:    false,\n"})
	return f
}

func init() {
	for _, f := range []flawpatch.Flaw{
		// A transfer keeps the previous holder's expiry (see
		// transfer-keeps-expiry), reached through package lock's
		// handovers.
		networked(storeFlaws["transfer-keeps-expiry"]),
		// A lock handed to the next goroutine ahead of the store is valid
		// for its own TTL from the handover, even past the previous
		// holder's deadline, which is all the store promises until the
		// transfer lands.
		networked(flawpatch.Flaw{Name: "handed-ignores-prev", Edits: []flawpatch.Edit{{File: "validity.go",
			Old: "func handedValidity(cfg *config, prev, start time.Time) validity {\n",
			New: "func handedValidity(cfg *config, prev, start time.Time) validity {\n\tprev = start.Add(24 * time.Hour)\n"}}}),
	} {
		libFlaws[f.Name] = f
	}
}

// flawNames returns the names of every flaw of the store and of package
// lock.
func flawNames() map[string]bool {
	names := map[string]bool{}
	for _, fs := range []map[string]flawpatch.Flaw{storeFlaws, libFlaws} {
		for name := range fs {
			names[name] = true
		}
	}
	return names
}

// flawByName returns the named flaw of the store or of package lock.
func flawByName(name string) (flawpatch.Flaw, bool) {
	if f, ok := storeFlaws[name]; ok {
		return f, true
	}
	f, ok := libFlaws[name]
	return f, ok
}

// forgetFenceIdle is a store whose fence counter starts again after idle
// (a Go expression of a time.Duration) without a grant. lastGrant holds
// the time of the last grant plus 1ns, 0 before the first: under virtual
// time a store's first grant can come at its time 0.
func forgetFenceIdle(name, idle string) flawpatch.Flaw {
	return edits(name,
		"\tdeadFor atomic.Int64 // time.Duration; see KeepDeadTokens\n",
		"\tdeadFor atomic.Int64 // time.Duration; see KeepDeadTokens\n\tlastGrant atomic.Int64\n",
		"func (s *Store) nextFence() uint64 {\n",
		"func (s *Store) nextFence() uint64 {\n\tnow := s.now()\n\tif last := time.Duration(s.lastGrant.Swap(int64(now) + 1)); last > 0 && now-(last-1) > "+idle+" {\n\t\ts.fence.Store(0)\n\t}\n")
}
