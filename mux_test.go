package lock_test

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
)

// Two URLMuxes register the same scheme name with different backends: each
// opens its own, and the default URLMux (the package-level functions)
// knows neither.
func TestURLMuxSchemesAreItsOwn(t *testing.T) {
	ctx := context.Background()
	mem, ok := lock.DefaultURLMux().Scheme("mem")
	if !ok {
		t.Fatal(`the default URLMux has no "mem" scheme; memory registers it`)
	}
	// a: "store" is the memory backend's mem scheme, copied.
	var a lock.URLMux
	mem.Name = "store"
	a.RegisterScheme(mem)
	// b: "store" is a private memory store per Open, counted.
	var b lock.URLMux
	var bOpens atomic.Int32
	b.RegisterScheme(lock.Scheme{Name: "store", Params: []string{"color"}, Open: func(_ context.Context, u *url.URL) (backend.Backend, error) {
		bOpens.Add(1)
		if u.Query().Get("color") == "" {
			return nil, errors.New("b: no color")
		}
		return memory.New(), nil
	}})

	ca, err := a.Open(ctx, "store://mux-test?ttl=5s")
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	cb, err := b.Open(ctx, "store://mux-test?color=red")
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	if n := bOpens.Load(); n != 1 {
		t.Errorf("b's opener ran %d times; want 1 (b.Open)", n)
	}
	l, err := ca.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if l.TTL() != 5*time.Second {
		t.Errorf("a's client: TTL %v; want 5s from the URL", l.TTL())
	}
	// a's "store" is the named memory store: the default mux's mem://
	// of the same name shares it.
	cd, err := lock.Open(ctx, "mem://mux-test")
	if err != nil {
		t.Fatal(err)
	}
	defer cd.Close()
	if _, err := cd.TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
		t.Errorf("mem://mux-test while a's store://mux-test holds k: %v; want ErrLocked (one store)", err)
	}
	// b's "store" is another backend.
	if lb, err := cb.TryAcquire(ctx, "k"); err != nil {
		t.Errorf("b's store://mux-test while a's holds k: %v; want it held (another backend)", err)
	} else {
		lb.Release(ctx)
	}

	for name, m := range map[string]*lock.URLMux{"a": &a, "b": &b} {
		if got := m.Schemes(); !slices.Equal(got, []string{"store"}) {
			t.Errorf("%s.Schemes() = %q; want [store]", name, got)
		}
	}
	if slices.Contains(lock.Schemes(), "store") {
		t.Errorf("lock.Schemes() = %q holds a URLMux's own scheme", lock.Schemes())
	}
	if !slices.Equal(lock.DefaultURLMux().Schemes(), lock.Schemes()) || lock.DefaultURLMux() != lock.DefaultURLMux() {
		t.Error("DefaultURLMux is not the URLMux of the package-level functions")
	}
	if _, err := lock.Open(ctx, "store://mux-test"); !errors.Is(err, lock.ErrUnknownScheme) {
		t.Errorf("lock.Open of a URLMux's own scheme: %v; want ErrUnknownScheme", err)
	}
	// The same name registered twice in one URLMux is a mistake in the
	// program, as in the default.
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(r.(string), "twice") {
				t.Errorf("a second RegisterScheme of store in one URLMux: panic %v; want one that says twice", r)
			}
		}()
		b.RegisterScheme(mem)
	}()
	// The copy is a copy: changing the Scheme returned changes nothing.
	s, _ := b.Scheme("store")
	s.Params[0] = "size"
	if s, _ := b.Scheme("store"); s.Params[0] != "color" {
		t.Errorf("b's store has params %q after a change to a copy; want [color]", s.Params)
	}
}

// A URLMux's errors are the default's: prefixed, with errors.Is, listing
// what is valid in that URLMux.
func TestURLMuxOpenErrors(t *testing.T) {
	ctx := context.Background()
	var empty lock.URLMux
	var m lock.URLMux
	m.RegisterScheme(lock.Scheme{Name: "store", Params: []string{"color"}, Open: func(context.Context, *url.URL) (backend.Backend, error) {
		return nil, errors.New("store: unreachable")
	}})
	for _, tc := range []struct {
		m         *lock.URLMux
		url, want string
		is        error
	}{
		{&empty, "store://x", "none is registered in this URLMux", lock.ErrUnknownScheme},
		{&m, "mem://x", "registered in this URLMux: store", lock.ErrUnknownScheme},
		{&m, "store://x?size=2", "valid: autorenew, color, drift, maxhold, ttl", lock.ErrInvalidOption},
		{&m, "store://x?ttl=soon", "want a Go duration", lock.ErrInvalidOption},
		{&m, "store://x#f", "fragment", lock.ErrInvalid},
		{&m, "://", "missing protocol scheme", lock.ErrInvalid},
		{lock.DefaultURLMux(), "nosuch://x", "(forgotten import?)", lock.ErrUnknownScheme},
	} {
		c, err := tc.m.Open(ctx, tc.url)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", tc.url)
			continue
		}
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "lock: Open ") {
			t.Errorf("Open(%q): %q; want %v mentioning %q", tc.url, err, tc.is, tc.want)
		}
	}
	if _, err := m.Open(ctx, "store://x"); err == nil || !strings.Contains(err.Error(), "store: unreachable") {
		t.Errorf("Open with a failing opener: %v; want the opener's error", err)
	}
	var noContext context.Context
	if _, err := m.Open(noContext, "store://x"); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("Open(nil ctx): %v; want ErrInvalid", err)
	}
}

// A URLMux redacts the secrets its schemes declare; the package-level
// RedactURL knows those of the default URLMux only.
func TestURLMuxRedacts(t *testing.T) {
	ctx := context.Background()
	var m lock.URLMux
	m.RegisterScheme(lock.Scheme{Name: "vault", Params: []string{"key"}, Secrets: []string{"key"}, Open: func(_ context.Context, u *url.URL) (backend.Backend, error) {
		return nil, errors.New("vault: refused key " + u.Query().Get("key"))
	}})
	raw := "vault://h?key=" + marker
	if got, want := m.RedactURL(raw), "vault://h?key=xxxxx"; got != want {
		t.Errorf("m.RedactURL(%q) = %q; want %q", raw, got, want)
	}
	if !m.URLHasSecrets(raw) {
		t.Errorf("m.URLHasSecrets(%q) = false", raw)
	}
	if got := m.RedactText("refused "+marker, raw); strings.Contains(got, marker) {
		t.Errorf("m.RedactText = %q shows the secret", got)
	}
	if got := lock.RedactURL(raw); got != raw {
		t.Errorf("lock.RedactURL(%q) = %q; want it unchanged (the default URLMux has no vault scheme)", raw, got)
	}
	_, err := m.Open(ctx, raw)
	if err == nil || strings.Contains(err.Error(), marker) || !strings.Contains(err.Error(), "vault://h?key=xxxxx") {
		t.Errorf("m.Open(%q): %v; want an error that shows the URL redacted and not the secret", raw, err)
	}
}
