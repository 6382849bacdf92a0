package backend_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
)

func TestSessionID(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := backend.NewSessionID()
		if len(id) != backend.SessionIDLen || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz234567") != "" {
			t.Fatalf("NewSessionID: %q; want %d characters of a-z and 2-7", id, backend.SessionIDLen)
		}
		if seen[id] {
			t.Fatalf("NewSessionID: %q twice in 100", id)
		}
		seen[id] = true
		p := backend.SessionPrefix(id)
		if len(p) != backend.MaxTokenPrefix || strings.ContainsRune("0123456789abcdef", rune(p[0])) {
			t.Fatalf("SessionPrefix(%q) = %q; want %d bytes that start with no hexadecimal digit", id, p, backend.MaxTokenPrefix)
		}
		if got := backend.SessionID(p + "0123456789abcdef01234567"); got != id {
			t.Fatalf("SessionID of a token of %q: %q", id, got)
		}
	}
	for _, tok := range []string{"", "S", "Sabc", "0123456789abcdef0123456789abcdef", "sabcdefg0123"} {
		if got := backend.SessionID(tok); got != "" {
			t.Errorf("SessionID(%q) = %q; want none", tok, got)
		}
	}
}

func TestPendingReleases(t *testing.T) {
	var p backend.PendingReleases
	if got := p.List(); len(got) != 0 {
		t.Fatalf("List of the zero value: %v", got)
	}
	p.Record("a", "t1", false)
	p.Record("b", "t2", false)
	p.Record("a", "t1", false) // sent again, still unknown
	p.Record("c", "t3", true)  // known at once: never pending
	if got := p.List(); len(got) != 2 {
		t.Fatalf("List: %v; want a/t1 and b/t2", got)
	}
	p.Record("a", "t1", true)
	if got := p.List(); len(got) != 1 || got[0] != (backend.PendingRelease{Key: "b", Token: "t2"}) {
		t.Fatalf("List after a's answer: %v; want b/t2", got)
	}
}

// Resend sends each pending release once, one resend at a time, and none
// when the backend is closing.
func TestPendingReleasesResend(t *testing.T) {
	var p backend.PendingReleases
	p.Record("a", "t1", false)
	p.Record("b", "t2", false)
	var wg sync.WaitGroup
	start := func(f func()) bool { wg.Go(f); return true }
	release := make(chan backend.PendingRelease)
	go p.Resend(start, time.Minute, func(_ context.Context, key, token string) {
		release <- backend.PendingRelease{Key: key, Token: token}
		p.Record(key, token, true)
	})
	first := <-release
	p.Resend(start, time.Minute, func(context.Context, string, string) { t.Error("a second Resend ran while the first one was running") })
	second := <-release
	wg.Wait()
	if first == second {
		t.Errorf("Resend sent %v twice", first)
	}
	if got := p.List(); len(got) != 0 {
		t.Errorf("List after the resend: %v; want none", got)
	}
	p.Record("c", "t3", false)
	p.Resend(func(func()) bool { return false }, time.Minute, func(context.Context, string, string) { t.Error("Resend sent a release on a closing backend") })
	p.Resend(start, time.Minute, func(_ context.Context, key, token string) { p.Record(key, token, true) })
	wg.Wait()
	if got := p.List(); len(got) != 0 {
		t.Errorf("List after a resend that follows a refused one: %v; want none", got)
	}
}

// Sessions gives new leases of a class the same session while it is
// usable, a new one with a new id after, and forgets the old id; after
// Close it refuses new sessions and background work.
func TestSessions(t *testing.T) {
	var tab backend.Sessions[*int]
	ok := true
	usable := func(*int) bool { return ok }
	n := 0
	open := func(string) *int { n++; v := n; return &v }
	a, ida, err := tab.Current(time.Second, usable, open)
	if err != nil || *a != 1 || len(ida) != backend.SessionIDLen {
		t.Fatalf("Current: %v, %q, %v; want the first session and an id", a, ida, err)
	}
	if b, idb, _ := tab.Current(time.Second, usable, open); b != a || idb != ida {
		t.Fatalf("Current while usable: %v %q; want %v %q", b, idb, a, ida)
	}
	if c, idc, _ := tab.Current(2*time.Second, usable, open); c == a || idc == ida {
		t.Fatalf("Current of another class: %v %q; want a new session", c, idc)
	}
	tok := backend.SessionPrefix(ida) + "0123456789abcdef0123456789ab"
	if s, found := tab.Lookup(tok); !found || s != a {
		t.Fatalf("Lookup of a token of the session: %v, %v", s, found)
	}
	if _, found := tab.Lookup("0123456789abcdef0123456789abcdef"); found {
		t.Fatal("Lookup of a token that names no session found one")
	}
	ok = false
	d, idd, _ := tab.Current(time.Second, usable, open)
	if d == a || idd == ida {
		t.Fatalf("Current once the session is not usable: %v %q; want a new one", d, idd)
	}
	if _, found := tab.Lookup(tok); found {
		t.Fatal("Lookup of a token of a forgotten session found it")
	}
	ran := make(chan struct{})
	if !tab.Start(func() { close(ran) }) {
		t.Fatal("Start refused before Close")
	}
	tab.Close()
	select {
	case <-ran:
	default:
		t.Fatal("Close returned before Start's goroutine ended")
	}
	if tab.Start(func() { t.Error("ran after Close") }) {
		t.Error("Start after Close: true")
	}
	if _, _, err := tab.Current(time.Second, usable, open); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Current after Close: %v; want ErrClosed", err)
	}
}
