package redis

import "github.com/distlock/lock/backend"

// Holder labels (backend.Label, Capabilities.Labels): the label of a lock's
// holder lives in a key of its own beside the lock, the holder key
// "PREFIX{KEY}:h", whose value is the holder's token as the lock stores it
// (without the waiters' mark "+") and the label, separated by a space.
//
// Why a key of its own, and not the label in the lock's value: every
// script, and the clients of earlier versions, compare the lock's value
// with a token (and the mark); a label in it would change what every
// script reads, on the hot path of each. A key beside it is written only
// by the scripts that grant, and read only by Inspect.
//
// The rules, each kept by the scripts themselves, so that a label can never
// describe another holder nor outlive its lock:
//
//   - Written only with a grant, in the script that grants: acquireLua
//     (a free key taken), placeAcquireLua's grant (a waiter's own grant,
//     and its takeover of a lock handed to its previous token),
//     transferLua (for the token the lock goes to) and Redlock's
//     acquire script, each node in the script that takes the node. The
//     label is the scripts' last ARGV (no earlier position moves) and is
//     written only when it is not empty; a grant without one writes
//     nothing (a free key has no holder key left: see the next rule),
//     except a transfer or a takeover, which finds the previous holder's
//     key and deletes it.
//   - Its expiry is the lock's: the same PX (span, so sessions' 8 TTLs
//     too) in the same script, and every request that extends the lock
//     extends it with the same expiry: renewals (it is one of renewKeys,
//     which renewScript and its batches extend with the lock), an
//     acquire or a waiter's attempt sent again that finds its own token,
//     and with sessions the walks of a session's lock table (which extend
//     the lock keys instead of renewals; see session.go). So it never
//     outlives the lock's own key expiry.
//   - Every script that ends a lock deletes it: the releases (the single
//     deployment's queueReleaseLua, Redlock's releaseScript), the
//     handover to a queued waiter (part of the release), and with
//     sessions live(), which deletes a lock whose session ended.
//   - Inspect reports the label only when the holder key's token is the
//     lock's holder's: a stale key (which the rules above should never
//     leave) shows no label rather than another holder's.
//
// The holder key is passed in KEYS, never derived in Lua (except by the
// sessions' walks and live(), which derive the next key the same way and
// run on one server only): it carries the lock's hash tag, so Redis
// Cluster keeps it in the lock's slot and no script crosses slots. Its
// suffix ":h" is none of the lock's other suffixes (":fence", ":next",
// ":dead:TOKEN", ":released[:ID]", ":q", ":w:ID"), and no other key
// (session keys "PREFIXsession:SID[:locks]", Redlock's state key
// "PREFIXredlock:node", slot counters "PREFIX{T}:slotfence") ends in
// "}:h".
//
// A lock the store hands to a queued waiter (queueReleaseLua) shows no
// label: the release deletes the releasing holder's key, and the waiter's
// record cannot simply carry a label. Its value is "TOKEN CHANNEL", the
// channel running to the end of the value, and the channel holds the
// user's key, which may hold any character: a label would need a new
// format of the record, which every script that reads records (and the
// clients of earlier versions sharing a queue during an upgrade) would
// have to parse. A waiter that takes over a lock handed to its previous
// token (Attempt.Prev) grants anew, and stores its label. Redlock does not
// queue.
//
// The cost: a grant with a label is one SET more in its script, a renewal
// one PEXPIRE more (of a missing key, without a label), a release one key
// more in its DEL, and with sessions a walk one PEXPIRE more per lock.

// holderSuffix ends the name of a lock's holder key.
const holderSuffix = ":h"

// holderKeyOf returns the holder key of a lock key (see above).
func holderKeyOf(lockKey string) string { return lockKey + holderSuffix }

// redlockLabel returns the label Redlock's Inspect reports for a holder
// that hs, its nodes' answers, report: the label most of them agree on
// (the nodes' labels of one token come from its one acquire request, so
// they differ only where a node has none), or "" when none has one.
func redlockLabel(hs []backend.Holder) string {
	votes := map[string]int{}
	best := ""
	for _, h := range hs {
		if h.Label == "" {
			continue
		}
		votes[h.Label]++
		if n := votes[h.Label]; n > votes[best] || n == votes[best] && h.Label < best {
			best = h.Label
		}
	}
	return best
}
