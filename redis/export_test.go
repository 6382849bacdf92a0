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
