package redis

import (
	"crypto/tls"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
)

// ResetGoRedisLogger undoes SetGoRedisLogger and SetQuietGoRedisLogger
// for tests: go-redis's logger is its default again.
func ResetGoRedisLogger() {
	goredisLog.Store(nil)
	logging.Enable()
}

// SlotFenceKey returns the fence counter that WithSlotFenceCounters gives
// key under prefix.
func SlotFenceKey(prefix, key string) string {
	lk, _ := keys(prefix, key)
	return slotFenceKey(prefix, lk)
}

// HashSlot is Redis Cluster's slot of key.
func HashSlot(key string) int { return hashSlot(key) }

// KeysOf returns the name of every Redis key and channel of the lock on
// key under prefix, with a token and a waiter id.
func KeysOf(prefix, key string) []string {
	lk, fk := keys(prefix, key)
	const token, id = "0123456789abcdef0123456789abcdef", "0123456789abcdef"
	return []string{lk, fk, nextKeyOf(lk), deadKeyOf(lk, token), queueKeyOf(lk), recordPrefixOf(lk) + id, channelOf(lk), channelOf(lk) + ":" + id, holderKeyOf(lk)}
}

// NodeTLSConfigs returns the TLS configuration of each node of r, a
// Redlock opened from a URL.
func NodeTLSConfigs(r *Redlock) []*tls.Config {
	var out []*tls.Config
	for _, n := range r.nodes {
		out = append(out, n.(*goredis.Client).Options().TLSConfig)
	}
	return out
}

// QueuedCalls returns how many calls wait in b's batcher for the wire.
func QueuedCalls(b *Backend) int {
	b.batch.mu.Lock()
	defer b.batch.mu.Unlock()
	return len(b.batch.queue)
}
