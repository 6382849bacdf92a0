package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// A node that comes back empty (restarted without persistence, or with its
// data lost) has forgotten the locks it granted and its fence counters.
// Left alone, it breaks both promises: a lock held on {A, B} while C was
// out of reach, and A restarted empty, can be granted again on {A, C} while
// the first holder's lease is valid; and the new holder's fence, read from
// A and C, can repeat the old one.
//
// So a Redlock node keeps a state key (nodeKey): "ready" once it votes.
// A node without it is new or came back empty, and the two cannot be told
// apart from the node. The acquire script then records the node's
// incarnation (the server time it first found the node so) and refuses to
// vote until MaxTTL has passed since: every lock it may have granted before
// it lost its data was granted at most MaxTTL before it restarted (renewals
// included), so all of them have expired by then, on the store's own terms.
// Then the first client to see the wait over adopts fence counters: it
// reads every counter from N-Q+1 of the other nodes that are ready, raises
// the empty node's counters to the highest values read, and marks the node
// ready, all guarded by the incarnation so that a node that restarted again
// meanwhile starts over. Why N-Q+1 suffice: every fence F was raised on a
// quorum M of Q nodes; if only this node lost its data, Q-1 nodes of M are
// among the N-1 others and kept F, and N-Q+1 of the others include one of
// them. A grant made while the node was not ready used a quorum of other
// nodes, which any later quorum meets on a node that kept its data.
//
// What it assumes: at most one node out of a quorum's worth loses its data
// at a time (the next one only after the first is ready again), node clocks
// do not jump forward by more than the drift, and no node that keeps its
// data loses part of it (appendfsync always, or no persistence at all:
// an everysec or snapshot restart keeps the state key and loses recent
// locks, which nothing can detect). InitNewNodes skips the wait for nodes
// that never held a lock.

// maxAdoptTime bounds one adoption of fence counters.
const maxAdoptTime = 30 * time.Second

var (
	// raiseManyScript: KEYS = node state, then fence counters; ARGV =
	// incarnation, then one value per counter. Raises each counter to its
	// value, only upwards, while the node is still that incarnation.
	// Returns 1, or 0 when the node is not that incarnation any more.
	raiseManyScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
for i = 2, #KEYS do
  local v = tonumber(ARGV[i])
  if tonumber(redis.call('GET', KEYS[i]) or '0') < v then
    redis.call('SET', KEYS[i], v)
  end
end
return 1`)

	// readyScript: KEYS = node state; ARGV = incarnation ('' for a new
	// node, which has no state). Marks the node ready if it is still that
	// incarnation. Returns 1 when it did.
	readyScript = goredis.NewScript(`
local n = redis.call('GET', KEYS[1])
if (n or '') ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], 'ready')
return 1`)
)

// InitNewNodes marks every node that has never held a lock as ready, so
// that it votes at once instead of waiting MaxTTL (see Redlock). Call it
// once for a new deployment, never after a restart: a node that came back
// empty cannot be told from a new one. It returns how many nodes it marked;
// nodes already ready, or waiting, are left alone.
func (r *Redlock) InitNewNodes(ctx context.Context) (int, error) {
	marked := 0
	for i, n := range r.batch {
		ok, err := n.run(ctx, readyScript, []string{r.nodeKey()}, "").Int64()
		if err != nil {
			return marked, storeErr(fmt.Sprintf("init node %d", i), err)
		}
		marked += int(ok)
	}
	return marked, nil
}

// adoptInBackground adopts fence counters for node i, incarnation inc,
// unless an adoption for it runs already.
func (r *Redlock) adoptInBackground(i int, inc string) {
	if r.closed.Load() || !r.adopting[i].CompareAndSwap(false, true) {
		return
	}
	if !r.track(1) {
		r.adopting[i].Store(false)
		return
	}
	go func() {
		defer r.bg.Done()
		defer r.adopting[i].Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), maxAdoptTime)
		defer cancel()
		if r.opts.ownClients {
			ctx = markOwned(ctx)
		}
		_ = r.adopt(ctx, i, inc) // on failure the node stays out; a later acquire tries again
	}()
}

// adopt raises node i's fence counters to the highest values that N-Q+1 of
// the other nodes, all ready, hold, then marks node i ready; both only while
// node i is still incarnation inc.
func (r *Redlock) adopt(ctx context.Context, i int, inc string) error {
	need := len(r.nodes) - r.quorum + 1
	highest := map[string]int64{}
	sources := 0
	for j, n := range r.nodes {
		if j == i {
			continue
		}
		if err := r.readCounters(ctx, n, highest); err == nil {
			sources++
		}
		if sources == need {
			break
		}
	}
	if sources < need {
		return fmt.Errorf("redis: redlock: node %d: %d of the other nodes answered ready, %d needed to adopt fence counters", i, sources, need)
	}
	nk := r.nodeKey()
	const batch = 256
	keys := []string{nk}
	args := []any{inc}
	flush := func() error {
		if len(keys) == 1 {
			return nil
		}
		ok, err := raiseManyScript.Run(ctx, r.nodes[i], keys, args...).Int64()
		if err == nil && ok == 0 {
			err = fmt.Errorf("node %d restarted again", i)
		}
		keys, args = keys[:1], args[:1]
		return err
	}
	for k, v := range highest {
		keys = append(keys, k)
		args = append(args, v)
		if len(keys) > batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	return readyScript.Run(ctx, r.nodes[i], []string{nk}, inc).Err()
}

// readCounters adds the fence counters of node n to highest, keeping the
// highest value per key; it fails unless n is ready. With slot counters
// (WithSlotFenceCounters), a key's own counter, left by the default mode,
// or its holder's fence record, counts for its slot's counter: the fences
// that the adopting node must not fall behind are then all in the slot
// counters.
func (r *Redlock) readCounters(ctx context.Context, n Conn, highest map[string]int64) error {
	c, ok := n.(goredis.Cmdable)
	if !ok {
		return fmt.Errorf("redis: redlock: a node client without GET and SCAN cannot share fence counters")
	}
	if st, err := c.Get(ctx, r.nodeKey()).Result(); err != nil || st != "ready" {
		return fmt.Errorf("node not ready (%q, %v)", st, err)
	}
	pattern := r.opts.prefix + "*" + fenceSuffix
	if r.opts.slotFences {
		pattern = r.opts.prefix + "*fence" // both kinds
	}
	var cursor uint64
	for {
		found, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return err
		}
		if len(found) > 0 {
			vals, err := c.MGet(ctx, found...).Result()
			if err != nil {
				return err
			}
			for k, v := range vals {
				key := found[k]
				switch {
				case strings.HasSuffix(key, slotFenceSuffix):
				case strings.HasSuffix(key, fenceSuffix):
					if sk := r.opts.slotFenceKey(strings.TrimSuffix(key, fenceSuffix)); sk != "" {
						key = sk
					}
				default:
					continue // not a counter
				}
				s, _ := v.(string)
				if f, err := strconv.ParseInt(s, 10, 64); err == nil && f > highest[key] {
					highest[key] = f
				}
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}
