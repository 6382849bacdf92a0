package migratetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/etcdtest"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/migrate"
)

// BenchmarkPhases measures an uncontended acquire and release in each
// phase of a move from redis-server to an etcd member, in one run, so
// that the ratios between phases mean something on a noisy machine:
// phase 1 is Redis alone, phase 4 etcd alone, phases 2 and 3 both.
//
//	go test -run '^$' -bench Phases ./internal/migratetest/
func BenchmarkPhases(b *testing.B) {
	rs, es := redistest.Start(b, redistest.AOFEverySecond), etcdtest.Start(b)
	ctx := context.Background()
	for p := migrate.FromOnly; p <= migrate.ToOnly; p++ {
		c, err := lock.Open(ctx, rollURL(rs.Addr, es.Addr, p))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("phase%d", p), func(b *testing.B) {
			key := fmt.Sprintf("bench-%d", p)
			for b.Loop() {
				l, err := c.TryAcquire(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		c.Close()
	}
}
