package conformance

import (
	"context"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
	"github.com/distlock/lock/memory/netstore"
)

// netstoreScheme reaches a netstore server, netstoretest://HOST:PORT: a
// store that this test and its helper process, another run of this test
// binary, share over the network.
const netstoreScheme = "netstoretest"

func init() {
	lock.Register(netstoreScheme, nil, func(_ context.Context, u *url.URL) (backend.Backend, error) {
		return netstore.New(u.Host)
	})
}

func TestMain(m *testing.M) {
	MaybeContend() // a helper process of TestHelperTimesShareTheRunsClock
	os.Exit(m.Run())
}

// A helper process's operations and leases land on the run's clock: a
// helper that contends for a key this process holds gets it only after
// this process's release, on the merged clock, and soon after it; its
// history merges into the run's and passes the check.
func TestHelperTimesShareTheRunsClock(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := netstore.Serve(ln, memory.NewStore())
	defer srv.Close()
	url := netstoreScheme + "://" + srv.Addr().String()
	ctx := context.Background()
	rec := newRecorder()
	c, err := lock.Open(ctx, url, lock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := rec.acquire(ctx, 0, c, "k", true, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the helper's recorder starts a second after this one's
	h, err := startHelper(contenderConfig{URL: url, Keys: []string{"k"}, TTL: 200 * time.Millisecond, Client: 1, Seed1: 1, Seed2: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer h.kill()
	time.Sleep(time.Second) // the helper tries for the held key meanwhile
	released := rec.now()
	if err := rec.release(ctx, 0, l); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the helper takes the key, again and again
	rep, err := h.finish(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	intervals := map[string][]interval{}
	rec.merge(1, rep, intervals)
	if len(intervals["k"]) == 0 {
		t.Fatalf("the helper held the key in none of its %d operations", len(rep.Ops))
	}
	first := intervals["k"][0].start
	for _, iv := range intervals["k"] {
		if iv.start.Before(first) {
			first = iv.start
		}
	}
	at := first.Sub(rec.start)
	if at < time.Duration(released) {
		t.Fatalf("on the merged clock the helper held the key from %v, before this process released it at %v: the clocks disagree", at, time.Duration(released))
	}
	if at > time.Duration(released)+900*time.Millisecond {
		t.Fatalf("on the merged clock the helper held the key only from %v, %v after this process released it (it retries within 600ms): the clocks disagree", at, at-time.Duration(released))
	}
	if err := rec.check(checkBudget); err != nil {
		t.Fatalf("the merged history: %v", err)
	}
}
