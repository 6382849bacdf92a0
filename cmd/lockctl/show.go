package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// show returns s fit for a terminal or a log: every rune that is not
// printable (control characters such as ESC, newline, tab and DEL;
// format characters such as the bidirectional overrides; unassigned
// runes) is written as a Go escape (\x1b, \n, \u202e), and every byte
// that is not UTF-8 as \xNN. Printable text, backslashes included, is
// kept as it is, so show(show(s)) == show(s): a message built from shown
// parts may pass through show again unchanged.
//
// Every string that lockctl prints and did not write itself (keys, tokens,
// holder metadata, command names, file names, errors from the store or
// the system) goes through show, by way of environment.printf (and
// usageError), or directly.
func show(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\n', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// quoted is s shown between double quotes, for messages that quote a key
// or an argument.
func quoted(s string) string { return `"` + show(s) + `"` }

// shownArgs returns args with every string, error and fmt.Stringer
// replaced by its shown text (errors as e.msg says them: one line, the
// backend URL's secrets cut out).
func (e *environment) shownArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = show(v)
		case error:
			out[i] = show(e.msg(v))
		case fmt.Stringer:
			out[i] = show(v.String())
		default:
			out[i] = a
		}
	}
	return out
}

// printf writes to w as fmt.Fprintf does, with every string, error and
// Stringer argument shown (see show). The format is lockctl's own and is
// written as it is. Use "%s" with quoted(x), not %q, for a quoted string.
func (e *environment) printf(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, format, e.shownArgs(args)...)
}
