package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// An in-store guard: a write that the Redis server makes only while the
// lease's token holds the lock, checked and written in one script.
//
// It is stronger than a fence check at the resource: the server refuses the
// write from the moment the lock is gone (expired, released, or held by a
// successor), even before anyone else has acquired it, and no write can
// slip in between the check and the write, since a script runs alone. A
// fence check at the resource only rejects a stale holder once a newer
// fence has reached the resource. It protects only data on the same Redis
// server as the lock: for anything else, send the fence (lock.Lease.Fence)
// and check it at the resource.
//
// Redlock has no such guard: the data would live on one node, and no single
// node's check proves that a majority still grants the lock.

// setIfHeldScript: KEYS = lock, data key; ARGV = token, value, expiry ms
// (0: none). Sets the data key if token holds the lock (also when waiters
// marked it). Returns 1 when it wrote, 0 when token does not hold the lock.
var setIfHeldScript = goredis.NewScript(plainScript(setIfHeldLua))

const setIfHeldLua = `
local v = live(KEYS[1])
if v ~= ARGV[1] and v ~= ARGV[1] .. '+' then
  return 0
end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1`

// SetIfHeld sets key to value (with an expiry, unless expiration is 0) only
// while l, a lease of a lock.Client over this backend, holds its lock on the
// server: the check and the write run in one script. It returns an error
// wrapping lock.ErrNotHeld, and writes nothing, when the lock is no longer
// l's; an error wrapping lock.ErrLost or lock.ErrReleased, sending nothing,
// when l has already ended; and ErrInvalid for bad input. A lease handed
// over ahead of the store is confirmed first (lock.Lease.WaitConfirmed).
//
// In Redis Cluster the data key must be in the lock key's hash slot: put
// the lock's hash tag (HashTag) in it.
func (b *Backend) SetIfHeld(ctx context.Context, l *lock.Lease, key, value string, expiration time.Duration) error {
	if err := b.check(); err != nil {
		return err
	}
	switch {
	case ctx == nil:
		return fmt.Errorf("%w: redis: SetIfHeld: nil context", backend.ErrInvalid)
	case l == nil:
		return fmt.Errorf("%w: redis: SetIfHeld: nil lease", backend.ErrInvalid)
	case key == "":
		return fmt.Errorf("%w: redis: SetIfHeld: empty data key", backend.ErrInvalid)
	case expiration < 0:
		return fmt.Errorf("%w: redis: SetIfHeld: expiration %v; want 0 (none) or a positive duration", backend.ErrInvalid, expiration)
	case expiration > 0 && expiration < time.Millisecond:
		return fmt.Errorf("%w: redis: SetIfHeld: expiration %v is below Redis's 1ms unit", backend.ErrInvalid, expiration)
	}
	if err := l.WaitConfirmed(ctx); err != nil {
		return err
	}
	lk, _ := keys(b.opts.prefix, l.Key())
	n, err := b.batch.run(ctx, b.sc.setIfHeld, []string{lk, key}, b.stored(l.Token()), value, ms(expiration)).Int64()
	if err != nil {
		return storeErr("set if held", err)
	}
	if n == 0 {
		return fmt.Errorf("redis: SetIfHeld %q: %w: the lock of %q is no longer this lease's (expired, released or taken over); nothing was written", key, backend.ErrNotHeld, l.Key())
	}
	return nil
}

// HashTag returns the hash tag of the lock on key, braces included: a data
// key that contains it is in the lock key's hash slot, as SetIfHeld needs
// in Redis Cluster.
func (b *Backend) HashTag(key string) string {
	lk, _ := keys("", key)
	return lk
}
