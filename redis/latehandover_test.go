package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/backend/waitq"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/internal/queuetest"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// splitClient sends a backend's scripts through one go-redis client and its
// subscriptions through another, so that a test can hold back the handover
// messages alone.
type splitClient struct {
	*goredis.Client                 // scripts
	sub             *goredis.Client // subscriptions
}

func (c splitClient) Subscribe(ctx context.Context, channels ...string) *goredis.PubSub {
	return c.sub.Subscribe(ctx, channels...)
}

// A handover message that arrives late, after the place's record was
// written again by an attempt of unknown outcome and refreshed, is not
// counted from that refresh: the lock it reports expired long ago and
// another client holds the key. The sequence (found by the Redis
// simulation, seed 7617149873088369245):
//  1. the place queues with token T1; its message connection stalls;
//  2. the holder's release hands the lock to T1, and the message waits;
//  3. the handed lock expires (its expiry was the record's), another client
//     takes the key;
//  4. the place's next attempt (token T2) writes the record again, and its
//     reply is lost: the place still knows T1 as its record's token;
//  5. the place refreshes the record (now T2's), confirmed;
//  6. the message "handed to T1" arrives.
//
// Counted from the refresh of step 5, the handover would give T1 a lease
// valid for a TTL while the other client holds the key.
func TestLateHandoverAfterRecordWrittenAgain(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	const ttl = 3 * time.Second
	raw := newGoRedis(t, srv.Addr)
	other := redis.New(newGoRedis(t, srv.Addr))
	defer other.Close()
	pxData, pxSub := faultproxy.Start(t, srv.Addr), faultproxy.Start(t, srv.Addr)
	b := redis.New(splitClient{newGoRedis(t, pxData.Addr), newGoRedis(t, pxSub.Addr)})
	defer b.Close()

	holder := holdKey(ctx, t, other, "k")
	w := queueUpFor(ctx, t, b, "k", ttl) // 1.
	pxSub.Hold(faultproxy.ToClient)
	if err := other.Release(ctx, "k", holder); err != nil { // 2.
		t.Fatal(err)
	}
	if v := raw.Get(ctx, "lock:{k}").Val(); strings.TrimSuffix(v, "+") != w.Token {
		t.Fatalf("the release left the lock to %q; want it handed to the waiter's token %s", v, w.Token)
	}
	raw.PExpire(ctx, "lock:{k}", time.Millisecond) // 3.: as if it expired
	for raw.Exists(ctx, "lock:{k}").Val() == 1 {
		time.Sleep(time.Millisecond) // poll the store
	}
	second := holdKey(ctx, t, other, "k")

	// 4.: the attempt's reply is lost after the server acted.
	before := pxData.Received(faultproxy.ToClient)
	pxData.Hold(faultproxy.ToClient)
	actx, cancel := context.WithCancel(ctx)
	t2 := queuetest.NewToken()
	done := make(chan error, 1)
	go func() {
		_, err := w.Q.Acquire(actx, t2, ttl)
		done <- err
	}()
	if err := pxData.WaitReceived(ctx, faultproxy.ToClient, before); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err == nil || errors.Is(err, backend.ErrLocked) {
		t.Fatalf("the attempt whose reply was held returned %v; want its context's error", err)
	}
	pxData.Reset()
	pxData.Deliver(faultproxy.ToClient)
	recs := raw.Keys(ctx, "lock:{k}:w:*").Val()
	if len(recs) != 1 || !strings.HasPrefix(raw.Get(ctx, recs[0]).Val(), t2+" ") {
		t.Fatalf("records %v; want one, written by the attempt of unknown outcome", recs)
	}

	// 5.
	p := w.Q.(*waitq.Place)
	wrote := time.Now()
	for !p.Refreshed().After(wrote) {
		if time.Since(wrote) > 2*ttl {
			t.Fatal("the place did not refresh its record within two TTLs")
		}
		time.Sleep(5 * time.Millisecond) // poll the place
	}

	pxSub.Deliver(faultproxy.ToClient) // 6.
	w.WakeUp(t, "the place")
	if h, ok := w.Q.Handed(); ok {
		t.Fatalf("the place reports the lock handed to %s (fence %d) since %v ago, while the store holds it for %s",
			h.Token, h.Fence, time.Since(h.Since).Round(time.Millisecond), second)
	}
	if v := raw.Get(ctx, "lock:{k}").Val(); strings.TrimSuffix(v, "+") != second {
		t.Fatalf("the lock holds %q; want the second holder's token %s", v, second)
	}
}
