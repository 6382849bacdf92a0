package redis_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// TestLostReplyNotSentAgain: an acquire whose reply is lost after the
// server ran it is not sent again by go-redis (which, left to itself,
// sends it again on a new connection): the call fails with the outcome
// unknown, the server ran it once, and the token's release then leaves a
// tombstone, so that a copy still on its way could not take the key. A
// release of a token whose every request had its reply leaves none.
func TestLostReplyNotSentAgain(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	direct := newGoRedis(t, srv.Addr)
	px := faultproxy.Start(t, srv.Addr)
	// go-redis's defaults send a request again after a read timeout: a
	// short one, and a context without a deadline, so that it is the
	// client's timeout that ends the read.
	rdb := goredis.NewClient(&goredis.Options{
		Addr:                     px.Addr,
		ReadTimeout:              300 * time.Millisecond,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	defer rdb.Close()
	b := redis.New(rdb)
	defer b.Close()
	ks := redis.KeysOf(redis.DefaultPrefix, "k")
	deadOf := func(token string) string { return ks[0] + ":dead:" + token }

	// Warm up the connection: the script is loaded, the pool has a conn.
	tok := newQueueToken()
	if _, err := b.Acquire(ctx, "k", tok, queueTTL); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	if n := direct.Exists(ctx, deadOf(tok)).Val(); n != 0 {
		t.Fatalf("a release of a token whose requests all had their replies left a tombstone")
	}

	before := calls(ctx, t, direct, "evalsha")
	replies := px.Received(faultproxy.ToClient)
	px.Drop(faultproxy.ToClient)
	tok = newQueueToken()
	got := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, "k", tok, queueTTL)
		got <- err
	}()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := px.WaitReceived(wctx, faultproxy.ToClient, replies); err != nil { // the server ran it; its reply is gone
		t.Fatal(err)
	}
	px.Pass(faultproxy.ToClient) // a copy sent again would have its reply
	if err := <-got; err == nil {
		t.Fatal("Acquire whose reply was lost returned a grant: go-redis sent it again")
	}
	if n := calls(ctx, t, direct, "evalsha") - before; n != 1 {
		t.Fatalf("the server ran %d acquires; want 1", n)
	}
	if err := b.Release(ctx, "k", tok); err != nil {
		t.Fatalf("the release of the acquire of unknown outcome: %v", err)
	}
	if n := direct.Exists(ctx, deadOf(tok)).Val(); n != 1 {
		t.Fatal("the release of a token whose acquire had an unknown outcome left no tombstone")
	}
	if _, err := b.Acquire(ctx, "k", tok, queueTTL); err == nil {
		t.Fatal("a copy of the acquire arriving after its release took the key")
	}
}
