package consul_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/consul"
	"github.com/distlock/lock/internal/consultest"
)

// lockGate is an HTTP transport that, once armed, holds one transaction on
// its way to the agent: the first that locks entry with the value token.
// held is closed when it is held; closing open lets it go.
type lockGate struct {
	next http.RoundTripper
	held chan struct{}
	open chan struct{}

	mu    sync.Mutex
	match []byte // nil: not armed, or the transaction was held already
}

func newLockGate(next http.RoundTripper) *lockGate {
	return &lockGate{next: next, held: make(chan struct{}), open: make(chan struct{})}
}

// arm holds the next transaction that locks entry with token.
func (g *lockGate) arm(entry, token string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.match = []byte(`"Verb":"lock","Key":"` + entry + `","Value":"` + base64.StdEncoding.EncodeToString([]byte(token)) + `"`)
}

func (g *lockGate) RoundTrip(r *http.Request) (*http.Response, error) {
	body, ok, err := txnBody(r)
	if err != nil {
		return nil, err
	}
	if ok {
		g.mu.Lock()
		hold := g.match != nil && bytes.Contains(body, g.match)
		if hold {
			g.match = nil
		}
		g.mu.Unlock()
		if hold {
			close(g.held)
			select {
			case <-g.open:
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		}
	}
	return g.next.RoundTrip(r)
}

// A waiter's attempt that finds the key free after it queued tries the
// lock with its token; a release may hand the lock to that same token
// (the queued record's) before the attempt's lock transaction lands. The
// transaction then succeeds on the session that already holds the lock,
// and the attempt's grant is the caller's lease: the handover's token is
// the lease's own, not one to forget. (The place used to take every
// handover reported meanwhile for an earlier token and kill it, its own
// included: the lease's release then failed with ErrNotHeld, a false loss
// that left the entry locked until its session expired. Seen in the flash
// sale between migration phases 3 and 4.)
func TestAttemptHandedItsOwnToken(t *testing.T) {
	agent := consultest.Start(t)
	ctx := context.Background()
	other, _ := newBackend(t, agent.Addr, consul.WithLockDelay(0))
	defer other.Close()

	key := "k"
	tr := &http.Transport{}
	gate := newLockGate(tr)
	wb, err := consul.New(clientVia(t, agent.Addr, gate), consul.WithMinTTL(consultest.MinTTL), consul.WithLockDelay(0))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	defer wb.Close()

	// The waiter finds the key held: the key is hot, so its place enqueues
	// first and tries the lock only if the queue's read finds it free.
	ht := newToken()
	if _, err := other.Acquire(ctx, key, ht, queueTTL); err != nil {
		t.Fatal(err)
	}
	if _, err := wb.Acquire(ctx, key, newToken(), queueTTL); !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("acquire of a held key: %v; want ErrLocked", err)
	}
	if err := other.Release(ctx, key, ht); err != nil {
		t.Fatal(err)
	}

	tok := newToken()
	gate.arm(wb.Entry(key), tok)
	q, err := wb.Queue(key)
	if err != nil {
		t.Fatal(err)
	}
	took := false
	defer func() { q.Close(took) }()
	type result struct {
		g   backend.Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := q.Acquire(ctx, tok, queueTTL)
		got <- result{g, err}
	}()
	<-gate.held // queued with tok, found the key free, and tries it

	// Another client takes the free key and releases it: the release
	// finds the waiter's record and hands the lock to tok.
	ht = newToken()
	if _, err := other.Acquire(ctx, key, ht, queueTTL); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, key, ht); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waiter's watch to report the handover to its own token", func() bool {
		return wb.OwnedFence(tok) != 0
	})
	close(gate.open)

	r := <-got
	if r.err != nil {
		t.Fatalf("the attempt: %v; want a grant (the lock is its token's)", r.err)
	}
	took = true
	if _, err := wb.Renew(ctx, key, tok, queueTTL); err != nil {
		t.Fatalf("renewal of the granted lock: %v", err)
	}
	if err := wb.Release(ctx, key, tok); err != nil {
		t.Fatalf("release of the granted lock: %v; want nil", err)
	}
	if h, err := other.Inspect(ctx, key); err != nil || h.Held {
		t.Fatalf("after the release: %+v, %v; want the key free", h, err)
	}
}

// txnBody returns the body of a transaction request (ok), read and put
// back for the request to be sent.
func txnBody(r *http.Request) (body []byte, ok bool, err error) {
	if r.Method != http.MethodPut || r.URL.Path != "/v1/txn" || r.Body == nil {
		return nil, false, nil
	}
	body, err = io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, false, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, true, nil
}
