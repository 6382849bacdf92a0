package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/internal/queuetest"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

const testLabel = "host 42 prog"

// holderKeys returns the holder keys (see label.go) under the default
// prefix, with SCAN, and their values.
func holderKeys(t *testing.T, rdb *goredis.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	it := rdb.Scan(ctx, 0, redis.DefaultPrefix+"*:h", 100).Iterator()
	for it.Next(ctx) {
		out[it.Val()] = rdb.Get(ctx, it.Val()).Val()
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// noHolderKeys fails t when a holder key is left.
func noHolderKeys(t *testing.T, rdb *goredis.Client, when string) {
	t.Helper()
	if hs := holderKeys(t, rdb); len(hs) != 0 {
		t.Fatalf("%s: holder keys left: %v", when, hs)
	}
}

// labelOf inspects key and checks that token holds it.
func labelOf(ctx context.Context, t *testing.T, in backend.Inspector, key, token string) string {
	t.Helper()
	h, err := in.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Held || h.Token != token {
		t.Fatalf("Inspect(%q): %+v; want held by %s", key, h, token)
	}
	return h.Label
}

// A label given with an acquire is stored with the lock in the same
// script, reported by Inspect while its token holds the lock, and deleted
// by the release, which leaves no holder key; an acquire without one
// stores nothing. In both fence modes (the holder key moved the slot
// counter one KEYS position on).
func TestLabelAcquireInspectRelease(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts []redis.Option
	}{{"key counters", nil}, {"slot counters", []redis.Option{redis.WithSlotFenceCounters(true)}}} {
		t.Run(tc.name, func(t *testing.T) {
			b := redis.New(rdb, tc.opts...)
			defer b.Close()
			if !b.Capabilities().Labels {
				t.Fatal("Capabilities().Labels is false")
			}
			tok := queuetest.NewToken()
			g, err := b.Acquire(backend.WithLabel(ctx, testLabel), "k", tok, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if got := labelOf(ctx, t, b, "k", tok); got != testLabel {
				t.Fatalf("label %q; want %q", got, testLabel)
			}
			hs := holderKeys(t, rdb)
			hk := redis.KeysOf(redis.DefaultPrefix, "k")[8]
			if len(hs) != 1 || hs[hk] != tok+" "+testLabel {
				t.Fatalf("holder keys %v; want %s = %q", hs, hk, tok+" "+testLabel)
			}
			if lp, hp := rdb.PTTL(ctx, redis.KeysOf(redis.DefaultPrefix, "k")[0]).Val(), rdb.PTTL(ctx, hk).Val(); hp <= 0 || hp > lp {
				t.Fatalf("holder key expires in %v, the lock in %v; want within the lock's", hp, lp)
			}
			if err := b.Release(ctx, "k", tok); err != nil {
				t.Fatal(err)
			}
			if h, err := b.Inspect(ctx, "k"); err != nil || h.Held {
				t.Fatalf("Inspect after the release: %+v, %v; want free", h, err)
			}
			noHolderKeys(t, rdb, "after the release")

			// Without a label: nothing stored, nothing reported.
			tok2 := queuetest.NewToken()
			g2, err := b.Acquire(ctx, "k", tok2, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if g2.Fence <= g.Fence {
				t.Fatalf("fence %d after %d", g2.Fence, g.Fence)
			}
			if got := labelOf(ctx, t, b, "k", tok2); got != "" {
				t.Fatalf("label %q of an acquire without one", got)
			}
			noHolderKeys(t, rdb, "after an acquire without a label")
			if err := b.Release(ctx, "k", tok2); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Inspect reports a label only for the token the holder key names: a
// holder key of another token (which the scripts never leave beside a
// lock) shows no label, never another holder's.
func TestLabelInspectChecksTheToken(t *testing.T) {
	b, rdb, ctx := labelServer(t)
	tok := queuetest.NewToken()
	if _, err := b.Acquire(ctx, "k", tok, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	hk := redis.KeysOf(redis.DefaultPrefix, "k")[8]
	other := queuetest.NewToken()
	for _, v := range []string{other + " someone else", tok[:31] + " " + testLabel, tok + "+ " + testLabel} {
		rdb.Set(ctx, hk, v, time.Minute)
		if got := labelOf(ctx, t, b, "k", tok); got != "" {
			t.Fatalf("holder key %q: label %q; want none", v, got)
		}
	}
	// A waiter's mark on the lock does not hide the holder's own label.
	rdb.Set(ctx, hk, tok+" "+testLabel, time.Minute)
	rdb.Append(ctx, redis.KeysOf(redis.DefaultPrefix, "k")[0], "+")
	if got := labelOf(ctx, t, b, "k", tok); got != testLabel {
		t.Fatalf("marked lock: label %q; want %q", got, testLabel)
	}
	if err := b.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	noHolderKeys(t, rdb, "after the release of a marked lock")
}

// Renewals keep the holder key alive as long as the lock: one by one and
// batched (RenewBatch), the label is still there after several TTLs.
func TestLabelRenewalKeepsIt(t *testing.T) {
	b, rdb, ctx := labelServer(t)
	const ttl = 500 * time.Millisecond
	toks := []string{queuetest.NewToken(), queuetest.NewToken(), queuetest.NewToken()}
	keys := []string{"single", "batch1", "batch2"}
	for i, k := range keys {
		if _, err := b.Acquire(backend.WithLabel(ctx, fmt.Sprint(testLabel, i)), k, toks[i], ttl); err != nil {
			t.Fatal(err)
		}
	}
	end := time.Now().Add(3 * ttl)
	for time.Now().Before(end) {
		time.Sleep(ttl / 4)
		if _, err := b.Renew(ctx, keys[0], toks[0], ttl); err != nil {
			t.Fatal(err)
		}
		for _, r := range b.RenewBatch(ctx, []backend.Renewal{{Key: keys[1], Token: toks[1], TTL: ttl}, {Key: keys[2], Token: toks[2], TTL: ttl}}) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	for i, k := range keys {
		if got, want := labelOf(ctx, t, b, k, toks[i]), fmt.Sprint(testLabel, i); got != want {
			t.Fatalf("%s after 3 TTLs of renewals: label %q; want %q", k, got, want)
		}
		if err := b.Release(ctx, k, toks[i]); err != nil {
			t.Fatal(err)
		}
	}
	noHolderKeys(t, rdb, "after the releases")
}

// An acquire through a waiter's place (placeAcquireScript) stores its
// label when it takes the key. A lock the store hands to a queued waiter
// shows no label (the record carries none; see label.go), never the
// releasing holder's, and the release leaves no holder key.
func TestLabelQueue(t *testing.T) {
	b, rdb, ctx := labelServer(t)
	ttl := 10 * time.Second

	q, err := b.Queue("k")
	if err != nil {
		t.Fatal(err)
	}
	tok := queuetest.NewToken()
	if _, err := q.Acquire(backend.WithLabel(ctx, "place holder"), tok, ttl); err != nil {
		t.Fatal(err)
	}
	q.Close(true)
	if got := labelOf(ctx, t, b, "k", tok); got != "place holder" {
		t.Fatalf("label %q after a place's grant; want %q", got, "place holder")
	}

	w := queuetest.Queue(backend.WithLabel(ctx, "waiter"), t, b, "k", ttl)
	w.Confirms = true
	if err := b.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	h := w.Handed(t, "the waiter")
	if got := labelOf(ctx, t, b, "k", h.Token); got != "" {
		t.Fatalf("label %q of a lock the store handed over; want none", got)
	}
	noHolderKeys(t, rdb, "after a handover")

	// A holder's waiter-marked lock released with nobody left to hand it
	// to (the queue's place closed) leaves no holder key either.
	tok2 := queuetest.NewToken()
	if err := b.Release(ctx, "k", h.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(backend.WithLabel(ctx, testLabel), "k", tok2, ttl); err != nil {
		t.Fatal(err)
	}
	q2, err := b.Queue("k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q2.Acquire(ctx, queuetest.NewToken(), ttl); !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("waiter's attempt: %v; want ErrLocked", err)
	}
	q2.Close(false)
	if got := labelOf(ctx, t, b, "k", tok2); got != testLabel {
		t.Fatalf("label %q of a marked lock; want %q", got, testLabel)
	}
	if err := b.Release(ctx, "k", tok2); err != nil {
		t.Fatal(err)
	}
	noHolderKeys(t, rdb, "after the release of a marked lock")
}

// A transfer stores the label of the token it gives the lock to, or,
// without one, deletes the previous holder's.
func TestLabelTransfer(t *testing.T) {
	b, rdb, ctx := labelServer(t)
	ttl := 10 * time.Second
	from := queuetest.NewToken()
	if _, err := b.Acquire(backend.WithLabel(ctx, "first"), "k", from, ttl); err != nil {
		t.Fatal(err)
	}
	to := queuetest.NewToken()
	if _, err := b.Transfer(backend.WithLabel(ctx, "second"), "k", from, to, ttl, backend.TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := labelOf(ctx, t, b, "k", to); got != "second" {
		t.Fatalf("label %q after the transfer; want %q", got, "second")
	}
	to2 := queuetest.NewToken()
	if _, err := b.Transfer(ctx, "k", to, to2, ttl, backend.TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := labelOf(ctx, t, b, "k", to2); got != "" {
		t.Fatalf("label %q after a transfer without one; want none", got)
	}
	noHolderKeys(t, rdb, "after a transfer without a label")
	if err := b.Release(ctx, "k", to2); err != nil {
		t.Fatal(err)
	}
}

// Redlock stores the label on every node that grants, renews it with the
// lock, reports the label its holder's nodes agree on, and its release
// deletes it on every node.
func TestLabelRedlock(t *testing.T) {
	r, rdbs := redlockOver(t, startN(t, 3, redistest.NoPersistence))
	if !r.Capabilities().Labels {
		t.Fatal("Capabilities().Labels is false")
	}
	ctx := context.Background()
	const ttl = 500 * time.Millisecond
	tok := queuetest.NewToken()
	if _, err := r.Acquire(backend.WithLabel(ctx, testLabel), "k", tok, ttl); err != nil {
		t.Fatal(err)
	}
	// A majority granted; the last node's grant may still be on its way.
	lk := redis.KeysOf(redis.DefaultPrefix, "k")[0]
	deadline := time.Now().Add(5 * time.Second)
	for i, rdb := range rdbs {
		for rdb.Exists(ctx, lk).Val() == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if hs := holderKeys(t, rdb); len(hs) != 1 {
			t.Fatalf("node %d: holder keys %v; want one", i, hs)
		}
	}
	end := time.Now().Add(3 * ttl)
	for time.Now().Before(end) {
		time.Sleep(ttl / 4)
		if _, err := r.Renew(ctx, "k", tok, ttl); err != nil {
			t.Fatal(err)
		}
	}
	if got := labelOf(ctx, t, r, "k", tok); got != testLabel {
		t.Fatalf("label %q after 3 TTLs of renewals; want %q", got, testLabel)
	}
	// One node without the holder key: the majority's label still.
	hk := redis.KeysOf(redis.DefaultPrefix, "k")[8]
	rdbs[0].Del(ctx, hk)
	if got := labelOf(ctx, t, r, "k", tok); got != testLabel {
		t.Fatalf("label %q with one node's holder key gone; want %q", got, testLabel)
	}
	// Long enough that only the release can delete the holder keys.
	if _, err := r.Renew(ctx, "k", tok, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	// The release's answer comes from a majority; the last node's
	// release may still be on its way: wait for its lock to go.
	deadline = time.Now().Add(5 * time.Second)
	for i, rdb := range rdbs {
		for rdb.Exists(ctx, lk).Val() == 1 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		noHolderKeys(t, rdb, fmt.Sprint("node ", i, " after the release"))
	}
}

// With sessions, the lock keys live sessionSpan TTLs and the session's
// walks extend them: the holder key lives as long (the label is still
// there after more than that span), a release deletes it, and so does the
// rule that a lock whose session ended is free.
func TestLabelSessions(t *testing.T) {
	b, rdb, ctx := labelServer(t, redis.WithSessions(true))
	const ttl = 200 * time.Millisecond
	prefix, err := b.TokenPrefix(ttl)
	if err != nil || !strings.HasPrefix(prefix, "S") {
		t.Fatalf("TokenPrefix: %q, %v", prefix, err)
	}
	token := func(i int) string { return prefix + fmt.Sprintf("%0*x", 32-len(prefix), i) }
	tok := token(1)
	if _, err := b.Acquire(backend.WithLabel(ctx, testLabel), "k", tok, ttl); err != nil {
		t.Fatal(err)
	}
	if got := labelOf(ctx, t, b, "k", tok); got != testLabel {
		t.Fatalf("label %q; want %q", got, testLabel)
	}
	// 8 TTLs is the lock key's span; renew the session past 12.
	end := time.Now().Add(12 * ttl)
	for time.Now().Before(end) {
		time.Sleep(ttl / 4)
		if _, err := b.Renew(ctx, "k", tok, ttl); err != nil {
			t.Fatal(err)
		}
	}
	if got := labelOf(ctx, t, b, "k", tok); got != testLabel {
		t.Fatalf("label %q after 12 TTLs of the session's renewals; want %q", got, testLabel)
	}
	if err := b.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	noHolderKeys(t, rdb, "after the release")

	// A lock whose session ended is free: the script that finds it so
	// deletes its holder key with it.
	tok2 := token(2)
	if _, err := b.Acquire(backend.WithLabel(ctx, testLabel), "k", tok2, ttl); err != nil {
		t.Fatal(err)
	}
	if n := len(holderKeys(t, rdb)); n != 1 {
		t.Fatalf("%d holder keys; want 1", n)
	}
	time.Sleep(3 * ttl) // no renewal: the session's key expires
	if h, err := b.Inspect(ctx, "k"); err != nil || h.Held {
		t.Fatalf("Inspect after the session ended: %+v, %v; want free", h, err)
	}
	noHolderKeys(t, rdb, "after the session ended")
}

// An acquire that finds its own token (go-redis sent it again after a lost
// reply) extends the lock, and the holder key with it: here the same
// request twice, the second after most of the TTL, the label checked
// after the first one's TTL. For the single deployment's acquire, a
// waiter's place and Redlock.
func TestLabelAcquireSentAgain(t *testing.T) {
	const ttl = 600 * time.Millisecond
	ctx := backend.WithLabel(context.Background(), testLabel)
	twice := func(t *testing.T, in backend.Inspector, acquire func(token string) error) {
		t.Helper()
		tok := queuetest.NewToken()
		for range 2 {
			if err := acquire(tok); err != nil {
				t.Fatal(err)
			}
			time.Sleep(ttl * 2 / 3)
		}
		if got := labelOf(ctx, t, in, "k", tok); got != testLabel {
			t.Fatalf("label %q after the first request's TTL; want %q", got, testLabel)
		}
	}
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t, redistest.NoPersistence)
		b := redis.New(newGoRedis(t, srv.Addr))
		defer b.Close()
		twice(t, b, func(tok string) error {
			_, err := b.Acquire(ctx, "k", tok, ttl)
			return err
		})
	})
	t.Run("place", func(t *testing.T) {
		srv := redistest.Start(t, redistest.NoPersistence)
		b := redis.New(newGoRedis(t, srv.Addr))
		defer b.Close()
		q, err := b.Queue("k")
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close(true)
		twice(t, b, func(tok string) error {
			_, err := q.Acquire(ctx, tok, ttl)
			return err
		})
	})
	t.Run("redlock", func(t *testing.T) {
		r, _ := redlockOver(t, startN(t, 3, redistest.NoPersistence))
		twice(t, r, func(tok string) error {
			_, err := r.Acquire(ctx, "k", tok, ttl)
			return err
		})
	})
}

// labelServer starts a Redis server for a label test and returns a
// backend over it (closed at the test's end), its client and a context.
func labelServer(t *testing.T, opts ...redis.Option) (*redis.Backend, *goredis.Client, context.Context) {
	t.Helper()
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := newGoRedis(t, srv.Addr)
	b := redis.New(rdb, opts...)
	t.Cleanup(func() { b.Close() })
	return b, rdb, context.Background()
}
