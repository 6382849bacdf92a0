package redis_test

import (
	"context"
	"errors"
	"fmt"
	"net"
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
	for i, u := range []string{
		"redis://" + srvs[0].Addr + "/0?prefix=app:&durablefence=false&ttl=5s&pool_size=4",
		"redlock://" + srvs[0].Addr + "," + srvs[1].Addr + "," + srvs[2].Addr + "?nodetimeout=2s&prefix=app:",
		"redis://" + srvs[0].Addr + "/0?prefix=app:&sessions=true&ttl=5s",
	} {
		locks, err := lock.Open(ctx, u)
		if err != nil {
			t.Fatalf("Open(%q): %v", u, err)
		}
		// A key per URL: Redlock's Close ends the releases still out to
		// slow nodes, so its lock may stay on a node for its TTL (see
		// Redlock.Close), where the next URL would find it.
		key := fmt.Sprint("k", i)
		lk := "app:{" + key + "}"
		l, err := locks.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("%s: TryAcquire: %v", u, err)
		}
		if l.TTL().Seconds() != 5 && strings.HasPrefix(u, "redis:") {
			t.Errorf("%s: TTL %v; want 5s from the URL", u, l.TTL())
		}
		// Redlock holds the lock on a majority of its nodes, not
		// necessarily on the first.
		holding, want := 0, 1
		if strings.HasPrefix(u, "redlock:") {
			want = 2
		}
		for _, srv := range srvs {
			holding += int(newGoRedis(t, srv.Addr).Exists(ctx, lk).Val())
		}
		if holding < want {
			t.Errorf("%s: the lock is under the URL's prefix app: on %d nodes; want %d or more", u, holding, want)
		}
		if v := newGoRedis(t, srvs[0].Addr).Get(ctx, lk).Val(); strings.Contains(u, "sessions=true") != strings.Contains(v, "@app:session:") {
			t.Errorf("%s: the lock's value %q; want it to name a session (app:session:...) exactly when the URL asks for sessions", u, v)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("%s: Release: %v", u, err)
		}
		if err := locks.Close(); err != nil {
			t.Errorf("%s: Close: %v", u, err)
		}
	}
	bad := []struct{ url, want string }{
		{"redis://" + srvs[0].Addr + "?colour=red", "valid: autorenew, ca_file, cert_file, client_name"},
		{"redis://" + srvs[0].Addr + "?durablefence=perhaps", "want true or false"},
		{"redlock://?nodetimeout=1s", "names no nodes"},
		{"redlock://" + srvs[0].Addr + "?nodetimeout=fast", "positive Go duration"},
		{"redlock://" + srvs[0].Addr + ",," + srvs[1].Addr, "empty node"},
		{"redlock://" + srvs[0].Addr + "?maxttl=1ms", "at least 10ms"},
		{"redis://" + srvs[0].Addr + "?sessions=perhaps", "want true or false"},
		{"redis://" + srvs[0].Addr + "?sessions=true&slotfences=true", "do not go together"},
		{"redis://" + srvs[0].Addr + "?sessions=true&prefix=my%20app:", "neither a space nor '@'"},
		{"redlock://" + srvs[0].Addr + "," + srvs[1].Addr + "," + srvs[2].Addr + "?sessions=true", "valid: "},
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

// A Redlock whose majority one server can make up alone grants locks on
// that server's word (redlock://a,a,b with b down still granted), and one
// over 1 or 2 nodes survives the loss of none: both are refused, the first
// after resolving host names, the second unless allowed explicitly.
func TestRedlockNeedsDistinctNodes(t *testing.T) {
	srvs := startN(t, 3, redistest.NoPersistence)
	a, b, c := srvs[0].Addr, srvs[1].Addr, srvs[2].Addr
	_, port, _ := net.SplitHostPort(a)
	ctx := context.Background()
	for _, tc := range []struct{ url, want string }{
		{"redlock://" + a + "," + a + "," + b, `redlock nodes "` + a + `" and "` + a + `" are the same server`},
		{"redlock://" + a + ",localhost:" + port + "," + b, `redlock nodes "` + a + `" and "localhost:` + port + `" are the same server`},
		{"redlock://" + a, "a Redlock over 1 node(s) survives the loss of none"},
		{"redlock://" + a + "," + b, "a Redlock over 2 node(s) survives the loss of none; use 3 or 5 independent servers, or allow it with WithAllowFewNodes (URL parameter allowfewnodes=true)"},
		{"redlock://" + a + "," + b + "?allowfewnodes=maybe", "allowfewnodes=\"maybe\": want true or false"},
	} {
		locks, err := lock.Open(ctx, tc.url)
		if err == nil {
			locks.Close()
			t.Errorf("Open(%q) succeeded", tc.url)
			continue
		}
		if !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want ErrInvalid saying %q", tc.url, err, tc.want)
		}
	}
	for _, u := range []string{"redlock://" + a + "," + b + "?allowfewnodes=true", "redlock://" + a + "," + b + "," + c} {
		locks, err := lock.Open(ctx, u)
		if err != nil {
			t.Errorf("Open(%q): %v", u, err)
			continue
		}
		l, err := locks.TryAcquire(ctx, "k")
		if err != nil {
			t.Errorf("%s: TryAcquire: %v", u, err)
		} else {
			l.Release(ctx)
		}
		locks.Close()
	}

	// NewRedlock, over the caller's clients.
	ca, cb := newGoRedis(t, a), newGoRedis(t, b)
	for _, tc := range []struct {
		nodes []redis.Conn
		opts  []redis.Option
		want  string
	}{
		{[]redis.Conn{ca, cb}, nil, "survives the loss of none"},
		{[]redis.Conn{ca, ca, cb}, nil, "Redlock nodes 0 and 1 are the same server"},
		{[]redis.Conn{ca, newGoRedis(t, a), cb}, nil, "Redlock nodes 0 and 1 are the same server"},
		{[]redis.Conn{ca, ca}, []redis.Option{redis.WithAllowFewNodes(true)}, "are the same server"},
	} {
		r, err := redis.NewRedlock(tc.nodes, tc.opts...)
		if err == nil {
			r.Close()
			t.Errorf("NewRedlock(%d nodes) succeeded; want %q", len(tc.nodes), tc.want)
			continue
		}
		if !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewRedlock: %v; want ErrInvalid saying %q", err, tc.want)
		}
	}
	r, err := redis.NewRedlock([]redis.Conn{ca, cb}, redis.WithAllowFewNodes(true))
	if err != nil {
		t.Fatalf("NewRedlock over 2 nodes, allowed: %v", err)
	}
	r.Close()
}
