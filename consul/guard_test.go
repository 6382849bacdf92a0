package consul_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/consul"
	"github.com/distlock/lock/internal/consultest"
)

// TestTxnIfHeld checks the guarded transaction against one real agent, each
// case on keys of its own.
func TestTxnIfHeld(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	outside, otr := client(t, agent.Addr)
	t.Cleanup(otr.CloseIdleConnections)

	// guarded returns a client of its own backend over the agent.
	guarded := func(t *testing.T, opts ...lock.Option) (*lock.Client, *consul.Backend) {
		t.Helper()
		b, _ := newBackend(t, agent.Addr)
		c, err := lock.New(b, append([]lock.Option{lock.WithTTL(5 * time.Second)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, b.Backend
	}
	acquire := func(t *testing.T, c *lock.Client, key string) *lock.Lease {
		t.Helper()
		l, err := c.TryAcquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Release(ctx) })
		return l
	}
	set := func(k, v string) api.TxnOps {
		return api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: k, Value: []byte(v)}}}
	}
	// stored returns k's value, "" when absent.
	stored := func(t *testing.T, k string) string {
		t.Helper()
		kv, _, err := outside.KV().Get(k, nil)
		if err != nil {
			t.Fatal(err)
		}
		if kv == nil {
			return ""
		}
		return string(kv.Value)
	}
	// refused fails unless err says not held, and k was not written.
	refused := func(t *testing.T, what string, err error, k string) {
		t.Helper()
		t.Logf("%s: %v", what, err)
		if !errors.Is(err, lock.ErrNotHeld) || errors.Is(err, lock.ErrInvalid) {
			t.Errorf("%s: %v; want ErrNotHeld", what, err)
		}
		if v := stored(t, k); v != "" {
			t.Errorf("%s: %q holds %q; want it not written", what, k, v)
		}
	}

	// (1) While the lock is held the ops are applied, and the response
	// holds their results only.
	t.Run("WritesWhileHeld", func(t *testing.T) {
		c, b := guarded(t)
		l := acquire(t, c, "held")
		ops := append(set("data/held", "one"), &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVGet, Key: "data/held"}})
		resp, err := b.TxnIfHeld(ctx, l, ops)
		if err != nil {
			t.Fatalf("guarded write while held: %v", err)
		}
		if got := stored(t, "data/held"); got != "one" {
			t.Errorf("data/held is %q after the guarded write; want %q", got, "one")
		}
		if len(resp.Results) != 2 || resp.Results[0].KV == nil || resp.Results[0].KV.Key != "data/held" ||
			resp.Results[1].KV == nil || string(resp.Results[1].KV.Value) != "one" {
			t.Errorf("results %s; want those of the set and the get only", results(resp))
		}
		// A read of the lock's own entry is allowed: it holds the token
		// (and the holder label package lock sends, label.go).
		resp, err = b.TxnIfHeld(ctx, l, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVGet, Key: consul.DefaultPrefix + "held"}}})
		if err != nil || len(resp.Results) != 1 || consul.TokenOf(resp.Results[0].KV.Value) != l.Token() {
			t.Errorf("guarded read of the lock's entry: %s, %v; want its token", results(resp), err)
		}
	})

	// The index check is only sound if nothing writes the entry while the
	// lock is held: renewals (automatic and explicit) must not.
	t.Run("EntryUnchangedByRenewals", func(t *testing.T) {
		c, b := guarded(t, lock.WithTTL(time.Second)) // renewed about every 330ms
		l := acquire(t, c, "renewed")
		for range 3 {
			if err := l.Renew(ctx); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(1500 * time.Millisecond) // several automatic renewals
		if err := l.Err(); err != nil {
			t.Fatalf("the lease ended: %v", err)
		}
		kv, _, err := outside.KV().Get(consul.DefaultPrefix+"renewed", nil)
		if err != nil || kv == nil {
			t.Fatalf("the lock's entry: %+v, %v", kv, err)
		}
		if kv.ModifyIndex != l.Fence() {
			t.Fatalf("after renewals the entry's ModifyIndex is %d, not the fence %d: the index check would refuse a holder", kv.ModifyIndex, l.Fence())
		}
		if _, err := b.TxnIfHeld(ctx, l, set("data/renewed", "one")); err != nil {
			t.Fatalf("guarded write after renewals: %v", err)
		}
		if got := stored(t, "data/renewed"); got != "one" {
			t.Errorf("data/renewed is %q; want %q", got, "one")
		}
	})

	// (2) After a release: refused (without a request, as the backend knows).
	t.Run("RefusedAfterRelease", func(t *testing.T) {
		c, b := guarded(t)
		l := acquire(t, c, "released")
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		_, err := b.TxnIfHeld(ctx, l, set("data/released", "late"))
		refused(t, "guarded write after release", err, "data/released")
	})

	// (2') Released from outside (its entry deleted) while the backend
	// still counts the lease as held: the store refuses.
	t.Run("RefusedAfterReleaseFromOutside", func(t *testing.T) {
		c, b := guarded(t)
		l := acquire(t, c, "deleted")
		if _, err := outside.KV().Delete(consul.DefaultPrefix+"deleted", nil); err != nil {
			t.Fatal(err)
		}
		_, err := b.TxnIfHeld(ctx, l, set("data/deleted", "late"))
		refused(t, "guarded write after the entry was deleted from outside", err, "data/deleted")
	})

	// (3) The lock lost with its session, destroyed from outside.
	t.Run("RefusedAfterSessionDestroyed", func(t *testing.T) {
		c, b := guarded(t)
		l := acquire(t, c, "destroyed")
		if _, err := outside.Session().Destroy(sessionOf(t, outside, "destroyed"), nil); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the lease was not lost after its session was destroyed")
		}
		_, err := b.TxnIfHeld(ctx, l, set("data/destroyed", "late"))
		refused(t, "guarded write after the session was destroyed", err, "data/destroyed")
	})

	// (3') The lock lost with its session, expired (no renewals).
	t.Run("RefusedAfterSessionExpired", func(t *testing.T) {
		c, b := guarded(t, lock.WithTTL(time.Second), lock.WithAutoRenew(false))
		l := acquire(t, c, "expired")
		deadline := time.Now().Add(10 * time.Second)
		for {
			kv, _, err := outside.KV().Get(consul.DefaultPrefix+"expired", nil)
			if err == nil && kv == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the entry of a 1s lock is still there 10s later: %+v, %v", kv, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		_, err := b.TxnIfHeld(ctx, l, set("data/expired", "late"))
		refused(t, "guarded write after the session expired", err, "data/expired")
	})

	// (4) The important case: the successor holds the lock on the very
	// session the old lease had (the backend reuses the sessions of
	// released locks). A check of the session alone would pass.
	t.Run("RefusedForPredecessorOnReusedSession", func(t *testing.T) {
		c, b := guarded(t)
		old := acquire(t, c, "reused")
		sess := sessionOf(t, outside, "reused")
		if err := old.Release(ctx); err != nil {
			t.Fatal(err)
		}
		next := acquire(t, c, "reused")
		if s := sessionOf(t, outside, "reused"); s != sess {
			t.Fatalf("the successor holds the lock on session %s, not the released lease's %s: the test checks nothing", s, sess)
		}
		if next.Fence() <= old.Fence() {
			t.Fatalf("fence %d after %d", next.Fence(), old.Fence())
		}
		_, err := b.TxnIfHeld(ctx, old, set("data/reused", "old"))
		refused(t, "the old lease's guarded write", err, "data/reused")
		// The store itself refuses the old lease's session and fence,
		// even from a backend that would still believe in them.
		_, err = b.GuardedTxn(ctx, "reused", sess, old.Fence(), set("data/reused", "old"))
		refused(t, "the transaction of the old lease's session and fence", err, "data/reused")
		if _, err := b.TxnIfHeld(ctx, next, set("data/reused", "next")); err != nil {
			t.Fatalf("the successor's guarded write: %v", err)
		}
		if got := stored(t, "data/reused"); got != "next" {
			t.Errorf("data/reused is %q; want the successor's %q", got, "next")
		}
	})

	// (4') The same session released and locked the entry again behind
	// the backend's back: the lease's watch sees its session still holding
	// the entry, yet the acquisition is not the lease's.
	t.Run("RefusedWhenItsSessionLockedTheEntryAgain", func(t *testing.T) {
		c, b := guarded(t)
		l := acquire(t, c, "relocked")
		name := consul.DefaultPrefix + "relocked"
		sess := sessionOf(t, outside, "relocked")
		ok, resp, _, err := outside.Txn().Txn(api.TxnOps{
			{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: name}},
			{KV: &api.KVTxnOp{Verb: api.KVLock, Key: name, Value: []byte("intruder"), Session: sess}},
		}, nil)
		if err != nil || !ok {
			t.Fatalf("relocking from outside: %v, %+v", err, resp)
		}
		kv, _, err := outside.KV().Get(name, nil)
		if err != nil || kv == nil || kv.Session != sess || kv.ModifyIndex == l.Fence() {
			t.Fatalf("after relocking, the entry is %+v, %v; want it locked by %s at a new index", kv, err, sess)
		}
		_, err = b.TxnIfHeld(ctx, l, set("data/relocked", "old"))
		refused(t, "guarded write of the lease whose session locked the entry again", err, "data/relocked")
	})

	// (4'') A successor on another client took the lock after the old
	// lease was released from outside by its token; the old session lives.
	t.Run("RefusedForPredecessorWhoseSessionLives", func(t *testing.T) {
		c, b := guarded(t)
		old := acquire(t, c, "taken")
		sess := sessionOf(t, outside, "taken")
		c2, b2 := guarded(t)
		if err := b2.Release(ctx, "taken", old.Token()); err != nil {
			t.Fatalf("releasing the lock from another client: %v", err)
		}
		next := acquire(t, c2, "taken")
		if s := sessionOf(t, outside, "taken"); s == sess {
			t.Fatal("the successor of another client holds the old session")
		}
		if info, _, err := outside.Session().Info(sess, nil); err != nil || info == nil {
			t.Fatalf("the old session: %+v, %v; want it alive", info, err)
		}
		_, err := b.TxnIfHeld(ctx, old, set("data/taken", "old"))
		refused(t, "the old lease's guarded write", err, "data/taken")
		if _, err := b2.TxnIfHeld(ctx, next, set("data/taken", "next")); err != nil {
			t.Fatalf("the successor's guarded write: %v", err)
		}
		if got := stored(t, "data/taken"); got != "next" {
			t.Errorf("data/taken is %q; want %q", got, "next")
		}
	})

	// Ops that fail on their own: their errors, indexed into ops, and
	// nothing written; when the lock is gone too, ErrNotHeld wins.
	t.Run("OpsFail", func(t *testing.T) {
		c, b := guarded(t)
		l := acquire(t, c, "opsfail")
		ops := append(set("data/opsfail", "one"),
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: "data/opsfail-cas", Index: 12345, Value: []byte("x")}})
		_, err := b.TxnIfHeld(ctx, l, ops)
		var oe *consul.OpsError
		if !errors.As(err, &oe) || len(oe.Errors) != 1 || oe.Errors[0].OpIndex != 1 || errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("guarded transaction with a failing CAS at ops[1]: %v; want an *OpsError for ops[1] only", err)
		}
		if v := stored(t, "data/opsfail"); v != "" {
			t.Errorf("data/opsfail is %q after a rolled-back transaction", v)
		}
		if _, err := outside.KV().Delete(consul.DefaultPrefix+"opsfail", nil); err != nil {
			t.Fatal(err)
		}
		_, err = b.TxnIfHeld(ctx, l, ops)
		refused(t, "failing ops after the lock was lost", err, "data/opsfail")
	})

	// Bad input: ErrInvalid and no transaction sent; nothing panics.
	t.Run("BadInput", func(t *testing.T) {
		ct := &countTxn{base: &http.Transport{}}
		cli := clientVia(t, agent.Addr, ct)
		t.Cleanup(ct.base.CloseIdleConnections) // after the client closes
		b, err := consul.New(cli, consul.WithMinTTL(consultest.MinTTL))
		if err != nil {
			t.Fatal(err)
		}
		c, err := lock.New(b, lock.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		l := acquire(t, c, "bad")
		oc, ob := guarded(t)
		foreign := acquire(t, oc, "foreign")
		name := consul.DefaultPrefix + "bad"
		var nilCtx context.Context
		sent := ct.n.Load()
		for _, tc := range []struct {
			name string
			ctx  context.Context
			l    *lock.Lease
			ops  api.TxnOps
		}{
			{"nil lease", ctx, nil, set("data/bad", "x")},
			{"zero lease", ctx, &lock.Lease{}, set("data/bad", "x")},
			{"nil context", nilCtx, l, set("data/bad", "x")},
			{"another backend's lease", ctx, foreign, set("data/bad", "x")},
			{"nil op", ctx, l, api.TxnOps{nil}},
			{"empty op", ctx, l, api.TxnOps{{}}},
			{"set of the lock's entry", ctx, l, set(name, "x")},
			{"delete of the lock's entry", ctx, l, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: name}}}},
			{"unlock of the lock's entry", ctx, l, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: name}}}},
			{"delete-tree over the lock's entry", ctx, l, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVDeleteTree, Key: consul.DefaultPrefix}}}},
			{"delete-tree of everything", ctx, l, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVDeleteTree}}}},
		} {
			resp, err := b.TxnIfHeld(tc.ctx, tc.l, tc.ops)
			if !errors.Is(err, lock.ErrInvalid) || resp != nil {
				t.Errorf("%s: %v, %v; want ErrInvalid", tc.name, resp, err)
			}
		}
		if n := ct.n.Load() - sent; n != 0 {
			t.Errorf("%d transactions sent for bad input", n)
		}
		if _, err := ob.TxnIfHeld(ctx, l, set("data/bad", "x")); !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("another backend's TxnIfHeld of the lease: %v; want ErrInvalid", err)
		}
		if v := stored(t, "data/bad"); v != "" {
			t.Errorf("data/bad holds %q after bad input", v)
		}
		// The lease is unharmed.
		if _, err := b.TxnIfHeld(ctx, l, set("data/bad", "good")); err != nil {
			t.Fatalf("guarded write after the bad input: %v", err)
		}
		if got := stored(t, "data/bad"); got != "good" {
			t.Errorf("data/bad is %q; want %q", got, "good")
		}
		// A closed backend.
		cb, _ := newBackend(t, agent.Addr)
		cb.Close()
		if _, err := cb.TxnIfHeld(ctx, l, set("data/bad", "x")); !errors.Is(err, backend.ErrClosed) {
			t.Errorf("closed backend: %v; want ErrClosed", err)
		}
	})
}

// countTxn counts the transactions sent through it.
type countTxn struct {
	base *http.Transport
	n    atomic.Int64
}

func (c *countTxn) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/v1/txn" {
		c.n.Add(1)
	}
	return c.base.RoundTrip(r)
}

// results shows a response's results for a test failure.
func results(resp *api.TxnResponse) string {
	if resp == nil {
		return "no response"
	}
	s := "["
	for i, r := range resp.Results {
		if i > 0 {
			s += " "
		}
		switch {
		case r == nil || r.KV == nil:
			s += "-"
		default:
			s += r.KV.Key + "=" + string(r.KV.Value)
		}
	}
	return s + "]"
}
