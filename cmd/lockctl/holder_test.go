package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// described matches the holder's description that status and break print
// after the token, when the store keeps one: " (HOST PID PROGRAM)".
const described = `( \([^()\n]*\))?`

// lockctl run stores "HOST PID CMD" (the command's name, not its
// arguments) as the holder's description, or --holder's text, and
// lockctl status shows it while the command runs.
func TestStatusShowsTheHolderThatRunStored(t *testing.T) {
	url, _ := redisURL(t)
	env := map[string]string{"LOCK_BACKEND": url}
	host, _ := os.Hostname()
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{nil, "(" + host + " " + strconv.Itoa(os.Getpid()) + " sh)"},
		{[]string{"--holder", "nightly report, host b"}, "(nightly report, host b)"},
	} {
		dir := t.TempDir()
		started, done := filepath.Join(dir, "started"), filepath.Join(dir, "done")
		for _, p := range []string{started, done} {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		ran := make(chan int, 1)
		go func() {
			args := append(append([]string{"run"}, tc.flags...), "job", "--", "sh", "-c", `: > "$0"; cat "$1" > /dev/null`, started, done, "secret-argument")
			code, _, _ := call(t, env, args...)
			ran <- code
		}()
		f, err := os.Open(started) // blocks until the command runs
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		code, out, stderr := call(t, env, "status", "job")
		if err := os.WriteFile(done, nil, 0o600); err != nil { // the command ends
			t.Fatal(err)
		}
		if c := <-ran; c != 0 {
			t.Fatalf("run %v: status %d", tc.flags, c)
		}
		if code != 0 || !strings.Contains(out, tc.want) || strings.Contains(out, "secret-argument") {
			t.Fatalf("status while run %v holds the lock: %d %q %q; want the holder %s and no argument of the command", tc.flags, code, out, stderr, tc.want)
		}
	}
	if code, _, stderr := call(t, env, "run", "--holder", "two\nlines", "job", "--", "true"); code != exitUsage || !strings.Contains(stderr, "control character") {
		t.Fatalf("run --holder with a newline: %d %q; want a usage error naming the control character", code, stderr)
	}
}
