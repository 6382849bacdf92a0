package waitq

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
)

// fakeStore is a scripted Store: each test sets the primitives it expects
// (an Attempt it did not script fails the test), and reads back the calls.
type fakeStore struct {
	t       *testing.T
	attempt func(n int, a Attempt) (Result, error) // n counts from 1
	refresh func(ctx context.Context) (Refreshed, error)
	leave   func(l Leaving)

	mu       sync.Mutex
	calls    []string
	attempts []Attempt
	stopped  []stopCall
}

type stopCall struct {
	took   bool
	handed *backend.Handover
}

func (f *fakeStore) note(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func (f *fakeStore) Attempt(_ context.Context, a Attempt) (Result, error) {
	f.mu.Lock()
	f.calls = append(f.calls, "attempt")
	f.attempts = append(f.attempts, a)
	n := len(f.attempts)
	f.mu.Unlock()
	if f.attempt == nil {
		f.t.Errorf("unexpected Attempt %+v", a)
		return Result{}, errors.New("unexpected Attempt")
	}
	return f.attempt(n, a)
}

func (f *fakeStore) Refresh(ctx context.Context, _ time.Duration) (Refreshed, error) {
	f.note("refresh")
	if f.refresh == nil {
		return Refreshed{}, nil
	}
	return f.refresh(ctx)
}

func (f *fakeStore) Leave(_ context.Context, l Leaving) error {
	f.note("leave")
	if f.leave != nil {
		f.leave(l)
	}
	return nil
}

func (f *fakeStore) Stop(took bool, handed *backend.Handover) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "stop")
	f.stopped = append(f.stopped, stopCall{took, handed})
}

func (f *fakeStore) seen() ([]string, []Attempt) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls), slices.Clone(f.attempts)
}

// newPlace returns a place over f, closed (as taken: no Leave) at the end
// of the test, its group's leaves waited for.
func newPlace(t *testing.T, f *fakeStore) (*Group, *Place) {
	f.t = t
	g := NewGroup()
	p := g.New(f)
	t.Cleanup(func() {
		p.Close(true)
		g.Close()
	})
	return g, p
}

// queued scripts an Attempt refused with the place queued, its record
// written by a request sent at sent.
func queued(sent time.Time) (Result, error) {
	return Result{Queued: true, Refreshed: sent}, backend.Locked(time.Minute)
}

const (
	tokA, tokB = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	long       = time.Minute // no refresh comes during a test
	short      = 30 * time.Millisecond
	patience   = 10 * time.Second // bounds waits for what must come
)

func wantLocked(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, backend.ErrLocked) {
		t.Fatalf("Acquire: %v; want ErrLocked", err)
	}
}

// receive waits for a value on ch, for at most patience.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("no %s within %v", what, patience)
		panic("unreachable")
	}
}

func woken(p *Place) bool {
	select {
	case <-p.C():
		return true
	default:
		return false
	}
}

// TestOneTTL: an attempt with another TTL than the place's first is
// refused with ErrInvalid, and the store is not asked.
func TestOneTTL(t *testing.T) {
	f := &fakeStore{attempt: func(int, Attempt) (Result, error) { return queued(time.Now()) }}
	_, p := newPlace(t, f)
	_, err := p.Acquire(context.Background(), tokA, long)
	wantLocked(t, err)
	if _, err := p.Acquire(context.Background(), tokB, 2*long); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("Acquire with another TTL: %v; want ErrInvalid", err)
	}
	if _, as := f.seen(); len(as) != 1 {
		t.Errorf("%d Attempts; want 1: the one with another TTL must not reach the store", len(as))
	}
}

// TestGoneRetriedOnce: ErrGone from Attempt is tried once more, with
// Fresh set; a second ErrGone is the caller's error.
func TestGoneRetriedOnce(t *testing.T) {
	t.Run("then granted", func(t *testing.T) {
		f := &fakeStore{attempt: func(n int, a Attempt) (Result, error) {
			if n == 1 {
				return Result{}, ErrGone
			}
			return Result{Grant: backend.Grant{Fence: 5}}, nil
		}}
		_, p := newPlace(t, f)
		g, err := p.Acquire(context.Background(), tokA, long)
		if err != nil || g.Fence != 5 {
			t.Fatalf("Acquire: %+v, %v; want the second attempt's grant", g, err)
		}
		if _, as := f.seen(); len(as) != 2 || as[0].Fresh || !as[1].Fresh {
			t.Errorf("Attempts %+v; want two, the second alone Fresh", as)
		}
	})
	t.Run("gone twice", func(t *testing.T) {
		f := &fakeStore{attempt: func(int, Attempt) (Result, error) { return Result{}, ErrGone }}
		_, p := newPlace(t, f)
		g, err := p.Acquire(context.Background(), tokA, long)
		if err == nil || g != (backend.Grant{}) || errors.Is(err, backend.ErrLocked) {
			t.Fatalf("Acquire: %+v, %v; want an error", g, err)
		}
		if _, as := f.seen(); len(as) != 2 || !as[1].Fresh {
			t.Errorf("Attempts %+v; want two, the second Fresh", as)
		}
	})
}

// TestEarlyHandoff: a handover to the token of an attempt still on its
// way, before the place has a confirmed refresh, is kept until the attempt
// returns; it is reported then, counted from the attempt's refresh, and
// dropped when the attempt confirmed none.
func TestEarlyHandoff(t *testing.T) {
	grant := backend.Grant{Fence: 9, TTL: long}
	for _, confirmed := range []bool{true, false} {
		f := &fakeStore{}
		_, p := newPlace(t, f)
		sent := time.Now()
		f.attempt = func(_ int, a Attempt) (Result, error) {
			if !p.Handoff(a.Token, grant) {
				t.Error("Handoff during the attempt refused; want it kept")
			}
			if _, ok := p.Handed(); ok {
				t.Error("Handed reports a handover before the attempt returned")
			}
			if !confirmed {
				return Result{Queued: true}, backend.Locked(0)
			}
			return queued(sent)
		}
		_, err := p.Acquire(context.Background(), tokA, long)
		wantLocked(t, err)
		h, ok := p.Handed()
		switch {
		case !confirmed && ok:
			t.Errorf("Handed %+v after an attempt with no confirmed refresh; want none (nothing to count from)", h)
		case !confirmed:
		case !ok || h.Token != tokA || h.Grant != grant || !h.Since.Equal(sent):
			t.Errorf("Handed %+v, %v; want token %s, grant %+v, Since %v (the attempt's Refreshed)", h, ok, tokA, grant, sent)
		case !woken(p):
			t.Error("no wake-up for the handover")
		}
	}
}

// TestHandoffTokens: a handover to a token that never queued the place is
// refused; one to a queued token counts from the latest confirmed refresh,
// not from the attempt's, nor from a refresh of unknown outcome.
func TestHandoffTokens(t *testing.T) {
	sent := time.Now()
	inFirst := make(chan time.Time, 1)
	third := make(chan struct{})
	var refreshes atomic.Int32
	f := &fakeStore{
		attempt: func(int, Attempt) (Result, error) { return queued(sent) },
		refresh: func(ctx context.Context) (Refreshed, error) {
			switch refreshes.Add(1) {
			case 1:
				inFirst <- time.Now()
				return Refreshed{}, nil
			case 2:
				return Refreshed{}, errors.New("outcome unknown")
			case 3:
				close(third) // the outcomes of the first two are recorded
			}
			<-ctx.Done()
			return Refreshed{}, ctx.Err()
		},
	}
	_, p := newPlace(t, f)
	_, err := p.Acquire(context.Background(), tokA, short)
	wantLocked(t, err)
	at := receive(t, inFirst, "refresh")
	receive(t, third, "third refresh")
	if p.Handoff(tokB, backend.Grant{Fence: 3, TTL: short}) {
		t.Error("Handoff to a token that never queued the place accepted")
	}
	if !p.Handoff(tokA, backend.Grant{Fence: 3, TTL: short}) {
		t.Fatal("Handoff to the queued token refused")
	}
	h, ok := p.Handed()
	if !ok || h.Token != tokA || !h.Since.After(sent) || h.Since.After(at) || !h.Since.Equal(p.Refreshed()) {
		t.Errorf("Handed %+v, %v; want token %s, Since the first refresh's send time (after the attempt's %v, by %v)", h, ok, tokA, sent, at)
	}
}

// TestConfirmedCountsFromItsSend: a handover the backend confirmed counts
// from the confirmation's send time, even before any confirmed refresh and
// after later refreshes; it is taken for the tokens Handoff takes, which
// Expects reports, and only once.
func TestConfirmedCountsFromItsSend(t *testing.T) {
	f := &fakeStore{attempt: func(int, Attempt) (Result, error) { return queued(time.Now()) }}
	_, p := newPlace(t, f)
	if p.Expects(tokA) {
		t.Error("Expects a token before any attempt")
	}
	_, err := p.Acquire(context.Background(), tokA, short)
	wantLocked(t, err)
	if p.Expects(tokB) || !p.Expects(tokA) {
		t.Errorf("Expects(other) %v, Expects(queued) %v; want false, true", p.Expects(tokB), p.Expects(tokA))
	}
	if p.Confirmed(tokB, backend.Grant{Fence: 3, TTL: short}, time.Now()) {
		t.Error("Confirmed for a token that never queued the place accepted")
	}
	since := time.Now().Add(time.Minute) // not a time the place knows
	if !p.Confirmed(tokA, backend.Grant{Fence: 3, TTL: short}, since) {
		t.Fatal("Confirmed for the queued token refused")
	}
	h, ok := p.Handed()
	if !ok || h.Token != tokA || h.Fence != 3 || !h.Since.Equal(since) {
		t.Errorf("Handed %+v, %v; want token %s, fence 3, Since the confirmation's send %v", h, ok, tokA, since)
	}
	if !woken(p) {
		t.Error("no wake-up for the confirmed handover")
	}
	if p.Expects(tokA) || p.Confirmed(tokA, backend.Grant{Fence: 4, TTL: short}, time.Now()) {
		t.Error("a second handover accepted while the first is held")
	}
}

// TestCloseLeaves: a queued place that gives up stops, then leaves with
// its token; Close returns while the Leave is blocked, and Group.Close
// waits for it.
func TestCloseLeaves(t *testing.T) {
	leaving := make(chan Leaving, 1)
	release := make(chan struct{})
	var once sync.Once
	var finished atomic.Bool
	f := &fakeStore{
		attempt: func(int, Attempt) (Result, error) { return queued(time.Now()) },
		leave: func(l Leaving) {
			leaving <- l
			<-release
			finished.Store(true)
		},
	}
	g, p := newPlace(t, f)
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before newPlace's
	_, err := p.Acquire(context.Background(), tokA, long)
	wantLocked(t, err)
	returned := make(chan struct{})
	go func() {
		p.Close(false) // waits LeaveWait at most
		close(returned)
	}()
	receive(t, returned, "return from Close while its Leave is blocked")
	if finished.Load() {
		t.Fatal("the Leave finished before its release")
	}
	if l := receive(t, leaving, "Leave"); l != (Leaving{Token: tokA, Queued: true}) {
		t.Errorf("Leave(%+v); want token %s, Queued", l, tokA)
	}
	calls, _ := f.seen()
	if !slices.Equal(calls, []string{"attempt", "stop", "leave"}) || f.stopped[0] != (stopCall{}) {
		t.Errorf("calls %v, Stop%+v; want attempt, stop(false, nil), leave", calls, f.stopped)
	}
	closed := make(chan struct{})
	go func() {
		g.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Group.Close returned while a Leave was blocked")
	case <-time.After(20 * time.Millisecond):
		// A window to see Close return too early: it can miss that,
		// never fail a Close that waits.
	}
	once.Do(func() { close(release) })
	receive(t, closed, "Group.Close")
	if !finished.Load() {
		t.Error("Group.Close returned before the Leave finished")
	}
}

// TestCloseTaken: a place closed after it took a handover stops with it,
// and never leaves.
func TestCloseTaken(t *testing.T) {
	sent := time.Now()
	f := &fakeStore{attempt: func(int, Attempt) (Result, error) { return queued(sent) }}
	g, p := newPlace(t, f)
	_, err := p.Acquire(context.Background(), tokA, long)
	wantLocked(t, err)
	grant := backend.Grant{Fence: 4, TTL: long}
	if !p.Handoff(tokA, grant) {
		t.Fatal("Handoff refused")
	}
	p.Close(true)
	g.Close()
	calls, _ := f.seen()
	want := backend.Handover{Token: tokA, Grant: grant, Since: sent}
	if !slices.Equal(calls, []string{"attempt", "stop"}) || !f.stopped[0].took || f.stopped[0].handed == nil || *f.stopped[0].handed != want {
		t.Errorf("calls %v, Stop%+v; want attempt, then stop(true, %+v) and no leave", calls, f.stopped, want)
	}
}

// TestRefreshGone: a refresh that finds the record gone wakes the waiter,
// whose next attempt queues anew.
func TestRefreshGone(t *testing.T) {
	f := &fakeStore{
		attempt: func(n int, a Attempt) (Result, error) { return queued(time.Now()) },
		refresh: func(context.Context) (Refreshed, error) { return Refreshed{Gone: true}, nil },
	}
	_, p := newPlace(t, f)
	_, err := p.Acquire(context.Background(), tokA, short)
	wantLocked(t, err)
	receive(t, p.C(), "wake-up after the record was gone")
	_, err = p.Acquire(context.Background(), tokB, short)
	wantLocked(t, err)
	if _, as := f.seen(); as[1].Queued || as[1].Prev != tokA {
		t.Errorf("the attempt after the record was gone: %+v; want Queued false, Prev %s", as[1], tokA)
	}
}

// TestLost: Lost forgets the handover and the carrier's refresh: Handed
// reports nothing, and the next attempt has no record nor refresh.
func TestLost(t *testing.T) {
	f := &fakeStore{attempt: func(int, Attempt) (Result, error) { return queued(time.Now()) }}
	_, p := newPlace(t, f)
	_, err := p.Acquire(context.Background(), tokA, long)
	wantLocked(t, err)
	if !p.Handoff(tokA, backend.Grant{Fence: 2, TTL: long}) || !woken(p) {
		t.Fatal("Handoff refused, or no wake-up")
	}
	p.Lost()
	if h, ok := p.Handed(); ok {
		t.Errorf("Handed %+v after Lost; want none", h)
	}
	if !woken(p) {
		t.Error("no wake-up after Lost")
	}
	_, err = p.Acquire(context.Background(), tokB, long)
	wantLocked(t, err)
	if _, as := f.seen(); as[1].Queued || !as[1].Refreshed.IsZero() || as[1].Handed != nil {
		t.Errorf("the attempt after Lost: %+v; want Queued false, Refreshed zero, Handed nil", as[1])
	}
}

// A Refresh that fails at once (a store that refuses connections) is tried
// again no sooner than a tenth of the TTL, not in a loop.
func TestRefreshErrorsDoNotSpin(t *testing.T) {
	var n atomic.Int64
	f := &fakeStore{
		attempt: func(int, Attempt) (Result, error) { return queued(time.Now()) },
		refresh: func(context.Context) (Refreshed, error) {
			n.Add(1)
			return Refreshed{}, errors.New("connection refused")
		},
	}
	_, p := newPlace(t, f)
	_, err := p.Acquire(context.Background(), tokA, short)
	wantLocked(t, err)
	time.Sleep(100 * time.Millisecond) // lets refreshes come: a count, not a synchronisation
	// 100ms at one try per 3ms at least, after the first at 10ms: at most
	// about 31; a spinning place made tens of thousands.
	if got := n.Load(); got > 100 {
		t.Errorf("%d Refresh calls in 100ms with a TTL of %v", got, short)
	}
}

// A handover is counted from the refresh of the record it came from: a
// late report of a handover to the token of a record whose carrier was
// lost, or to a token the place queued with before its current one, is
// refused (the new carrier's refresh does not bound that lock).
func TestHandoffOfAnEarlierRecordRefused(t *testing.T) {
	ctx := context.Background()
	f := &fakeStore{attempt: func(int, Attempt) (Result, error) { return queued(time.Now()) }}
	_, p := newPlace(t, f)
	_, err := p.Acquire(ctx, tokA, long)
	wantLocked(t, err)
	p.Lost()
	if p.Handoff(tokA, backend.Grant{Fence: 2, TTL: long}) {
		t.Error("a handover to the token of a record whose carrier was lost was taken")
	}
	_, err = p.Acquire(ctx, tokB, long)
	wantLocked(t, err)
	if h, ok := p.Handed(); ok {
		t.Fatalf("handed %+v after the carrier was lost", h)
	}
	if _, as := f.seen(); as[1].Prev != "" {
		t.Errorf("the attempt after the loss takes over %q; want nothing (the lock went with the carrier)", as[1].Prev)
	}
	const tokC = "cccccccccccccccccccccccccccccccc"
	_, err = p.Acquire(ctx, tokC, long)
	wantLocked(t, err)
	if p.Handoff(tokB, backend.Grant{Fence: 3, TTL: long}) {
		t.Error("a late handover to a token the place queued with before its current one was taken")
	}
	if !p.Handoff(tokC, backend.Grant{Fence: 4, TTL: long}) {
		t.Error("a handover to the record's token was refused")
	}
}

// TestUnknownFirstAttemptIsLeft: a first attempt whose outcome is unknown
// (its context ended while it was on its way) may have put the record,
// with its token; the place that then gives up must leave with that
// token, or the store keeps the record for its TTL, first in the queue.
func TestUnknownFirstAttemptIsLeft(t *testing.T) {
	leaving := make(chan Leaving, 1)
	f := &fakeStore{
		attempt: func(int, Attempt) (Result, error) { return Result{Queued: true}, context.DeadlineExceeded },
		leave:   func(l Leaving) { leaving <- l },
	}
	g, p := newPlace(t, f)
	if _, err := p.Acquire(context.Background(), tokA, long); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v; want the attempt's error", err)
	}
	p.Close(false)
	g.Close()
	if l := receive(t, leaving, "Leave"); l != (Leaving{Token: tokA, Queued: true}) {
		t.Errorf("Leave(%+v); want token %s, Queued: the attempt may have put the record", l, tokA)
	}
}

// TestLateHandoverToUnknownAttemptRefused: a handover reported late to the
// token of a first attempt of unknown outcome is refused, also while the
// next attempt is on its way: that token is not the record's, no refresh
// of the place bounds the lock handed to it, and counted from the next
// attempt's refresh its deadline would pass the store's expiry (found by
// the Redis simulation: two valid leases).
func TestLateHandoverToUnknownAttemptRefused(t *testing.T) {
	inFlight, release := make(chan struct{}), make(chan struct{})
	f := &fakeStore{
		attempt: func(n int, a Attempt) (Result, error) {
			if n == 1 {
				return Result{Queued: true}, context.DeadlineExceeded
			}
			close(inFlight)
			<-release
			return queued(time.Now())
		},
	}
	_, p := newPlace(t, f)
	if _, err := p.Acquire(context.Background(), tokA, long); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first Acquire: %v; want its error", err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := p.Acquire(context.Background(), tokB, long)
		got <- err
	}()
	receive(t, inFlight, "the second attempt on its way")
	if p.Handoff(tokA, backend.Grant{Fence: 7}) {
		t.Error("a late handover to the unknown first attempt's token was taken")
	}
	close(release)
	wantLocked(t, receive(t, got, "the second attempt"))
	if h, ok := p.Handed(); ok {
		t.Errorf("Handed: %+v; want none", h)
	}
}
