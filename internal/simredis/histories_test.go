package simredis

import (
	"testing"

	"github.com/distlock/lock/internal/flawpatch"
)

// The histories of issue 28's acceptance: bugs fixed earlier (issue 8's
// histories 1 to 7, here X1 to X7, of which the issue names X1 to X3 and
// X5 to X7, with "X7/X9 (retried release)" as one; issue 24's
// Consul zero grant and cross-key sharing), each re-created in today's code
// by a flaw, for the simulation to find. Each edit undoes the essence of
// the fix, as small as today's code allows; the comment of each history
// says what the bug was (and the commit that fixed it), what the edit
// restores, and what the simulation must do to show it.

// The files the flaws edit, from this module's root.
const (
	lockValidity  = "../../validity.go"
	lockAcquire   = "../../acquire.go"
	lockLocal     = "../../local.go"
	lockScheduler = "../../scheduler.go"
	lockContract  = "../../contract.go"
	redisRedis    = "../../redis/redis.go"
	redisQueue    = "../../redis/queue.go"
	redisRedlock  = "../../redis/redlock.go"
)

// history is a bug fixed earlier, re-created by a flaw, and the model the
// simulation finds it in.
type history struct {
	name  string // "X1 handover keeps the longer deadline", ...
	model string // "redis" (single node) or "redlock" (3 nodes)
	flaw  flawpatch.Flaw
	want  string // text of the violation expected
}

// flaw is a flawpatch.Flaw named name, of the edits (file, old, new), in
// order.
func flaw(name string, edits ...flawpatch.Edit) flawpatch.Flaw {
	return flawpatch.Flaw{Name: name, Edits: edits}
}

func edit(file, old, new string) flawpatch.Edit {
	return flawpatch.Edit{File: file, Old: old, New: new}
}

var histories = []history{
	// X1 (issue 8, history 1): a lock handed over ahead of the store to a
	// waiter with a shorter TTL kept the previous holder's deadline. One
	// Client, goroutines A and B with TTL 10s and C with TTL 500ms on one
	// key: B's release handed the lock to C ahead of the store with B's
	// deadline (9.9s away); the transfer set the store's expiry to 500ms;
	// another client acquired at +502ms while C reported Err nil with
	// 9.4s left. Fixed in 58c7b81 (validity.inherit: a handed lease is
	// valid until the earlier of the previous holder's deadline and its
	// own TTL less drift from before the transfer is sent).
	//
	// The edit restores the old rule: a handed lease's deadline is the
	// previous holder's (inherit sets it, with nothing confirmed), and the
	// inherited deadline is a floor, not a ceiling, from then on: it is
	// never cleared by a confirmation, so the transfer's and the
	// renewals' confirmations only ever move the deadline later (the old
	// extend: max of the deadline and send + TTL - drift).
	//
	// To show it the simulation needs: one client with three goroutines
	// waiting on one key, so that a release transfers the lock with a
	// reserved fence (the second handoff of a run goes ahead of the store;
	// no other process may be queued on the key then, or no fence is
	// reserved), and the goroutine handed the lock ahead of the store
	// asking for a shorter TTL than the releasing holder's (WithTTL per
	// acquire: the workload has one TTL today; e.g. a quarter of the
	// sections with TTL/4 or less), with at least TTL/4 left on the
	// releasing lease. Then with auto-renew off and a hold past its own
	// TTL (within the inherited deadline), or with auto-renew on and its
	// renewals failing (client partitioned after the transfer landed),
	// another client acquires at the store's expiry: an overlap. The
	// "deadline too far ahead" check would see it at once if it compared
	// each lease's deadline with that lease's own TTL (today it uses the
	// run's one TTL). Over miniredis in a synctest bubble, with no fault:
	// the 500ms lease handed over ahead of the store is valid 9.9s, and
	// another client acquires 501ms later while its Err is nil (checked).
	// Caught on a real server by redis TestHandoverToShorterTTL (checked).
	{
		name:  "X1 handover keeps the longer deadline",
		model: "redis",
		want:  "overlap on",
		flaw: flaw("x1-handover-keeps-longer-deadline",
			edit(lockValidity,
				"\tv.inherited = time.Time{} // the store now holds the lock for this token\n",
				"\t// flaw X1: the inherited deadline stays, as a floor\n"),
			edit(lockValidity,
				"\tv.inherited = prev\n\tv.confirmed = start\n\tv.update()\n",
				"\tv.inherited = prev\n\tv.deadline = prev // flaw X1: the previous holder's deadline, whatever this lease's TTL\n"),
			edit(lockValidity,
				"if !v.inherited.IsZero() && v.inherited.Before(d) {",
				"if !v.inherited.IsZero() && v.inherited.After(d) {"),
		),
	},

	// X2 (issue 8, history 2): a transfer whose reply came late, then the
	// waiter asked the store with the same token. TTL 1s, auto-renew off,
	// Release with a 300ms context, the holder's replies held longer: the
	// store moved the lock to the waiter's token (expiry +1s), Release
	// failed with DeadlineExceeded, the waiter then acquired with the same
	// token, and the acquire script answered "already yours" without
	// resetting the expiry; the lease counted its deadline from this later
	// send: valid to +1.29s while another client acquired at +1.00s.
	// Fixed in 59154e2 (a fresh token for every store attempt: the token a
	// transfer gives the lock to is used for nothing else) and 1bdc6c3 (an
	// acquire that finds its own token resets the expiry).
	//
	// The edits restore both: the goroutine that gets the client's turn
	// for the key (the transfer having failed) makes its first store
	// attempt with its queue token, the one the transfer may have given
	// the lock to (the turn carries it from waitTurn to the acquire loop;
	// the old code used one token for the call and its queue slot); and
	// the acquire scripts (single node's acquireScript, and the waiters'
	// placeAcquireScript, which an Acquire that waits uses) answer "yours"
	// without touching the expiry. Today's code also sends a cleanup
	// release of the waiter's token after the unknown transfer (the old
	// code did too): when it lands after the waiter's acquire it frees the
	// waiter's lock under it, which is a second way to the same overlap;
	// when it lands first, the acquire is refused as a dead token and the
	// Acquire fails with ErrInvalid (no violation).
	//
	// To show it the simulation needs: one client with two goroutines on
	// one key, the holder's lease not a handed one (acquired from the
	// store, so that its release transfers with one request: no fence
	// reserved, or less than TTL/4 left), the transfer's reply lost after
	// the store acted or later than the Release's context (the workload's
	// Release context is the TTL: a reply later than that), and the
	// waiter's acquire reaching the store before the cleanup release of
	// the waiter's token (that release lost or delayed); then another
	// client acquiring at the store's expiry (transfer arrival + TTL, or
	// at once after the late cleanup) while the waiter holds: an overlap.
	// Caught on a real server by redis TestLateTransferReplyThenAcquire
	// (checked, 6 runs): in 2 the waiter's lease was valid while the store
	// held nothing (the cleanup landed after its acquire), in 4 its
	// Acquire was refused as a dead token (the cleanup landed first).
	{
		name:  "X2 unknown transfer, then an own-token acquire",
		model: "redis",
		want:  "overlap on",
		flaw: flaw("x2-unknown-transfer-then-own-token-acquire",
			edit(lockLocal,
				"\tspent atomic.Bool // passed, or handed on to a new holder\n}",
				"\tspent atomic.Bool // passed, or handed on to a new holder\n\ttoken string      // flaw X2: the queue token, for the first store attempt\n}"),
			edit(lockLocal,
				"\t\treturn &turn{q: q, key: key}, nil, nil\n\tcase <-ctx.Done():",
				"\t\treturn &turn{q: q, key: key, token: w.token}, nil, nil\n\tcase <-ctx.Done():"),
			edit(lockAcquire,
				"\t\t\treturn nil, wrap(op, key, err)\n\t\t}\n\t\tsent := early\n",
				"\t\t\treturn nil, wrap(op, key, err)\n\t\t}\n\t\tif t != nil && t.token != \"\" {\n\t\t\ttoken, t.token = t.token, \"\" // flaw X2: the token a transfer may have given the lock to\n\t\t}\n\t\tsent := early\n"),
			edit(redisRedis,
				"  redis.call('PEXPIRE', KEYS[1], span(v, ARGV[2]))\n  redis.call('PEXPIRE', KEYS[4], span(v, ARGV[2]))\n  redis.call('PEXPIRE', KEYS[5], span(v, ARGV[2]))\n  if KEYS[6] then\n    redis.call('PEXPIRE', KEYS[2], ARGV[2])\n  end\n",
				""),
			edit(redisQueue,
				"  redis.call('PEXPIRE', KEYS[1], span(v, ARGV[2]))\n  redis.call('PEXPIRE', KEYS[4], span(v, ARGV[2]))\n  redis.call('PEXPIRE', KEYS[7], span(v, ARGV[2]))\n  if KEYS[8] then\n    redis.call('PEXPIRE', KEYS[2], ARGV[2])\n  end\n",
				""),
		),
	},

	// X3 (issue 8, history 3): the lost signal starved behind 64 hanging
	// renewals. A process held 70 leases (TTL 6s) and a lease Z (TTL 1s,
	// auto-renew off); stopped across the renewal time with its network
	// cut: Z's Done closed 3.45s after the process resumed, while another
	// client held Z's key (with 60 leases instead of 70, 2ms). The
	// scheduler ran each due lease's tick (deadline check, then renewal)
	// on a slot of 64 taken in the firing's loop, so the 65th lease's
	// deadline check waited for a hanging renewal. Fixed in 58c7b81
	// (deadlines checked for every due lease before any renewal starts;
	// renewals wait for slots on goroutines of their own).
	//
	// The edit restores the old firing: for each due lease in turn, take
	// a renewal slot, then run its tick and its renewal on the slot. The
	// slots are today's (64 per Client, Client.renewSlots; then they were
	// 64 per firing), so 64 renewals of one client hanging delay every
	// deadline check of that client due meanwhile, in the same firing or
	// a later one.
	//
	// To show it the simulation needs: one client holding more than 64
	// auto-renewed leases at once (65+ distinct keys: the workload's
	// hoard of 70, in one run of four), their renewals hanging (store paused, or the client
	// partitioned, with request timeouts past the leases' deadlines: the
	// renewal's context is the lease's deadline), and a lease of the same
	// client, auto-renew off or already failing, whose deadline falls due
	// while 64 renewals hang: its Done closes only when a renewal slot
	// frees (a renewal's deadline), after its own deadline: a late lost
	// signal. Caught on a real server by redis
	// TestLostSignalNotBehindHangingRenewals (checked).
	{
		name:  "X3 hanging renewals starve the deadline check",
		model: "redis",
		want:  "lost signal late",
		flaw: flaw("x3-hanging-renewals-starve-deadline-check",
			edit(lockScheduler,
				`	var renew []*Lease
	for _, l := range due {
		if l.tick() {
			renew = append(renew, l)
		}
	}
`,
				`	// flaw X3: each due lease's tick, deadline check included, waits
	// for a renewal slot.
	var renew []*Lease
	var wg0 sync.WaitGroup
	for _, l := range due {
		l.c.renewSlots <- struct{}{}
		wg0.Go(func() {
			defer func() { <-l.c.renewSlots }()
			if l.tick() {
				l.watchdogRenew()
			}
		})
	}
	wg0.Wait()
`),
		),
	},

	// X5 (issue 8, history 5): Redlock, a lost undo, and the next attempt
	// reusing the token. TTL 2s; X held {B,C}; W's first attempt took A
	// and its undo on A was lost (W's link to A dropped requests); X
	// released at +1.5s, C unreachable from W by then; W's next attempt,
	// with the same token, counted A's lock from the first attempt
	// (expiring at +2s, "already mine") plus B as a majority, with a
	// deadline of +3.48s; Y took {A,C} at +2.0s while W reported Err nil.
	// Fixed in 59154e2 (every attempt has a fresh token: an earlier
	// attempt's lock counts as another owner's) and 1bdc6c3 (an answer
	// "already mine" resets the node's expiry).
	//
	// The edits restore one token for every attempt of an acquire call,
	// and Redlock's acquire script answering "mine" without touching the
	// expiry. A third edit is needed because of a later fix: since
	// 2a8bc88 (X6/X7), every undo leaves a tombstone on every node it
	// reaches, held or not, and the acquire script refuses a dead token;
	// a reused token would be refused on every node the first attempt's
	// undo reached, so a contended Acquire would fail on its second
	// attempt (the simulation would report liveness, not this history),
	// and the history's own path (the undo lost on A only, B and C
	// answering) would be refused on B. The history's code had no
	// tombstones; the edit drops the refusal of dead tokens from Redlock's
	// acquire script (releases still leave tombstones, so retried
	// releases still succeed). That also reopens X6 on Redlock: an
	// acquire landing after its own undo takes the node; the simulation
	// may report "still holds" for this flaw as well.
	//
	// To show it the simulation needs: Redlock, three or more clients on
	// one key; a waiter W whose attempt takes a minority (A) while the
	// others hold the rest, whose undo on A is lost (a lost request, or W
	// partitioned from A), and whose next attempt, before A's lock from
	// the first attempt expires, gets A's "mine" and a fresh grant from a
	// node freed meanwhile (B); then another client takes A once it
	// expires (first attempt's arrival + TTL) and the third node: an
	// overlap with W, whose deadline counts from the second attempt.
	// Caught on real servers by redis TestRedlockAttemptCountsOnlyItsOwnGrants
	// (checked: Y acquired while W was valid 1.95s more). Without the third
	// edit that test fails only with "DEAD token released before" errors.
	{
		name:  "X5 Redlock stale node",
		model: "redlock",
		want:  "overlap on",
		flaw: flaw("x5-redlock-stale-node",
			edit(lockAcquire,
				"\tbackoff := cfg.minBackoff\n\tsplits := 0\n",
				"\tbackoff := cfg.minBackoff\n\tsplits := 0\n\ttoken := newToken() // flaw X5: one token for every attempt of the call\n"),
			edit(lockAcquire,
				"\t\ttoken, err := c.tokenFor(cfg)\n\t\tif err != nil {\n\t\t\treturn nil, wrap(op, key, err)\n\t\t}\n\t\tsent := early\n",
				"\t\tsent := early\n"),
			edit(redisRedlock,
				"if mine then\n  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n  redis.call('PEXPIRE', KEYS[5], ARGV[2])\n  if KEYS[6] then\n    redis.call('PEXPIRE', KEYS[2], ARGV[2])\n  end\nend\n",
				""),
			edit(redisRedlock,
				"if redis.call('EXISTS', KEYS[3]) == 1 then\n  return redis.error_reply('DEAD token released before')\nend\n",
				""),
		),
	},

	// X6 (issue 8, history 6): a cancelled Acquire left its lock under
	// ordinary load, with no faults: goroutines on their own keys, every
	// Acquire's context ending after 0-3ms; 1-4% of the cancelled acquires
	// left a lock for its whole TTL. A call returned when its context
	// ended even when its acquire was already in a pipeline, and the
	// cleanup release, sent on another connection, ran on the server
	// before that acquire. Fixed in 2a8bc88 (a release leaves a tombstone
	// of its token, 15s, and the acquire scripts refuse a dead token).
	//
	// The edits take the refusal of dead tokens out of the single node's
	// acquire scripts (acquireScript for TryAcquire, placeAcquireScript
	// for an Acquire that waits); releases still leave tombstones (X7's
	// fix stays), and transfers to a dead token are still refused.
	//
	// To show it the simulation needs: acquires whose context ends while
	// the request is on its way (patience of a few ms, as in the calm
	// phase's acquires given up on purpose), and the cleanup release
	// overtaking the acquire (reordering across connections: the release
	// goes on another connection or a later pipeline; a delayed acquire
	// request); the acquire then takes a free key for a token nobody
	// will release, and the key stays held a whole TTL. The calm phase
	// gives acquires up after 0 to 3 ms on keys of their own with a TTL
	// of 20 TTLs (latency only, as originally: no faults), so that a lock
	// one of them left is still there for the leftover check. Caught on a real server by redis
	// TestCancelledAcquiresLeaveNothing (checked: 46 locks left after
	// 19,314 cancelled acquires).
	{
		name:  "X6 cancelled acquires leave locks",
		model: "redis",
		want:  "still holds",
		flaw: flaw("x6-cancelled-acquires-leave-locks",
			edit(redisRedis,
				"if n > 0 and redis.call('EXISTS', KEYS[3]) == 1 or buried(ARGV[1]) then\n  return redis.error_reply('DEAD token released before')\nend\n",
				""),
			edit(redisQueue,
				"if redis.call('EXISTS', KEYS[3]) == 1 or buried(ARGV[1]) then\n  return redis.error_reply('DEAD token released before')\nend\n",
				""),
		),
	},

	// X7 (issue 8, history 7): a release retried after a lost reply
	// reported ErrLost. With go-redis's default retries, the reply
	// dropped and the connection reset after the server ran the release:
	// the retry found the key free and Release reported the lease lost,
	// for a lease held until its release. Fixed in 2a8bc88 (a release
	// sent again finds its token's tombstone and answers "released").
	//
	// The edit makes the release scripts' not-held tail (shared by the
	// single node and Redlock) answer "not held" for a token whose
	// tombstone says it released the lock before.
	//
	// To show it the simulation needs: go-redis clients with retries on
	// (MaxRetries >= 1) and a release whose reply is lost after the
	// store acted with the connection broken, so that go-redis sends it
	// again on a new connection (or any duplicate of a release request):
	// Release returns ErrLost and the lease's Err says lost, though the
	// store held the lock for it until the release. No overlap shows
	// it (the lease ends at its release, before its deadline); the
	// simulation's check of releases does: a Release of a valid lease
	// answered "not held" before its deadline is a false report, or a
	// store that freed the lock early.
	// Caught on a real server by redis TestRetriedReleaseSucceeds (checked).
	{
		name:  "X7 retried release",
		model: "redis",
		want:  "reported lost while held",
		flaw: flaw("x7-retried-release",
			edit(redisRedis,
				"if d then\n  return tonumber(d)\nend\n",
				"if d then\n  return 0 -- flaw X7: released before, yet \"not held\"\nend\n"),
		),
	},

	// Consul zero grant (issue 24, part 2): after a client's 16 pooled
	// sessions expired while idle, Acquire of a fresh key returned a lease
	// with fence 0 and no error, the key not held in Consul: a second
	// client's TryAcquire succeeded, two holders. place.Acquire tried
	// twice, each with a pooled session; when the second try also found
	// its session gone, it returned backend.Grant{} with a nil error, and
	// package lock took a nil error as held. Fixed in ba5ac9c (the retry
	// creates a session of its own; if that is gone at once too, the
	// acquire fails with an error) and 8af7d32 (package lock refuses a
	// grant, handover or transfer with fence 0 or a short TTL:
	// ErrBackendContract, contract.go).
	//
	// Consul's half of the bug (a retry that took another pooled session,
	// expired too) has no counterpart in the Redis backend, whose
	// waiter's record is its own carrier. The re-creation is the bug's
	// effect at the same layer, the waiter's place: an attempt that failed
	// in the store (no reply, a broken connection) answers a zero grant
	// with no error, as Consul's place did when its tries failed; and the
	// second edit switches off package lock's fence-0 rule, since the
	// history needs both (a zero grant's TTL is 0, "as asked", which the
	// TTL rule lets through). The simulation then sees a lease of fence 0
	// for a key the store may not hold, and another client's lease on it:
	// an overlap. (In waitq itself, the retry that follows a carrier gone,
	// which the Consul bug took, runs only for stores that report
	// waitq.ErrGone: etcd's and Consul's, not modelled here.) Caught by
	// package lock's TestBrokenGrantIsNotALease (checked); the
	// real-server test, consul TestPooledSessionsExpiredWhileIdle, needs
	// a Consul agent.
	{
		name:  "Consul zero grant",
		model: "redis",
		want:  "overlap on",
		flaw: flaw("consul-zero-grant",
			edit(redisQueue,
				"\t\treturn waitq.Result{Queued: true}, b.acquireErr(a.Token, err)\n",
				"\t\treturn waitq.Result{}, nil // flaw: an attempt that failed answers a zero grant with no error\n"),
			edit(lockContract,
				"\tcase fence == 0:\n",
				"\tcase fence == 0 && false: // flaw: a fence of 0 is taken\n"),
		),
	},

	// Cross-key sharing (issue 24, part 4): a Redis key containing '{' or
	// '}' was stored under its SHA-1 in hex, so the plain key equal to
	// that hex string was the same lock: after acquiring "a{b}", another
	// client's TryAcquire("28abe73a16bdb9982d4d12d2ca89653ed5aa55a1") got
	// "held by another owner". Fixed in 984431e (the hash tag is the key
	// with each '}' written as the byte 0xff, never in valid UTF-8).
	//
	// The edit restores the old mapping in keys(), from which every key
	// and channel of a lock derives, on the single node and Redlock.
	//
	// To show it the simulation needs: keys "a{b}" and
	// "28abe73a16bdb9982d4d12d2ca89653ed5aa55a1" in one run (any key with
	// a brace and the hex of its SHA-1), held at the same time by two
	// clients: one of them waits for, or is refused, a key nobody holds.
	// Fences are no help (the two keys share one counter, which stays
	// increasing per key) and exclusion holds; the check is that distinct
	// keys are independent (e.g. TryAcquire of one key while the other is
	// held, with the one key free, must succeed). Caught on real servers by
	// redis TestBracedKeysAreTheirOwnLocks (checked).
	{
		name:  "cross-key sharing",
		model: "redis",
		want:  "independent",
		flaw: flaw("cross-key-sharing",
			edit(redisRedis,
				"\tcrand \"crypto/rand\"\n",
				"\tcrand \"crypto/rand\"\n\t\"crypto/sha1\"\n"),
			edit(redisRedis,
				"\tfenceKey = prefix + \"{\" + strings.ReplaceAll(key, \"}\", \"\\xff\") + \"}\" + fenceSuffix\n",
				"\ttag := key // flaw: a key with a brace is stored under its SHA-1 in hex\n\tif strings.ContainsAny(key, \"{}\") {\n\t\tsum := sha1.Sum([]byte(key))\n\t\ttag = hex.EncodeToString(sum[:])\n\t}\n\tfenceKey = prefix + \"{\" + tag + \"}\" + fenceSuffix\n"),
		),
	},
}

// TestHistoriesApply checks that every history's edits still apply to
// today's code: each old text is found exactly once in its file.
func TestHistoriesApply(t *testing.T) {
	root, err := flawpatch.ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, h := range histories {
		if names[h.flaw.Name] {
			t.Errorf("%s: flaw name %s used twice", h.name, h.flaw.Name)
		}
		names[h.flaw.Name] = true
		if h.model != "redis" && h.model != "redlock" {
			t.Errorf("%s: model %q", h.name, h.model)
		}
		if _, err := flawpatch.Apply(root, h.flaw); err != nil {
			t.Errorf("%s: %v", h.name, err)
		}
	}
}
