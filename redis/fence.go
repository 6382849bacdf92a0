package redis

import (
	"strconv"
	"strings"
	"sync"
)

// Slot fence counters (WithSlotFenceCounters): see "Keys and their
// footprint" in the package doc for what they bound and why fences stay
// strictly increasing. Redlock uses the same counters on every node, and a
// node that comes back empty adopts the slot counters of the others,
// folding in per-key counters left by the default mode (see adopt.go).

// clusterSlots is the number of Redis Cluster hash slots.
const clusterSlots = 16384

// crc16 is Redis Cluster's key hash: CRC-16/XMODEM (polynomial 0x1021,
// initial value 0).
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// hashSlot returns the Redis Cluster slot of key: of its hash tag (the
// part between the first '{' and the first '}' after it, when not empty),
// or else of the whole key.
func hashSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % clusterSlots)
}

var (
	slotTagsOnce sync.Once
	slotTags     []string // slotTags[s] is a short string whose slot is s
)

// slotTag returns a short tag whose hash slot is slot. The table is built
// on first use, in about 170,000 hashes (a few milliseconds).
func slotTag(slot int) string {
	slotTagsOnce.Do(func() {
		slotTags = make([]string, clusterSlots)
		for i, found := 0, 0; found < clusterSlots; i++ {
			tag := strconv.FormatInt(int64(i), 36)
			if s := crc16(tag) % clusterSlots; slotTags[s] == "" {
				slotTags[s] = tag
				found++
			}
		}
	})
	return slotTags[slot]
}

// slotFenceSuffix ends the name of a slot's fence counter.
const slotFenceSuffix = ":slotfence"

// slotFenceKey returns the fence counter shared by the keys of lockKey's
// hash slot, under prefix, or "" when the prefix makes that impossible (a
// '{' without a '}' after it in the prefix puts the lock key's hash tag
// partly inside the prefix): the key then keeps a counter of its own, as
// without WithSlotFenceCounters.
func slotFenceKey(prefix, lockKey string) string {
	slot := hashSlot(lockKey)
	k := prefix + "{" + slotTag(slot) + "}" + slotFenceSuffix
	if hashSlot(k) != slot {
		return ""
	}
	return k
}
