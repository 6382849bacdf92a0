package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
)

// prefixing is a backend that names a prefix for its tokens and records
// the tokens it was asked to acquire with.
type prefixing struct {
	backend.Backend
	prefix string
	err    error
	mu     sync.Mutex
	tokens []string
}

func (p *prefixing) TokenPrefix(time.Duration) (string, error) { return p.prefix, p.err }

func (p *prefixing) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	p.mu.Lock()
	p.tokens = append(p.tokens, token)
	p.mu.Unlock()
	return p.Backend.Acquire(ctx, key, token, ttl)
}

// A backend.TokenPrefixer's prefix starts every token of the client's
// attempts for leases that renew themselves, which stay 32 bytes long and
// distinct, and no other; a prefix the contract does not allow, or an
// error, ends the attempt with nothing sent.
func TestTokenPrefix(t *testing.T) {
	ctx := context.Background()
	b := &prefixing{Backend: memory.New(), prefix: "Sabcdefg"}
	c, err := lock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 3; i++ {
		l, err := c.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for _, tok := range b.tokens {
		if !strings.HasPrefix(tok, "Sabcdefg") || len(tok) != 32 || seen[tok] {
			t.Fatalf("tokens %q: want 32 bytes each, distinct, starting with the backend's prefix", b.tokens)
		}
		seen[tok] = true
	}
	l, err := c.Acquire(ctx, "k", lock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if tok := b.tokens[len(b.tokens)-1]; strings.HasPrefix(tok, "S") {
		t.Errorf("token %q of a lease without automatic renewal has the backend's prefix", tok)
	}
	for _, bad := range []struct {
		prefix string
		err    error
	}{
		{"S123456789", nil}, // too long
		{"0123abcd", nil},   // hexadecimal digits alone: a token without a prefix
		{"0S", nil},         // a hexadecimal digit first
		{"S", backend.ErrClosed},
	} {
		b.prefix, b.err = bad.prefix, bad.err
		n := len(b.tokens)
		_, err := c.TryAcquire(ctx, "k")
		if err == nil || (bad.err != nil && !errors.Is(err, bad.err)) {
			t.Errorf("TryAcquire with token prefix %q and error %v: %v; want an error", bad.prefix, bad.err, err)
		}
		if len(b.tokens) != n {
			t.Errorf("TryAcquire with token prefix %q and error %v sent an acquire", bad.prefix, bad.err)
		}
	}
}

// failingRenewals is prefixing whose renewals fail (the store does not
// answer) and which records the releases it was asked for.
type failingRenewals struct {
	*prefixing
	released chan string
}

func (f *failingRenewals) Renew(context.Context, string, string, time.Duration) (backend.Grant, error) {
	return backend.Grant{}, errors.New("no answer")
}

func (f *failingRenewals) Release(ctx context.Context, key, token string) error {
	select {
	case f.released <- token:
	default:
	}
	return f.prefixing.Release(ctx, key, token)
}

// A lease whose token names the backend's session, lost at its deadline
// because its renewals failed, is released in the background: its lock
// could live on with its session, which the client's other leases renew.
func TestPrefixedLeaseLostAtItsDeadlineIsReleased(t *testing.T) {
	ctx := context.Background()
	b := &failingRenewals{prefixing: &prefixing{Backend: memory.New(), prefix: "Sabcdefg"}, released: make(chan string, 1)}
	c, err := lock.New(b, lock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	<-l.Done() // waits out the TTL: the renewals fail
	if !errors.Is(l.Err(), lock.ErrLost) {
		t.Fatalf("lease: %v; want ErrLost", l.Err())
	}
	select {
	case tok := <-b.released:
		if tok != l.Token() {
			t.Errorf("released token %q; want the lost lease's %q", tok, l.Token())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the lease lost at its deadline was not released within 5s")
	}
}
