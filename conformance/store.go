package conformance

import (
	"context"
	crand "crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// The cases of this file check the store's side of the contract directly,
// through package backend: how long a lock lives, how tokens compare, what
// a release after expiry says, wake-ups, Inspect after expiry, and fences
// after an idle gap.

// newToken returns a token as package lock makes them: 32 hex digits.
func newToken() string {
	var b [16]byte
	crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// pollInterval is how often the cases that watch for expiry try again.
const pollInterval = 2 * time.Millisecond

// takeWhenFree tries to acquire key on b with fresh tokens every
// pollInterval until it succeeds or ctx ends, and returns when its
// successful request's reply came, with the token.
func takeWhenFree(ctx context.Context, t *testing.T, b backend.Backend, key string, ttl time.Duration) (time.Time, string) {
	t.Helper()
	for {
		tok := newToken()
		_, err := b.Acquire(ctx, key, tok, ttl)
		switch {
		case err == nil:
			return time.Now(), tok
		case errors.Is(err, backend.ErrLocked), errors.Is(err, backend.ErrContended):
		default:
			t.Fatalf("Acquire while waiting for expiry: %v", err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("key never became free: %v", ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// expiryNotEarly: the store never expires a lock earlier than its TTL after
// it received the acquire or the renew (measured from the send, which comes
// before), nor earlier than the Grant.TTL it reported; a TTL between two
// steps of the store's granularity is rounded up, not down.
func (s *suite) expiryNotEarly(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	a, b := s.backend(t), s.backend(t)
	defer a.Close()
	defer b.Close()
	ttl := s.short
	if g := s.caps.Granularity; g > 0 {
		ttl += g / 2 // between two steps: must be rounded up
	}
	check := func(what string, sent time.Time, g backend.Grant) string {
		t.Helper()
		holds := max(ttl, g.TTL)
		time.Sleep(time.Until(sent.Add(holds / 2))) // nothing to see before
		wctx, cancel := context.WithTimeout(ctx, s.caps.LatestExpiry(holds)+s.slack+time.Second)
		defer cancel()
		at, tok := takeWhenFree(wctx, t, b, key, ttl)
		if early := sent.Add(holds).Sub(at); early > 0 {
			t.Fatalf("after %s (TTL %v, Grant.TTL %v), another owner took the key %v after the request was sent: %v early", what, ttl, g.TTL, at.Sub(sent).Round(time.Millisecond), early.Round(time.Millisecond))
		}
		return tok
	}
	tokA := newToken()
	sent := time.Now()
	g, err := a.Acquire(ctx, key, tokA, ttl)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	tokB := check("an acquire", sent, g)

	// b holds it now: renew it once, then watch from a.
	time.Sleep(ttl / 2)
	sent = time.Now()
	g, err = b.Renew(ctx, key, tokB, ttl)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	a, b = b, a
	tok := check("a renewal", sent, g)
	if err := b.Release(ctx, key, tok); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// heldKey returns a new backend (closed at the end of the case) holding a
// new key for a new token, for ttl.
func (s *suite) heldKey(t *testing.T, ttl time.Duration) (context.Context, string, backend.Backend, string) {
	t.Helper()
	ctx := s.ctx(t)
	key := s.key(t)
	b := s.backend(t)
	t.Cleanup(func() { b.Close() })
	tok := newToken()
	if _, err := b.Acquire(ctx, key, tok, ttl); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return ctx, key, b, tok
}

// tokenExact: renew and release compare whole tokens: a token that differs
// from the holder's in one character, first or last, changes nothing.
func (s *suite) tokenExact(t *testing.T) {
	ctx, key, b, tok := s.heldKey(t, s.long)
	flip := func(c byte) string {
		if c == '0' {
			return "1"
		}
		return "0"
	}
	for _, other := range []string{tok[:31] + flip(tok[31]), flip(tok[0]) + tok[1:], tok[:16] + newToken()[16:]} {
		if _, err := b.Renew(ctx, key, other, s.long); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Renew with %s, the holder being %s: %v; want ErrNotHeld", other, tok, err)
		}
		if err := b.Release(ctx, key, other); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Release with %s, the holder being %s: %v; want ErrNotHeld", other, tok, err)
		}
	}
	if _, err := b.Renew(ctx, key, tok, s.long); err != nil {
		t.Fatalf("the holder's Renew after the others' attempts: %v; want the lock still held", err)
	}
	if err := b.Release(ctx, key, tok); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// releaseAfterExpiry: releasing one's own lock after it expired, with no
// successor, returns ErrNotHeld from the store, and package lock reports
// the lease as lost.
func (s *suite) releaseAfterExpiry(t *testing.T) {
	ctx, key, b, tok := s.heldKey(t, s.short)
	c := s.client(t, lock.WithTTL(s.short), lock.WithAutoRenew(false))
	l, err := c.TryAcquire(ctx, key+"/lease")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	s.waitOutExpiry(s.short)
	if err := b.Release(ctx, key, tok); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("the store's Release of its own expired lock: %v; want ErrNotHeld", err)
	}
	if err := l.Release(ctx); err != nil || !errors.Is(l.Err(), lock.ErrLost) {
		t.Errorf("Release of an expired lease: %v, its Err %v; want nil, and Err wrapping ErrLost", err, l.Err())
	}
}

// wakeOnRelease: on a backend with wake-ups (backend.Notifier), a waiter in
// another client takes the key promptly after the holder releases it, not
// when its timer (the holder's remaining TTL) runs out.
func (s *suite) wakeOnRelease(t *testing.T) {
	b := s.backend(t)
	if _, ok := b.(backend.Notifier); !ok {
		b.Close()
		t.Skip("the backend offers no backend.Notifier")
	}
	ctx := s.ctx(t)
	key := s.key(t)
	holder := s.clientOver(t, b)
	waiter := s.client(t)
	l, err := holder.TryAcquire(ctx, key, lock.WithTTL(s.long))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	type got struct {
		at time.Time
		l  *lock.Lease
	}
	took := make(chan got, 1)
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Go(func() {
		w, err := waiter.Acquire(wctx, key, lock.WithTTL(s.long))
		if err != nil && wctx.Err() == nil {
			t.Errorf("Acquire: %v", err)
		}
		took <- got{time.Now(), w}
	})
	// Give the waiter time to find the key held and start waiting; if it
	// has not, it takes the key at once below, and the case still holds.
	time.Sleep(s.short)
	released := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	var g got
	select {
	case g = <-took:
	case <-time.After(s.slack + time.Second):
		t.Fatalf("the waiter was not woken within %v of the release (the holder's TTL was %v)", s.slack+time.Second, s.long)
	}
	if g.l == nil {
		t.FailNow()
	}
	if d := g.at.Sub(released); d > s.slack {
		t.Errorf("the waiter took the key %v after the release; want within %v", d, s.slack)
	}
	g.l.Release(ctx)
}

// inspectAfterExpiry: Inspect reports the current holder (its token, when
// the store reveals it, its fence, and a remaining TTL within the store's
// bounds), not an earlier one, and an expired lock as free.
func (s *suite) inspectAfterExpiry(t *testing.T) {
	in := s.inspector(t)
	ctx, key, b, first := s.heldKey(t, s.short)
	if err := b.Release(ctx, key, first); err != nil {
		t.Fatalf("Release: %v", err)
	}
	tok := newToken()
	g, err := b.Acquire(ctx, key, tok, s.short)
	if err != nil {
		t.Fatalf("Acquire after a release: %v", err)
	}
	h, err := in.Inspect(ctx, key)
	if err != nil || !h.Held || (h.Token != "" && h.Token != tok) || h.Fence != g.Fence || h.Remaining > s.caps.LatestExpiry(s.short) {
		t.Fatalf("Inspect of a held lock: %+v, %v; want held by %s with fence %d and at most %v remaining", h, err, tok, g.Fence, s.caps.LatestExpiry(s.short))
	}
	s.waitOutExpiry(s.short)
	if h, err := in.Inspect(ctx, key); err != nil || h.Held {
		t.Fatalf("Inspect after the lock expired: %+v, %v; want free", h, err)
	}
}

// fenceAfterIdle: fences keep increasing across idle gaps with no lock on
// the key: one of two latest expiries of the short TTL, and one of at
// least idleGap, longer than a second (a store that forgets its counter,
// or grants fence 0, after a second or two idle fails).
func (s *suite) fenceAfterIdle(t *testing.T) {
	ctx := s.ctx(t)
	key := s.key(t)
	c := s.client(t, lock.WithTTL(s.short))
	var last uint64
	var idle time.Duration
	for i := range 3 {
		if i > 0 {
			began := time.Now()
			s.waitOutExpiry(s.short)
			s.waitOutExpiry(s.short)
			if i == 2 {
				time.Sleep(idleGap - time.Since(began))
			}
			idle = time.Since(began)
		}
		l, err := c.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		if l.Fence() <= last {
			t.Fatalf("fence %d after an idle gap of %v; the one before was %d", l.Fence(), idle.Round(time.Millisecond), last)
		}
		last = l.Fence()
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

// idleGap is FenceAfterIdle's longest idle gap.
const idleGap = 2500 * time.Millisecond

// keyShapes: the store takes every key package lock accepts and keeps
// distinct keys apart, also those that a store's escaping, path cleaning,
// hashing, case folding or Unicode normalisation could merge: the longest
// key (lock.MaxKeyLen bytes), multi-byte UTF-8 and a NUL byte (each beside
// a key that differs only in its last character), "." and "..", "a/../b"
// and "b", "%2F" and "/", "a{b}" and its SHA-1 in hex, keys that differ only
// in case, and keys that differ only in Unicode normalisation.
//
// Each key, held by one client, is refused to another (ErrLocked), renews,
// and Inspect says it is held by its lease. Then every two of the keys are
// held at once by two clients: in round b, the first client holds the keys
// whose index has bit b clear and the second must take those with bit b
// set. Two distinct indexes differ in some bit, so two keys that share one
// lock in the store fail some round, whichever two they are.
func (s *suite) keyShapes(t *testing.T) {
	ctx := s.ctx(t)
	first, second := s.client(t, lock.WithTTL(s.long)), s.client(t, lock.WithTTL(s.long))
	b := s.backend(t)
	defer b.Close()
	in, inspects := unguarded(b).(backend.Inspector)

	// "." and ".." below are whole keys, the same in every run of the
	// suite: another run on the same store at the same time (another test
	// of the package, another package) would find them held. Runs take
	// turns: each holds this key while it sends them.
	turn, err := s.client(t, lock.WithTTL(s.long)).Acquire(ctx, "conformance/KeyShapes/turn")
	if err != nil {
		t.Fatalf("Acquire of the case's turn: %v", err)
	}
	defer turn.Release(ctx)

	p := s.key(t)
	braced := p + "/a{b}"
	sum := sha1.Sum([]byte(braced))
	keys := []string{
		p + strings.Repeat("k", lock.MaxKeyLen-len(p)),
		p + "/ключ/鍵/🔒",
		p + "/a\x00b",
		// Path-like and escape-like. "." and ".." are whole keys: under a
		// prefix they would not be path segments of their own.
		".", "..", "%2E", "%2E%2E",
		p + "/a/../b", p + "/b", p + "/./c", p + "/c", p + "//d", p + "/d",
		p + "/%2F", p + "//", p + "/e%2Ff", p + "/e/f",
		p + "/g/", p + "/g", p + "/h/./", p + "/h/",
		// A key with braces, and the key equal to its SHA-1 in hex (the
		// Redis backend once stored the first under the second).
		braced, hex.EncodeToString(sum[:]),
		// Case and Unicode normalisation: é precomposed and decomposed,
		// the Angstrom sign and the letter Å it normalises to.
		p + "/Case", p + "/case",
		p + "/\u00e9", p + "/e\u0301",
		p + "/\u212b", p + "/\u00c5",
	}
	for _, k := range keys[:3] {
		_, size := utf8.DecodeLastRuneInString(k)
		keys = append(keys, k[:len(k)-size]+"_")
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if err := lock.CheckKey(k); err != nil || seen[k] {
			t.Fatalf("conformance: key %q of the case is invalid (%v) or twice in the list", k, err)
		}
		seen[k] = true
	}

	releaseAll := func(ls []*lock.Lease) {
		t.Helper()
		for _, l := range ls {
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release of %q: %v", l.Key(), err)
			}
		}
	}
	// take acquires k, which nobody holds, with c; a refusal means that
	// the store took k for the lock of one of the keys held (said once
	// per key).
	merged := map[string]bool{}
	take := func(c *lock.Client, k string, held []*lock.Lease) *lock.Lease {
		t.Helper()
		l, err := c.TryAcquire(ctx, k)
		switch {
		case err == nil:
			return l
		case !errors.Is(err, lock.ErrLocked):
			t.Errorf("TryAcquire of a %d-byte key %q: %v", len(k), k, err)
			return nil
		case merged[k]:
			return nil
		}
		merged[k] = true
		same := "one of the keys held at the time"
		if inspects {
			if h, err := in.Inspect(ctx, k); err == nil && h.Held {
				for _, o := range held {
					if o.Token() == h.Token {
						same = fmt.Sprintf("%q", o.Key())
					}
				}
			}
		}
		t.Errorf("TryAcquire of %q, which nobody holds: %v; the store took it for the lock of %s", k, err, same)
		return nil
	}

	// Each key alone.
	var held []*lock.Lease
	for _, k := range keys {
		if l := take(first, k, held); l != nil {
			held = append(held, l)
		}
	}
	for _, l := range held {
		k := l.Key()
		if _, err := second.TryAcquire(ctx, k); !errors.Is(err, lock.ErrLocked) {
			t.Errorf("TryAcquire of the held key %q by another client: %v; want ErrLocked", k, err)
		}
		if err := l.Renew(ctx); err != nil {
			t.Errorf("Renew of %q: %v", k, err)
		}
		if inspects {
			if h, err := in.Inspect(ctx, k); err != nil || !h.Held || (h.Token != "" && h.Token != l.Token()) {
				t.Errorf("Inspect of %q: %+v, %v; want held by %s", k, h, err, l.Token())
			}
		}
	}
	releaseAll(held)

	// Every two keys at once, by two clients.
	for bit := 0; 1<<bit < len(keys); bit++ {
		var held []*lock.Lease
		for _, side := range []struct {
			c   *lock.Client
			bit int
		}{{first, 0}, {second, 1}} {
			for i, k := range keys {
				if i>>bit&1 == side.bit {
					if l := take(side.c, k, held); l != nil {
						held = append(held, l)
					}
				}
			}
		}
		releaseAll(held)
	}
}
