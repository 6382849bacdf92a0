package migrate

import (
	"context"
	"fmt"
	"time"

	"github.com/distlock/lock/backend"
)

// KeyCheck is what Check found of one key.
type KeyCheck struct {
	Key string
	// From and To are the key's holders on each store, as last read.
	From, To backend.Holder
	// Clear reports whether the key is clear to move to the next phase;
	// Why says why not.
	Clear bool
	Why   string
}

// Check reads keys on both stores and says, for each, whether the
// deployment may start phase next on it: whether no holder is left on a
// store that phase drops, while its instances run beside those of phase
// next-1.
//
//   - Phase 2 shares From with phase 1: every key is clear.
//   - Phases 3 and 4 must not meet a phase 1 instance, which holds its
//     locks on From only (phase 4 shares no store with it). A key is not
//     clear while From holds it for a token that To does not hold; a lock
//     of phases 2 and 3, held on both with one token, is fine.
//
// An acquire or release of phases 2 and 3 holds a key on one store for a
// moment; a key found held on From only is read again after settle, and
// is not clear only when it still is. Check cannot see instances, only
// holders: roll phase next-1 out everywhere first, and run Check after
// the longest TTL in use has passed since (a phase 1 lock taken before
// the roll finished has expired or been released by then), then start
// phase next. Both stores must reveal holders' tokens
// (backend.Inspector).
func Check(ctx context.Context, from, to backend.Backend, next Phase, keys []string, settle time.Duration) ([]KeyCheck, error) {
	if next < BothFromFences || next > ToOnly {
		return nil, fmt.Errorf("%w: Check: next phase %d; want 2, 3 or 4", ErrInvalidConfig, int(next))
	}
	fi, ok1 := from.(backend.Inspector)
	ti, ok2 := to.(backend.Inspector)
	if from == nil || to == nil || !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: Check needs both stores, each a backend.Inspector", ErrInvalidConfig)
	}
	out := make([]KeyCheck, len(keys))
	var again []int
	for i, k := range keys {
		c, err := checkKey(ctx, fi, ti, next, k)
		if err != nil {
			return nil, err
		}
		out[i] = c
		if !c.Clear {
			again = append(again, i)
		}
	}
	if len(again) > 0 && settle > 0 {
		t := time.NewTimer(settle)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		for _, i := range again {
			c, err := checkKey(ctx, fi, ti, next, keys[i])
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
	}
	return out, nil
}

// checkKey reads key once on both stores.
func checkKey(ctx context.Context, fi, ti backend.Inspector, next Phase, key string) (KeyCheck, error) {
	c := KeyCheck{Key: key}
	var err error
	if c.From, err = fi.Inspect(ctx, key); err != nil {
		return c, errStore("from", "inspect", err)
	}
	if c.To, err = ti.Inspect(ctx, key); err != nil {
		return c, errStore("to", "inspect", err)
	}
	switch {
	case next == BothFromFences || !c.From.Held:
		c.Clear = true
	case c.From.Token == "":
		c.Why = "the from store holds it and does not reveal the holder's token, so whether the to store holds it too cannot be told"
	case !c.To.Held:
		c.Why = "the from store holds it and the to store does not: a phase 1 instance holds it, which phase " + fmt.Sprint(int(next)) + " would not exclude"
	case c.To.Token != c.From.Token:
		c.Why = "the stores hold it for different tokens: a phase 1 instance holds it on the from store"
	default:
		c.Clear = true
	}
	return c, nil
}
