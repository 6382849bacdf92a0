package redis

// ResetGoRedisLogger undoes SetGoRedisLogger for tests: the logger this
// package installed stays, as after the first lock.Open.
func ResetGoRedisLogger() { goredisLog.to.Store(nil) }

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
	return []string{lk, fk, nextKeyOf(lk), deadKeyOf(lk, token), queueKeyOf(lk), recordPrefixOf(lk) + id, channelOf(lk), channelOf(lk) + ":" + id}
}
