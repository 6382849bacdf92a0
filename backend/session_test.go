package backend_test

import (
	"strings"
	"testing"

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
