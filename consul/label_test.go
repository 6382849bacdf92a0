package consul_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/consul"
	"github.com/distlock/lock/internal/consultest"
	"github.com/distlock/lock/internal/queuetest"
)

const testLabel = "host 42 prog"

// labelIs checks that key is held by token, with label, as Inspect reports
// it.
func labelIs(ctx context.Context, t *testing.T, b backend.Inspector, key, token, label string) {
	t.Helper()
	h, err := b.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Held || h.Token != token || h.Label != label {
		t.Fatalf("holder of %q: %+v; want token %s with label %q", key, h, token, label)
	}
}

// nothingLeft checks that key is free and that no entry under the prefix
// names or describes any of tokens (by key or value) or holds label.
func nothingLeft(ctx context.Context, t *testing.T, b backend.Inspector, cli *api.Client, key, label string, tokens ...string) {
	t.Helper()
	if h, err := b.Inspect(ctx, key); err != nil || h.Held || h.Label != "" {
		t.Fatalf("Inspect of %q after the release: %+v, %v; want free", key, h, err)
	}
	for _, kv := range entries(t, cli) {
		v := string(kv.Value)
		if strings.Contains(v, label) {
			t.Errorf("left behind: %s = %q holds the label", kv.Key, v)
		}
		for _, tok := range tokens {
			if strings.Contains(kv.Key, tok) || strings.Contains(v, tok) {
				t.Errorf("left behind: %s = %q describes token %s", kv.Key, v, tok)
			}
		}
	}
}

// An acquire whose context carries a holder label stores it with the lock,
// in its own transaction: Inspect reports it for the holder's token, from
// this backend and from another; a lock acquired without one shows none.
// The release leaves nothing behind; a release by token from another
// backend (releaseOther) reads the token from the labelled value. With a
// session per lock and with shared sessions.
func TestLabelAcquireInspectRelease(t *testing.T) {
	agent := consultest.Start(t)
	for _, shared := range []bool{false, true} {
		name := map[bool]string{false: "own sessions", true: "shared sessions"}[shared]
		t.Run(name, func(t *testing.T) {
			b, cli := newBackend(t, agent.Addr, consul.WithSessions(shared))
			defer b.Close()
			other, _ := newBackend(t, agent.Addr, consul.WithSessions(shared))
			defer other.Close()
			if !b.Capabilities().Labels {
				t.Fatal("Capabilities().Labels is false")
			}
			ctx := context.Background()
			lctx := backend.WithLabel(ctx, testLabel)
			tokens := func(n int) []string {
				if shared {
					return sessionTokens(t, b.Backend, queueTTL, n)
				}
				out := make([]string, n)
				for i := range out {
					out[i] = newToken()
				}
				return out
			}
			toks := tokens(3)

			g, err := b.Acquire(lctx, "k", toks[0], queueTTL)
			if err != nil {
				t.Fatal(err)
			}
			labelIs(ctx, t, b, "k", toks[0], testLabel)
			labelIs(ctx, t, other, "k", toks[0], testLabel)
			if h, _ := b.Inspect(ctx, "k"); h.Fence != g.Fence {
				t.Fatalf("Inspect fence %d; want the grant's %d", h.Fence, g.Fence)
			}
			if _, err := b.Renew(ctx, "k", toks[0], queueTTL); err != nil {
				t.Fatalf("Renew of the labelled lock: %v", err)
			}
			if _, err := b.Acquire(ctx, "plain", toks[1], queueTTL); err != nil {
				t.Fatal(err)
			}
			labelIs(ctx, t, b, "plain", toks[1], "")
			if kv, _, err := cli.KV().Get(b.Entry("plain"), nil); err != nil || kv == nil || string(kv.Value) != toks[1] {
				t.Fatalf("the unlabelled lock's entry: %+v, %v; want its token alone as the value", kv, err)
			}
			if err := b.Release(ctx, "k", toks[0]); err != nil {
				t.Fatal(err)
			}
			if err := b.Release(ctx, "plain", toks[1]); err != nil {
				t.Fatal(err)
			}
			nothingLeft(ctx, t, b, cli, "k", testLabel, toks[0], toks[1])

			// A release by token, from a backend that did not acquire it.
			if _, err := b.Acquire(lctx, "k", toks[2], queueTTL); err != nil {
				t.Fatal(err)
			}
			if err := other.Release(ctx, "k", toks[2]); err != nil {
				t.Fatalf("Release of the labelled lock from another backend: %v", err)
			}
			nothingLeft(ctx, t, b, cli, "k", testLabel, toks[2])
		})
	}
}

// A shared session's acquire whose reply is lost after the store granted
// the lock: the release of the doubtful token buries it, finds the
// labelled entry held with the token and deletes it.
func TestLabelDoubtfulReleaseOfASharedSession(t *testing.T) {
	b, g, cli, toks := gatedSessions(t)
	ctx := context.Background()
	lctx := backend.WithLabel(ctx, testLabel)
	if _, err := b.Acquire(ctx, "keep", toks[0], sessionsTTL); err != nil {
		t.Fatal(err)
	}
	g.arm(lockOp(b.Entry("doubt"), toks[1]+"\n"+testLabel), false) // the store acts, the reply is lost
	if _, err := b.Acquire(lctx, "doubt", toks[1], sessionsTTL); err == nil || errors.Is(err, backend.ErrLocked) {
		t.Fatalf("Acquire with its reply lost: %v; want an error of unknown outcome", err)
	}
	labelIs(ctx, t, b, "doubt", toks[1], testLabel)
	if err := b.Release(ctx, "doubt", toks[1]); err != nil {
		t.Fatalf("Release of the doubtful token, whose acquire landed: %v", err)
	}
	if kv, _, err := cli.KV().Get(b.Entry("doubt"), nil); err != nil || kv != nil {
		t.Fatalf("entry after the release: %+v, %v; want none", kv, err)
	}
	for _, kv := range entries(t, cli) {
		if strings.Contains(string(kv.Value), testLabel) {
			t.Errorf("left behind: %s = %q holds the label", kv.Key, kv.Value)
		}
	}
}

// Waiting acquires through the queue: a place's attempt that finds the key
// free locks it with its label; queued waiters' records carry their
// labels, and a lock the store hands to a waiter (by the release that
// read the queue, then by the new holder's release from the waiters it
// was told of) carries that waiter's label. Nothing is left at the end.
func TestLabelQueue(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	holder, cli := newBackend(t, agent.Addr)

	// A place's own lock.
	q, err := holder.Queue("k")
	if err != nil {
		t.Fatal(err)
	}
	tok := newToken()
	if _, err := q.Acquire(backend.WithLabel(ctx, "holder"), tok, queueTTL); err != nil {
		t.Fatalf("Acquire of a free key through a place: %v", err)
	}
	q.Close(true)
	labelIs(ctx, t, holder, "k", tok, "holder")

	// Two waiters queue behind it, each with its label.
	labels := []string{"waiter 1", "waiter 2"}
	var bs []*owns
	var ws []*queuetest.Waiter
	for _, l := range labels {
		b, _ := newBackend(t, agent.Addr)
		bs = append(bs, b)
		ws = append(ws, queuetest.Queue(backend.WithLabel(ctx, l), t, b, "k", queueTTL))
	}
	labelIs(ctx, t, holder, "k", tok, "holder")
	if err := holder.Release(ctx, "k", tok); err != nil {
		t.Fatal(err)
	}
	var toks []string
	for i, w := range ws {
		h := w.Handed(t, labels[i])
		labelIs(ctx, t, holder, "k", h.Token, labels[i])
		toks = append(toks, h.Token)
		if err := bs[i].Release(ctx, "k", h.Token); err != nil {
			t.Fatalf("release by %s: %v", labels[i], err)
		}
	}
	nothingLeft(ctx, t, holder, cli, "k", "waiter", append(toks, tok)...)
	if kvs := entries(t, cli); len(kvs) != 0 {
		t.Fatalf("left behind: %d entries, the first %s", len(kvs), kvs[0].Key)
	}
}

// A labelled lock's loss watch reads the token from the entry's value, and
// decides by the token alone: an entry rewritten from outside by the
// lock's own session with the same token and another label is still the
// lease's lock (its renewal passes), so it is no loss; the entry's
// deletion is one. (Consul skips a rewrite with the same value: the label
// has to change for the watch to see one.)
func TestLabelLossWatchReadsTheToken(t *testing.T) {
	agent := consultest.Start(t)
	b, cli := newBackend(t, agent.Addr)
	defer b.Close()
	ctx := context.Background()
	tok := newToken()
	g, err := b.Acquire(backend.WithLabel(ctx, testLabel), "k", tok, queueTTL)
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	stop := b.NotifyLoss("k", tok, g.Fence, func(err error) { lost <- err })
	defer stop()
	kv, _, err := cli.KV().Get(b.Entry("k"), nil)
	if err != nil || kv == nil {
		t.Fatalf("the entry: %+v, %v", kv, err)
	}
	relabelled := tok + "\n" + "host 43 prog"
	if ok, _, err := cli.KV().Acquire(&api.KVPair{Key: kv.Key, Value: []byte(relabelled), Session: kv.Session}, nil); err != nil || !ok {
		t.Fatalf("rewriting the entry with its session: %v, %v", ok, err)
	}
	if kv, _, err := cli.KV().Get(kv.Key, nil); err != nil || kv == nil || kv.ModifyIndex <= g.Fence {
		t.Fatalf("the entry after the rewrite: %+v, %v; want it written after the grant", kv, err)
	}
	select {
	case err := <-lost:
		t.Fatalf("the lock was reported lost after its entry was rewritten with the same session and token: %v", err)
	case <-time.After(time.Second):
	}
	if _, err := b.Renew(ctx, "k", tok, queueTTL); err != nil {
		t.Fatalf("Renew after the rewrite: %v", err)
	}
	labelIs(ctx, t, b, "k", tok, "host 43 prog")
	if _, err := cli.KV().Delete(kv.Key, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("the lock's deletion was not reported lost within 5s")
	}
}

// What cannot be stored is refused before any request (the client points
// at no agent): a token with a newline, which would end the token in the
// entry's value, and a label longer than backend.MaxLabel; by Acquire and
// by a place's attempt.
func TestLabelRefusedInputs(t *testing.T) {
	cli, _ := client(t, "127.0.0.1:1")
	b, err := consul.New(cli, consul.WithMinTTL(consultest.MinTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	long := backend.WithLabel(ctx, strings.Repeat("x", backend.MaxLabel+1))
	q, err := b.Queue("k")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close(false)
	for _, c := range []struct {
		what  string
		ctx   context.Context
		token string
	}{
		{"a token with a newline", ctx, newToken() + "\nx"},
		{"a label longer than MaxLabel", long, newToken()},
	} {
		if _, err := b.Acquire(c.ctx, "k", c.token, queueTTL); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("Acquire with %s: %v; want ErrInvalid", c.what, err)
		}
		if _, err := q.Acquire(c.ctx, c.token, queueTTL); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("a place's Acquire with %s: %v; want ErrInvalid", c.what, err)
		}
	}
	if _, err := b.Acquire(backend.WithLabel(ctx, strings.Repeat("x", backend.MaxLabel)), "k", newToken(), queueTTL); err == nil || errors.Is(err, backend.ErrInvalid) {
		t.Errorf("Acquire with a label of MaxLabel bytes and no agent: %v; want a request's error", err)
	}
}
