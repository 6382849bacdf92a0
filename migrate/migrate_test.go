package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
	"github.com/distlock/lock/migrate"
)

// stores is a move between two memory stores.
type stores struct{ from, to *memory.Store }

func newStores() stores { return stores{memory.NewStore(), memory.NewStore()} }

// client returns a Client of phase p, closed at the end of the test.
func (s stores) client(t *testing.T, p migrate.Phase, opts ...lock.Option) *lock.Client {
	t.Helper()
	c, err := migrate.NewClient(migrate.Config{From: s.from.NewBackend(), To: s.to.NewBackend(), Phase: p}, opts...)
	if err != nil {
		t.Fatalf("NewClient phase %d: %v", p, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestConfigRefusesBadInput(t *testing.T) {
	a, b := memory.New(), memory.New()
	for _, tc := range []struct {
		c    migrate.Config
		want string
	}{
		{migrate.Config{From: a, To: b}, "phase 0; want 1"},
		{migrate.Config{From: a, To: b, Phase: 5}, "phase 5; want 1"},
		{migrate.Config{To: b, Phase: 2}, "needs the From store"},
		{migrate.Config{From: a, Phase: 3}, "needs the To store"},
		{migrate.Config{To: b, Phase: 1}, "needs the From store"},
		{migrate.Config{From: a, Phase: 4}, "needs the To store"},
		{migrate.Config{From: a, To: a, Phase: 2}, "the same backend"},
		{migrate.Config{From: a, To: b, Phase: 3, Epoch: migrate.MaxEpoch + 1}, "want 0 to 126"},
	} {
		_, _, err := tc.c.Backend()
		if !errors.Is(err, migrate.ErrInvalidConfig) || !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want ErrInvalidConfig saying %q", tc.c, err, tc.want)
		}
	}
	// Phases 1 and 4 take one store; the other may be nil.
	if _, _, err := (migrate.Config{From: a, Phase: 1}).Backend(); err != nil {
		t.Errorf("phase 1 without To: %v", err)
	}
	if _, _, err := (migrate.Config{To: b, Phase: 4}).Backend(); err != nil {
		t.Errorf("phase 4 without From: %v", err)
	}
	// A conflicting epoch beside the phase's is refused.
	_, err := migrate.NewClient(migrate.Config{From: a, To: b, Phase: 3}, lock.WithFenceEpoch(0))
	if !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("phase 3 with WithFenceEpoch(0): %v; want ErrInvalidOption (phase 3 is epoch 1)", err)
	}
}

// TestAdjacentPhasesExclude: instances of any two phases that share a
// store never hold a key at once; phases 1 and 4, which share none, do
// (the negative control: why each phase must be everywhere before the
// next starts).
func TestAdjacentPhasesExclude(t *testing.T) {
	ctx := context.Background()
	for p := migrate.FromOnly; p <= migrate.ToOnly; p++ {
		for q := p; q <= migrate.ToOnly; q++ {
			s := newStores()
			a, b := s.client(t, p), s.client(t, q)
			l, err := a.TryAcquire(ctx, "k")
			if err != nil {
				t.Fatalf("phase %d: TryAcquire: %v", p, err)
			}
			_, err = b.TryAcquire(ctx, "k")
			apart := p == migrate.FromOnly && q == migrate.ToOnly // no store in common
			// A phase 1 lock is on From only, which phases 2 and 3
			// cannot tell from a lock of theirs half taken or half
			// released: they answer ErrContended (see both.halfDone).
			fromOnly := p == migrate.FromOnly && q > migrate.FromOnly && !apart
			switch {
			case fromOnly && !errors.Is(err, lock.ErrContended):
				t.Errorf("phase %d beside a phase 1 holder: the second TryAcquire gave %v; want ErrContended", q, err)
			case !apart && !fromOnly && !errors.Is(err, lock.ErrLocked):
				t.Errorf("phase %d beside phase %d: the second TryAcquire gave %v; want ErrLocked", p, q, err)
			case apart && err != nil:
				t.Errorf("negative control, phase %d beside phase %d: %v; want both held at once (they share no store)", p, q, err)
			}
			l.Release(ctx)
		}
	}
}

// TestFencesGrowThroughThePhases: a key taken in turn in phases 1, 2, 3
// and 4 gets growing fences, though From's counter is far above To's.
func TestFencesGrowThroughThePhases(t *testing.T) {
	ctx := context.Background()
	s := newStores()
	hot := s.client(t, migrate.FromOnly)
	for range 50 { // From's counter runs ahead
		l, err := hot.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		l.Release(ctx)
	}
	var last uint64
	for p := migrate.FromOnly; p <= migrate.ToOnly; p++ {
		l, err := s.client(t, p).TryAcquire(ctx, "k")
		if err != nil {
			t.Fatalf("phase %d: %v", p, err)
		}
		f := l.Fence()
		l.Release(ctx)
		if f <= last {
			t.Fatalf("phase %d: fence %#x after %#x; want it to grow", p, f, last)
		}
		wantEpoch := uint64(0)
		if p >= migrate.BothToFences {
			wantEpoch = 1
		}
		if e := f >> lock.FenceEpochShift; e != wantEpoch {
			t.Errorf("phase %d: fence %#x has epoch %d; want %d", p, f, e, wantEpoch)
		}
		last = f
	}
}

// TestRefusalByToUndoesFrom: when To refuses, the From grant is undone
// before Acquire returns, so a phase 1 instance gets the key at once.
func TestRefusalByToUndoesFrom(t *testing.T) {
	ctx := context.Background()
	s := newStores()
	holder := s.client(t, migrate.ToOnly)
	l, err := holder.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if _, err := s.client(t, migrate.BothToFences).TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("phase 3 beside a phase 4 holder: %v; want ErrLocked", err)
	}
	if h, _ := s.from.NewBackend().Inspect(ctx, "k"); h.Held {
		t.Fatalf("From still holds the key for %s after To refused; want it undone", h.Token)
	}
}

// counted counts a memory client's Acquires, and calls spun past limit
// (a waiter that spins would keep virtual time from moving on).
type counted struct {
	*memory.Backend
	acquires *atomic.Int64
	limit    int64
	spun     func()
}

func (c counted) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	if c.acquires.Add(1) > c.limit {
		c.spun()
	}
	return c.Backend.Acquire(ctx, key, token, ttl)
}

// TestWaiterRefusedByToWaits: a phase 3 waiter that To refuses (a phase 4
// holder) waits for To; it does not wake itself with its own undo on
// From and spin. The watch it had on From is closed, so a phase 1 waiter
// behind it on From is woken by that undo.
func TestWaiterRefusedByToWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := newStores()
		var attempts atomic.Int64
		wctx, spun := context.WithCancel(ctx)
		defer spun()
		from := counted{s.from.NewBackend(), &attempts, 100, spun}
		waiter, err := migrate.NewClient(migrate.Config{From: from, To: s.to.NewBackend(), Phase: migrate.BothToFences})
		if err != nil {
			t.Fatal(err)
		}
		defer waiter.Close()
		holder := s.client(t, migrate.ToOnly, lock.WithAutoRenew(false))
		l, err := holder.TryAcquire(ctx, "k", lock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			w, err := waiter.Acquire(wctx, "k")
			if err == nil {
				w.Release(ctx)
			}
			got <- err
		}()
		time.Sleep(30 * time.Second) // half the holder's TTL
		synctest.Wait()
		if n := attempts.Load(); n > 6 {
			t.Fatalf("the waiter tried %d times in 30s while To was held; want it to wait for To's release", n)
		}
		l.Release(ctx)
		if err := <-got; err != nil {
			t.Fatalf("the waiter after To's release: %v", err)
		}
	})
}

// flaky is a memory client whose next Release calls fail (after the store
// acted, as a reply lost) while fail > 0. With forget, it answers
// ErrNotHeld to a release of a token it released before, as a store may
// once it no longer remembers the first release (backend.Backend.Release).
type flaky struct {
	*memory.Backend
	mu       sync.Mutex
	fail     int
	calls    int
	forget   bool
	released map[string]bool
}

var errReplyLost = errors.New("reply lost")

func (f *flaky) Release(ctx context.Context, key, token string) error {
	err := f.Backend.Release(ctx, key, token)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.forget && f.released[token] {
		err = backend.ErrNotHeld
	}
	if err == nil {
		if f.released == nil {
			f.released = map[string]bool{}
		}
		f.released[token] = true
	}
	if f.fail > 0 {
		f.fail--
		return fmt.Errorf("%w after the store answered %v", errReplyLost, err)
	}
	return err
}

// TestHalfReleaseIsNoLoss: a release that From answered and To's reply
// was lost for is sent again to To only: From, asked again, could say
// ErrNotHeld and report a lease held to its release as lost.
func TestHalfReleaseIsNoLoss(t *testing.T) {
	ctx := context.Background()
	s := newStores()
	to := &flaky{Backend: s.to.NewBackend(), fail: 1}
	from := &flaky{Backend: s.from.NewBackend(), forget: true}
	b, _, err := migrate.Config{From: from, To: to, Phase: migrate.BothFromFences}.Backend()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const token = "0123456789abcdef0123456789abcdef"
	if _, err := b.Acquire(ctx, "k", token, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "k", token); !errors.Is(err, errReplyLost) {
		t.Fatalf("first release: %v; want To's lost reply", err)
	}
	before := from.calls
	if err := b.Release(ctx, "k", token); err != nil {
		t.Fatalf("release sent again: %v; want nil (both stores released it once)", err)
	}
	if from.calls != before {
		t.Errorf("From was asked again after it answered; want To only")
	}
}

// TestUndoFailureIsUnknown: when To refuses and the undo on From fails,
// Acquire does not say ErrLocked (the From grant may stand); package lock
// then releases the token on both stores, and the key is free.
func TestUndoFailureIsUnknown(t *testing.T) {
	ctx := context.Background()
	s := newStores()
	l, err := s.client(t, migrate.ToOnly).TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	from := &flaky{Backend: s.from.NewBackend(), fail: 1}
	b, epoch, err := migrate.Config{From: from, To: s.to.NewBackend(), Phase: migrate.BothToFences}.Backend()
	if err != nil {
		t.Fatal(err)
	}
	c, err := lock.New(b, epoch)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.TryAcquire(ctx, "k")
	if errors.Is(err, lock.ErrLocked) || !errors.Is(err, errReplyLost) {
		t.Fatalf("TryAcquire with a failed undo: %v; want the undo's error, not ErrLocked", err)
	}
	c.Close() // waits for the cleanup
	if h, _ := s.from.NewBackend().Inspect(ctx, "k"); h.Held {
		t.Fatalf("From still holds the key after the cleanup")
	}
	l.Release(ctx)
}

// TestURL: a migrate URL opens each phase over named memory stores, sets
// the phase's epoch, and refuses bad input with messages that say what is
// valid.
func TestURL(t *testing.T) {
	ctx := context.Background()
	u := func(phase string, extra ...string) string {
		q := url.Values{"from": {"mem://migrate-url-from"}, "to": {"mem://migrate-url-to"}, "phase": {phase}}
		for i := 0; i+1 < len(extra); i += 2 {
			q.Set(extra[i], extra[i+1])
		}
		return "migrate://?" + q.Encode()
	}
	for _, name := range []string{"mem://migrate-url-from", "mem://migrate-url-to"} {
		keep, err := lock.Open(ctx, name) // a named store lives while it has clients
		if err != nil {
			t.Fatal(err)
		}
		defer keep.Close()
	}
	var fences []uint64
	for _, p := range []string{"1", "2", "3", "4"} {
		c, err := lock.Open(ctx, u(p, "ttl", "5s"))
		if err != nil {
			t.Fatalf("phase %s: %v", p, err)
		}
		l, err := c.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatalf("phase %s: %v", p, err)
		}
		if l.TTL() != 5*time.Second {
			t.Errorf("phase %s: TTL %v; want the URL's 5s", p, l.TTL())
		}
		fences = append(fences, l.Fence())
		l.Release(ctx)
		c.Close()
	}
	if fences[2]>>lock.FenceEpochShift != 1 || fences[3] <= fences[2] || fences[1] <= fences[0] {
		t.Errorf("fences of phases 1-4 over the URL: %#x; want growing, epoch 1 from phase 3", fences)
	}
	c, err := lock.Open(ctx, u("2", "epoch", "4"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.TryAcquire(ctx, "k")
	if err != nil || l.Fence()>>lock.FenceEpochShift != 4 {
		t.Fatalf("phase 2 with epoch=4: %v, fence %#x; want epoch 4", err, l.Fence())
	}
	l.Release(ctx)
	c.Close()
	for _, tc := range []struct{ url, want string }{
		{u("0"), "want phase=1 (from only)"},
		{u("x"), "want phase=1"},
		{u("2", "epoch", "127"), "want 0 to 126"},
		{"migrate://?from=mem://a&phase=1", "want both from=URL and to=URL"},
		{"migrate://?from=mem://a&to=mem://a&phase=2", "the same URL"},
		{"migrate://host?from=mem://a&to=mem://b&phase=2", "no host"},
		{u("2", "from", "mem://a?ttl=1s"), "give them on the migrate URL"},
		{u("2", "from", "nope://x"), `unknown URL scheme "nope"`},
		{u("2", "to", u("2")), "is a migrate URL"},
		{u("2", "bogus", "1"), `unknown query parameter "bogus"`},
	} {
		_, err := lock.Open(ctx, tc.url)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%s): %v; want an error saying %q", tc.url, err, tc.want)
		}
	}
}

// TestURLRedaction: the secrets of the from and to URLs are hidden where a
// migrate URL is shown, and the rest of them is not.
func TestURLRedaction(t *testing.T) {
	raw := "migrate://?from=" + url.QueryEscape("redis://:hunter22@r1:6379/0?password=s3cr3tpw") + "&to=etcd://user:pw%3Aetcd9@e1:2379&phase=2"
	shown := lock.RedactURL(raw)
	for _, secret := range []string{"hunter22", "s3cr3tpw", "etcd9"} {
		if strings.Contains(shown, secret) {
			t.Errorf("RedactURL shows %q: %s", secret, shown)
		}
	}
	for _, kept := range []string{"r1:6379", "e1:2379", "user:", "phase=2"} {
		if !strings.Contains(shown, kept) {
			t.Errorf("RedactURL hides %q, which is not a secret: %s", kept, shown)
		}
	}
	text := lock.RedactText("dial redis://:hunter22@r1 failed; raw "+raw, raw)
	for _, secret := range []string{"hunter22", "s3cr3tpw", "etcd9"} {
		if strings.Contains(text, secret) {
			t.Errorf("RedactText leaves %q: %s", secret, text)
		}
	}
	plain := "migrate://?" + url.Values{"from": {"redis://r1:6379/0"}, "to": {"etcd://e1:2379?prefix=a%26b"}, "phase": {"2"}}.Encode()
	if lock.URLHasSecrets(plain) {
		t.Errorf("URLHasSecrets(%s): true; want false (no credentials in it)", plain)
	}
	if !lock.URLHasSecrets(raw) {
		t.Errorf("URLHasSecrets(%s): false; want true", raw)
	}
	if lock.SkipsVerify(plain) || !lock.SkipsVerify("migrate://?from=redis://r1&to="+url.QueryEscape("etcds://e1:2379?skip_verify=true")+"&phase=2") {
		t.Errorf("SkipsVerify does not see skip_verify=true in a nested URL, or sees it where it is not")
	}
	_, err := lock.Open(context.Background(), strings.Replace(raw, "phase=2", "phase=9", 1))
	if err == nil || strings.Contains(err.Error(), "hunter22") || strings.Contains(err.Error(), "etcd9") {
		t.Errorf("Open's error shows a secret: %v", err)
	}
}

// TestCheck: a key held on From only (a phase 1 instance) is not clear for
// phases 3 and 4, a key held on both by one token is, and every key is
// clear for phase 2.
func TestCheck(t *testing.T) {
	ctx := context.Background()
	s := newStores()
	old, err := s.client(t, migrate.FromOnly).TryAcquire(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	dual, err := s.client(t, migrate.BothFromFences).TryAcquire(ctx, "dual")
	if err != nil {
		t.Fatal(err)
	}
	from, to := s.from.NewBackend(), s.to.NewBackend()
	keys := []string{"old", "dual", "free"}
	for next, want := range map[migrate.Phase][]bool{2: {true, true, true}, 3: {false, true, true}, 4: {false, true, true}} {
		got, err := migrate.Check(ctx, from, to, next, keys, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range got {
			if c.Clear != want[i] {
				t.Errorf("next phase %d, key %s: clear %v (%s); want %v", next, c.Key, c.Clear, c.Why, want[i])
			}
		}
	}
	old.Release(ctx)
	dual.Release(ctx)
	got, err := migrate.Check(ctx, from, to, 3, keys, 0)
	if err != nil || !got[0].Clear {
		t.Errorf("after the phase 1 holder released: %+v, %v; want clear", got, err)
	}
	if _, err := migrate.Check(ctx, from, to, 1, keys, 0); !errors.Is(err, migrate.ErrInvalidConfig) {
		t.Errorf("Check for phase 1: %v; want ErrInvalidConfig", err)
	}
}
