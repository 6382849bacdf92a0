package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

func TestOpenURLs(t *testing.T) {
	srvs := startN(t, 3, redistest.NoPersistence)
	initNodes(t, srvs, redis.WithPrefix("app:"))
	ctx := context.Background()
	for _, u := range []string{
		"redis://" + srvs[0].Addr + "/0?prefix=app:&durablefence=false&ttl=5s&pool_size=4",
		"redlock://" + srvs[0].Addr + "," + srvs[1].Addr + "," + srvs[2].Addr + "?nodetimeout=100ms&prefix=app:",
	} {
		locks, err := lock.Open(ctx, u)
		if err != nil {
			t.Fatalf("Open(%q): %v", u, err)
		}
		l, err := locks.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatalf("%s: TryAcquire: %v", u, err)
		}
		if l.TTL().Seconds() != 5 && strings.HasPrefix(u, "redis:") {
			t.Errorf("%s: TTL %v; want 5s from the URL", u, l.TTL())
		}
		if n := newGoRedis(t, srvs[0].Addr).Exists(ctx, "app:{k}").Val(); n != 1 {
			t.Errorf("%s: no lock under the URL's prefix app:", u)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("%s: Release: %v", u, err)
		}
		if err := locks.Close(); err != nil {
			t.Errorf("%s: Close: %v", u, err)
		}
	}
	bad := []struct{ url, want string }{
		{"redis://" + srvs[0].Addr + "?colour=red", "valid: autorenew, client_name"},
		{"redis://" + srvs[0].Addr + "?durablefence=perhaps", "want true or false"},
		{"redlock://?nodetimeout=1s", "names no nodes"},
		{"redlock://" + srvs[0].Addr + "?nodetimeout=fast", "positive Go duration"},
		{"redlock://" + srvs[0].Addr + ",," + srvs[1].Addr, "empty node"},
		{"redlock://" + srvs[0].Addr + "?maxttl=1ms", "at least 10ms"},
	}
	for _, tc := range bad {
		c, err := lock.Open(ctx, tc.url)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", tc.url)
			continue
		}
		if !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want ErrInvalid mentioning %q", tc.url, err, tc.want)
		}
	}
}
