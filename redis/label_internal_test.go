package redis

import (
	"testing"

	"github.com/distlock/lock/backend"
)

// Redlock's Inspect reports the label most of its holder's nodes report,
// whichever node answered first; nodes without one do not count.
func TestLabelRedlockMajority(t *testing.T) {
	h := func(label string) backend.Holder { return backend.Holder{Held: true, Token: "t", Label: label} }
	for _, tc := range []struct {
		hs   []backend.Holder
		want string
	}{
		{nil, ""},
		{[]backend.Holder{h(""), h("")}, ""},
		{[]backend.Holder{h(""), h("a")}, "a"},
		{[]backend.Holder{h(""), h(""), h("a")}, "a"},
		{[]backend.Holder{h("b"), h("a"), h("a")}, "a"},
		{[]backend.Holder{h("a"), h("b"), h("b"), h(""), h("")}, "b"},
		{[]backend.Holder{h("b"), h("a")}, "a"}, // a tie: the same answer in any order
		{[]backend.Holder{h("a"), h("b")}, "a"},
	} {
		if got := redlockLabel(tc.hs); got != tc.want {
			t.Errorf("redlockLabel(%v) = %q; want %q", tc.hs, got, tc.want)
		}
	}
}
