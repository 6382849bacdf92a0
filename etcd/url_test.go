package etcd_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/distlock/lock"
	_ "github.com/distlock/lock/etcd"
)

func TestOpenURL(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	u := "etcd://" + srv.Addr + "," + srv.Addr + "?prefix=app/&dialtimeout=2s&electiontimeout=100ms&ttl=5s"
	locks, err := lock.Open(ctx, u)
	if err != nil {
		t.Fatalf("Open(%q): %v", u, err)
	}
	l, err := locks.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if l.TTL().Seconds() != 5 {
		t.Errorf("TTL %v; want 5s from the URL", l.TTL())
	}
	resp, err := newClient(t, srv.Addr).Get(ctx, "app/k/k\xff")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != l.Token() {
		t.Errorf("the lock is not under the URL's prefix app/: %v, %v", resp, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	if err := locks.Close(); err != nil { // closes the client the URL made
		t.Errorf("Close: %v", err)
	}
}

func TestOpenBadURL(t *testing.T) {
	ctx := ctxFor(t)
	bad := []struct{ url, want string }{
		{"etcd://", "no endpoint"},
		{"etcd://127.0.0.1:2379,,127.0.0.1:2380", `endpoint "" is not host:port`},
		{"etcd://localhost", "is not host:port"},
		{"etcd://127.0.0.1:2379/app", "the key prefix is the parameter prefix"},
		{"etcd://127.0.0.1:2379?dialtimeout=soon", "dialtimeout=\"soon\": want a Go duration from 10ms to 10m0s"},
		{"etcd://127.0.0.1:2379?dialtimeout=1h", "dialtimeout=\"1h\": want a Go duration from 10ms to 10m0s"},
		{"etcd://127.0.0.1:2379?electiontimeout=-1s", "electiontimeout=\"-1s\": want a Go duration from 1ms to 50s"},
		{"etcd://127.0.0.1:2379?electiontimeout=51s", "from 1ms to 50s"},
		{"etcd://127.0.0.1:2379?prefix=a&prefix=b", "given more than once"},
		{"etcd://root@127.0.0.1:2379", "a user name but no password"},
		{"etcd://:S3cret@127.0.0.1:2379", "a password but no user name"},
		{"etcd://root:@127.0.0.1:2379", `user "root" has an empty password`},
		{"etcd:127.0.0.1:2379", "no // after etcd:"},
		{"etcd://127.0.0.1:2379?maxttl=999ms", `maxttl="999ms": want a Go duration of at least 1s and at most 8760h0m0s (lock.MaxTTL), such as 1m`},
		{"etcd://127.0.0.1:2379?maxttl=8761h", `maxttl="8761h": want a Go duration of at least 1s and at most 8760h0m0s`},
		{"etcd://127.0.0.1:2379?maxttl=long", `maxttl="long": want a Go duration`},
		{"etcd://127.0.0.1:2379?colour=red", "valid: autorenew, ca_file, cert_file, dialtimeout, drift, electiontimeout, key_file, maxhold, maxttl, prefix, server_name, sessions, skip_verify, ttl"},
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
		// Open shows the URL, redacted, once; the backend names only the
		// part that is wrong.
		if shown := lock.RedactURL(tc.url); strings.Contains(shown, "127.0.0.1") && strings.Count(err.Error(), shown) != 1 {
			t.Errorf("Open(%q): %v; want the redacted URL %q shown once", tc.url, err, shown)
		}
	}
}
