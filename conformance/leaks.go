package conformance

import (
	"runtime"
	"strings"
)

// goroutines returns the stacks of the running goroutines, by goroutine
// header line ("goroutine 7 [running]:" without the state), that run or
// were created by code outside the standard library (this module's, a
// backend's, its client library's), except the calling one.
func goroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i == 0 || !outsideStd(g) {
			continue // the first is the caller
		}
		id, _, _ := strings.Cut(g, " [")
		out[id] = g
	}
	return out
}

// outsideStd reports whether a goroutine's stack has a function of a
// package outside the standard library: one whose import path starts with
// a domain ("github.com/...", "go.etcd.io/..."). The test binary's own
// frames (testing, runtime) do not count.
func outsideStd(stack string) bool {
	for _, line := range strings.Split(stack, "\n") {
		fn := strings.TrimPrefix(line, "created by ")
		if strings.HasPrefix(fn, "\t") || strings.HasPrefix(fn, "goroutine ") {
			continue // a file line, or the header
		}
		if first, _, ok := strings.Cut(fn, "/"); ok && strings.Contains(first, ".") {
			return true
		}
	}
	return false
}

// newGoroutines returns the stacks of the goroutines outside the standard
// library that were not in before.
func newGoroutines(before map[string]string) []string {
	var out []string
	for id, g := range goroutines() {
		if _, ok := before[id]; !ok {
			out = append(out, g)
		}
	}
	return out
}
