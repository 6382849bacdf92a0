package conformance

import (
	"errors"
	"testing"

	"github.com/distlock/lock/backend"
)

// deadTokens: a store that can receive requests out of order (every store
// outside the process: see the backend package doc) keeps a released
// token dead. An acquire that arrives after its own token's release (the
// caller gave up, and its undo overtook it) is refused with ErrInvalid,
// whether the release freed the lock or found the token not holding it,
// and leaves the key free; a release sent again after it freed the lock
// answers nil. A store in the process receives requests in order and is
// not asked.
func (s *suite) deadTokens(t *testing.T) {
	if s.caps.InProcess {
		t.Log("the store is in the process: requests reach it in order, and released tokens need not stay dead")
		return
	}
	ctx := s.ctx(t)
	b := s.backend(t)
	defer b.Close()
	key := s.key(t)
	in, inspects := unguarded(b).(backend.Inspector)
	free := func(when string) {
		t.Helper()
		if !inspects {
			return
		}
		if h, err := in.Inspect(ctx, key); err != nil || h.Held {
			t.Fatalf("Inspect %s: %+v, %v; want the key free", when, h, err)
		}
	}

	held := newToken()
	if _, err := b.Acquire(ctx, key, held, s.long); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := b.Release(ctx, key, held); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := b.Acquire(ctx, key, held, s.long); !errors.Is(err, backend.ErrInvalid) {
		b.Release(ctx, key, held)
		t.Fatalf("an acquire that arrived after the release of its own token, which had freed the lock: %v; want an error wrapping ErrInvalid (the token is dead: backend doc, dead tokens)", err)
	}
	free("after an acquire with a dead token")
	if err := b.Release(ctx, key, held); err != nil {
		t.Fatalf("a release sent again after it freed the lock: %v; want nil (the token died holding the lock)", err)
	}

	never := newToken()
	if err := b.Release(ctx, key, never); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release of a token that never held the key: %v; want ErrNotHeld", err)
	}
	if _, err := b.Acquire(ctx, key, never, s.long); !errors.Is(err, backend.ErrInvalid) {
		b.Release(ctx, key, never)
		t.Fatalf("an acquire that arrived after the release of its own token, which had found it not holding the lock: %v; want an error wrapping ErrInvalid (a release that finds nothing kills the token too)", err)
	}
	free("after an acquire with a token killed by a release that found nothing")
}
