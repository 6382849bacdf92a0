package consul_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/consul"
	"github.com/distlock/lock/internal/consultest"
)

var _ backend.BatchRenewer = (*consul.Backend)(nil)

// A batch gives each lock its own answer: the locks still held are renewed
// with their fences; an entry deleted from outside, a lock whose session
// was destroyed, a token that never held its key and a TTL longer than the
// session's are each refused as Renew refuses them, and none of them
// changes another's answer.
func TestRenewBatch(t *testing.T) {
	agent := consultest.Start(t)
	b, cli := newBackend(t, agent.Addr)
	defer b.Close()
	ctx := context.Background()
	const ttl = 2 * time.Second
	keys := []string{"a", "b", "c", "deleted", "destroyed", "long"}
	toks := map[string]string{}
	fences := map[string]uint64{}
	for _, k := range keys {
		toks[k] = rand.Text()
		g, err := b.Acquire(ctx, k, toks[k], ttl)
		if err != nil {
			t.Fatalf("Acquire %q: %v", k, err)
		}
		fences[k] = g.Fence
	}
	if _, err := cli.KV().Delete(consul.DefaultPrefix+"deleted", nil); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := cli.Session().Destroy(sessionOf(t, cli, "destroyed"), nil); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	var rs []backend.Renewal
	for _, k := range keys {
		d := ttl
		if k == "long" {
			d = 3 * ttl
		}
		rs = append(rs, backend.Renewal{Key: k, Token: toks[k], TTL: d})
	}
	rs = append(rs, backend.Renewal{Key: "b", Token: rand.Text(), TTL: ttl}) // never held b
	res := b.RenewBatch(ctx, rs)
	if len(res) != len(rs) {
		t.Fatalf("RenewBatch of %d renewals answered %d", len(rs), len(res))
	}
	for i, r := range res {
		what := fmt.Sprintf("renewal %d (%q)", i, rs[i].Key)
		switch {
		case i < 3:
			if r.Err != nil || r.Grant.Fence != fences[rs[i].Key] || r.Grant.TTL < ttl {
				t.Errorf("%s: %+v, %v; want renewed with fence %d and at least %v", what, r.Grant, r.Err, fences[rs[i].Key], ttl)
			}
		case rs[i].Key == "long":
			if !errors.Is(r.Err, backend.ErrInvalid) {
				t.Errorf("%s, for a TTL longer than the session's: %v; want ErrInvalid", what, r.Err)
			}
		default:
			if !errors.Is(r.Err, backend.ErrNotHeld) || r.Grant != (backend.Grant{}) {
				t.Errorf("%s: %+v, %v; want ErrNotHeld", what, r.Grant, r.Err)
			}
		}
	}
	for _, k := range keys[:3] {
		if h, err := b.Inspect(ctx, k); err != nil || h.Token != toks[k] {
			t.Errorf("Inspect %q after the batch: %+v, %v; want held by its token", k, h, err)
		}
	}
	b.Close()
	for _, r := range b.RenewBatch(ctx, rs[:2]) {
		if !errors.Is(r.Err, backend.ErrClosed) {
			t.Errorf("RenewBatch after Close: %v; want ErrClosed", r.Err)
		}
	}
}

// countingTransport counts the requests of each path.
type countingTransport struct {
	mu    sync.Mutex
	paths map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	p := r.URL.Path
	if strings.HasPrefix(p, "/v1/session/renew/") {
		p = "/v1/session/renew/"
	}
	c.mu.Lock()
	c.paths[p]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

// A batch checks its entries in transactions of at most 64 operations, not
// one each: 100 renewals are 100 session renewals and two transactions.
func TestRenewBatchSharesChecks(t *testing.T) {
	agent := consultest.Start(t)
	ct := &countingTransport{paths: map[string]int{}}
	b, err := consul.New(clientVia(t, agent.Addr, ct), consul.WithMinTTL(consultest.MinTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	const n, ttl = 100, 5 * time.Second
	rs := make([]backend.Renewal, n)
	for i := range rs {
		rs[i] = backend.Renewal{Key: fmt.Sprintf("k%d", i), Token: rand.Text(), TTL: ttl}
		if _, err := b.Acquire(ctx, rs[i].Key, rs[i].Token, ttl); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
	}
	ct.mu.Lock()
	clear(ct.paths)
	ct.mu.Unlock()
	for i, r := range b.RenewBatch(ctx, rs) {
		if r.Err != nil {
			t.Fatalf("renewal %d: %v", i, r.Err)
		}
	}
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if txns, renews := ct.paths["/v1/txn"], ct.paths["/v1/session/renew/"]; txns != 2 || renews != n {
		t.Errorf("a batch of %d renewals sent %d transactions and %d session renewals (all: %v); want 2 and %d", n, txns, renews, ct.paths, n)
	}
}

// A batch whose answers are lost gives every renewal an unknown outcome:
// neither a grant nor ErrNotHeld; the locks are still held.
func TestRenewBatchLostAnswers(t *testing.T) {
	agent := consultest.Start(t)
	px := faultproxy.Start(t, agent.Addr)
	b, _ := newBackend(t, px.Addr)
	defer b.Close()
	_, outside := newBackend(t, agent.Addr)
	ctx := context.Background()
	const ttl = 5 * time.Second
	rs := make([]backend.Renewal, 5)
	for i := range rs {
		rs[i] = backend.Renewal{Key: fmt.Sprintf("k%d", i), Token: rand.Text(), TTL: ttl}
		if _, err := b.Acquire(ctx, rs[i].Key, rs[i].Token, ttl); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
	}
	px.Hold(faultproxy.ToClient)
	bctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	res := b.RenewBatch(bctx, rs)
	cancel()
	px.Deliver(faultproxy.ToClient)
	for i, r := range res {
		if r.Err == nil || errors.Is(r.Err, backend.ErrNotHeld) || r.Grant != (backend.Grant{}) {
			t.Errorf("renewal %d with its answer lost: %+v, %v; want an error of unknown outcome", i, r.Grant, r.Err)
		}
	}
	for _, r := range rs {
		sessionOf(t, outside, r.Key)
	}
}
