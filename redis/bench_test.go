package redis_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// BenchmarkCycle measures one goroutine's TryAcquire and Release on one
// server and on a healthy Redlock of three, with a context without a
// deadline and with one, over clients with and without
// ContextTimeoutEnabled (without it, a call under a deadline runs on a
// goroutine of its own).
func BenchmarkCycle(b *testing.B) {
	srvs := startN(b, 3, redistest.NoPersistence)
	plain := func(addr string) *goredis.Client {
		rdb := goredis.NewClient(&goredis.Options{Addr: addr, MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		b.Cleanup(func() { rdb.Close() })
		return rdb
	}
	for _, c := range []struct {
		name   string
		client func(string) *goredis.Client
	}{
		{"ContextTimeoutEnabled", func(addr string) *goredis.Client { return newGoRedis(b, addr) }},
		{"plain", plain},
	} {
		var nodes []redis.Conn
		for _, s := range srvs {
			nodes = append(nodes, c.client(s.Addr))
		}
		r, err := redis.NewRedlock(nodes)
		if err != nil {
			b.Fatal(err)
		}
		for _, be := range []struct {
			name string
			b    backend.Backend
		}{{"single", redis.New(nodes[0])}, {"redlock", r}} {
			locks, err := lock.New(be.b, lock.WithAutoRenew(false))
			if err != nil {
				b.Fatal(err)
			}
			for _, deadline := range []bool{false, true} {
				name := c.name + "/" + be.name + "/no-deadline"
				if deadline {
					name = c.name + "/" + be.name + "/deadline"
				}
				b.Run(name, func(b *testing.B) {
					ctx := context.Background()
					if deadline {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, time.Hour)
						defer cancel()
					}
					for b.Loop() {
						l, err := locks.TryAcquire(ctx, "k")
						if err != nil {
							b.Fatal(err)
						}
						if err := l.Release(ctx); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			locks.Close()
		}
	}
}
