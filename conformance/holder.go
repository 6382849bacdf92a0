package conformance

import (
	"errors"
	"testing"

	"github.com/distlock/lock"
)

// holderLabel: Client.Inspect reports a lock's holder as the store sees
// it: its fence and remaining TTL, and, on a backend that declares
// Capabilities.Labels, the description the holder set (lock.WithHolder,
// per Client or per acquisition; lock.DefaultHolder() otherwise). A
// description describes its holder only: it goes with the release, it is
// not reported for the next holder of the key (after a release, an expiry
// or a handover), and it lasts as long as renewals keep the lock. A
// backend that does not declare Labels reports no description.
func (s *suite) holderLabel(t *testing.T) {
	ctx := s.ctx(t)
	const desc = "worker-7 on host-a (conformance)"
	c := s.client(t, lock.WithTTL(s.long), lock.WithHolder(desc))
	reader := s.client(t)
	inspect := func(key string) lock.Holder {
		t.Helper()
		h, err := reader.Inspect(ctx, key)
		if errors.Is(err, errors.ErrUnsupported) {
			t.Skipf("the backend cannot report a key's holder: %v", err)
		}
		if err != nil {
			t.Fatalf("Inspect(%q): %v", key, err)
		}
		return h
	}
	want := func(label string) string {
		if !s.caps.Labels {
			return ""
		}
		return label
	}

	// The Client's description, the fence and the remaining TTL.
	key := s.key(t)
	l, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	h := inspect(key)
	if !h.Held || h.Fence != l.Fence() || h.Description != want(desc) || h.Remaining > s.caps.LatestExpiry(s.long) {
		t.Fatalf("Inspect of a held lock: %+v; want held with fence %d, description %q and at most %v remaining", h, l.Fence(), want(desc), s.caps.LatestExpiry(s.long))
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if h := inspect(key); h != (lock.Holder{}) {
		t.Fatalf("Inspect after the release: %+v; want the zero Holder (free)", h)
	}

	// An acquisition's own description, then the default, on the same
	// key: each holder shows its own.
	l, err = c.TryAcquire(ctx, key, lock.WithHolder("per call"))
	if err != nil {
		t.Fatalf("TryAcquire with WithHolder: %v", err)
	}
	if h := inspect(key); h.Description != want("per call") {
		t.Fatalf("Inspect of a lock taken with WithHolder(\"per call\"): description %q; want %q", h.Description, want("per call"))
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if l, err = reader.TryAcquire(ctx, key, lock.WithTTL(s.long)); err != nil {
		t.Fatalf("TryAcquire with the default description: %v", err)
	}
	if h := inspect(key); h.Description != want(lock.DefaultHolder()) {
		t.Fatalf("Inspect of a lock taken without WithHolder: description %q; want %q (DefaultHolder)", h.Description, want(lock.DefaultHolder()))
	}

	// A waiter that takes the lock at its release (or, if its request
	// comes after the release, takes the free key) shows its own
	// description or none (a store that hands the lock on may not know
	// it), never the previous holder's.
	got := make(chan *lock.Lease, 1)
	go func() {
		w, err := c.Acquire(ctx, key, lock.WithHolder("the waiter"))
		if err != nil {
			t.Errorf("Acquire of a held key: %v", err)
		}
		got <- w
	}()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	w := <-got
	if w == nil {
		return
	}
	if h := inspect(key); !h.Held || h.Fence != w.Fence() || (h.Description != want("the waiter") && h.Description != "") {
		t.Fatalf("Inspect of a lock the waiter took at its release: %+v; want fence %d and description %q (or none)", h, w.Fence(), want("the waiter"))
	}
	if err := w.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}

	// Renewals keep the description as long as the lock; a lock that
	// expired leaves none to its next holder.
	renewed, err := c.TryAcquire(ctx, s.key(t), lock.WithTTL(s.short), lock.WithHolder("renewed"))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	expired, err := c.TryAcquire(ctx, key, lock.WithTTL(s.short), lock.WithAutoRenew(false), lock.WithHolder("expired"))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	s.waitOutExpiry(s.short)
	next, err := reader.TryAcquire(ctx, key, lock.WithTTL(s.long), lock.WithHolder(""))
	if err != nil {
		t.Fatalf("TryAcquire after the holder expired: %v", err)
	}
	if h := inspect(key); !h.Held || h.Fence != next.Fence() || h.Description != "" {
		t.Fatalf("Inspect of a lock taken without a description after a holder with one expired: %+v; want fence %d and no description", h, next.Fence())
	}
	if err := renewed.Err(); err != nil {
		t.Fatalf("a renewed lease: %v", err)
	}
	if h := inspect(renewed.Key()); !h.Held || h.Fence != renewed.Fence() || h.Description != want("renewed") {
		t.Fatalf("Inspect of a lock renewed past its first TTL: %+v; want fence %d and description %q", h, renewed.Fence(), want("renewed"))
	}
	for _, l := range []*lock.Lease{renewed, expired, next} {
		l.Release(ctx)
	}

	// A bad description is refused before anything is sent.
	for _, bad := range []string{"two\nlines", "esc\x1b[31m", string(make([]byte, lock.MaxHolderLen+1)), "\xff"} {
		if _, err := c.TryAcquire(ctx, key, lock.WithHolder(bad)); !errors.Is(err, lock.ErrInvalidOption) {
			t.Fatalf("TryAcquire with WithHolder(%.20q): %v; want ErrInvalidOption", bad, err)
		}
	}
	if h := inspect(key); h.Held {
		t.Fatalf("Inspect after refused acquisitions: %+v; want free", h)
	}
}
