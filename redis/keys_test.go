package redis_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// bracedKeys are keys with '{' or '}', which a hash tag cannot hold as
// they are.
var bracedKeys = []string{"a{b}", "a{b", "a}b", "{", "}", "{}", "}{", "x{y}z"}

// sha1Hex is the key equal to key's SHA-1 in hex: where earlier versions
// stored a key with braces.
func sha1Hex(key string) string {
	sum := sha1.Sum([]byte(key))
	return hex.EncodeToString(sum[:])
}

// A key with braces is a lock of its own, not the lock of the key equal to
// its SHA-1 in hex (the layout before stored "a{b}" under the tag
// 28abe73a16bdb9982d4d12d2ca89653ed5aa55a1, the plain key's own): on one
// node, on Redlock, and on Redis Cluster, where a script whose keys were
// in two slots would fail (CROSSSLOT), with a counter per key and per
// slot.
func TestBracedKeysAreTheirOwnLocks(t *testing.T) {
	if got := sha1Hex("a{b}"); got != "28abe73a16bdb9982d4d12d2ca89653ed5aa55a1" {
		t.Fatalf("SHA-1 of a{b}: %s", got)
	}
	single := redistest.Start(t, redistest.NoPersistence)
	nodes := startN(t, 3, redistest.NoPersistence)
	var cluster []string
	for _, s := range redistest.StartCluster(t, 3) {
		cluster = append(cluster, s.Addr)
	}
	for _, tc := range []struct{ name, url string }{
		{"single node", "redis://" + single.Addr},
		{"single node slot counters", "redis://" + single.Addr + "?slotfences=true&prefix=slots:"},
		{"redlock", "redlock://" + nodes[0].Addr + "," + nodes[1].Addr + "," + nodes[2].Addr + "?nodetimeout=2s"},
		{"cluster", "redis+cluster://" + strings.Join(cluster, ",")},
		{"cluster slot counters", "redis+cluster://" + strings.Join(cluster, ",") + "?slotfences=true&prefix=slots:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			var clients [2]*lock.Client
			for i := range clients {
				c, err := lock.Open(ctx, tc.url, lock.WithTTL(10*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				clients[i] = c
			}
			a, b := clients[0], clients[1]
			for _, key := range bracedKeys {
				twin := sha1Hex(key)
				for _, pair := range [][2]string{{key, twin}, {twin, key}} {
					held, other := pair[0], pair[1]
					l, err := a.TryAcquire(ctx, held)
					if err != nil {
						t.Fatalf("TryAcquire(%q): %v", held, err)
					}
					if _, err := b.TryAcquire(ctx, held); !errors.Is(err, lock.ErrLocked) {
						t.Errorf("TryAcquire(%q) by a second client while the first holds it: %v; want ErrLocked", held, err)
					}
					o, err := b.TryAcquire(ctx, other)
					if err != nil {
						t.Errorf("TryAcquire(%q) by a second client while the first holds %q: %v; want a lock of its own", other, held, err)
					} else if err := o.Release(ctx); err != nil {
						t.Errorf("Release(%q): %v", other, err)
					}
					if err := l.Release(ctx); err != nil {
						t.Errorf("Release(%q): %v", held, err)
					}
				}
			}
		})
	}
}

// Every key and channel of a lock is in the lock key's hash slot, by
// Redis Cluster's own CLUSTER KEYSLOT, for keys with and without braces,
// under the default prefix and under one with a '{' that no '}' closes
// (the hash tag then starts in the prefix); so is the slot's fence counter
// when the prefix allows one.
func TestKeysShareAClusterSlot(t *testing.T) {
	srv := redistest.StartCluster(t, 3)[0]
	rdb := newGoRedis(t, srv.Addr)
	ctx := context.Background()
	slotOf := func(k string) int64 {
		t.Helper()
		s, err := rdb.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
		}
		return s
	}
	keys := append([]string{"plain", "ünïcödé", "a:b"}, bracedKeys...)
	for _, prefix := range []string{redis.DefaultPrefix, "app{"} {
		for _, key := range keys {
			names := redis.KeysOf(prefix, key)
			if sk := redis.SlotFenceKey(prefix, key); sk != "" {
				names = append(names, sk)
			}
			want := slotOf(names[0])
			if got := int64(redis.HashSlot(names[0])); got != want {
				t.Errorf("prefix %q, key %q: the backend puts %q in slot %d; Redis says %d", prefix, key, names[0], got, want)
			}
			for _, n := range names[1:] {
				if got := slotOf(n); got != want {
					t.Errorf("prefix %q, key %q: %q is in slot %d, the lock %q in slot %d", prefix, key, n, got, names[0], want)
				}
			}
		}
	}
}
