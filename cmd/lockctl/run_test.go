package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/internal/redistest"
	lockredis "github.com/distlock/lock/redis"
)

// A command that starts a background child, writes both pids, and waits:
// the shape of every shell script that leaves work behind.
func familyScript(dir string) string {
	return fmt.Sprintf(`sleep 60 & echo $! > %[1]s/child; echo $$ > %[1]s/shell; touch %[1]s/started; wait`, dir)
}

// pids reads the shell's and its background child's pids.
func pids(t *testing.T, dir string) []int {
	t.Helper()
	var out []int
	for _, name := range []string{"shell", "child"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pid)
	}
	return out
}

// alive reports whether pid runs (a zombie, waiting to be reaped by a
// parent that is not ours, counts as dead).
func alive(pid int) bool {
	s := procState(pid)
	return s != 0 && s != 'Z' && s != 'X'
}

// procState is pid's state as /proc shows it (R, S, D, T for stopped, Z
// for a zombie...), or 0 when there is no such process.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return '?'
	}
	return s[i+2]
}

// waitDead fails t unless every pid is dead within d.
func waitDead(t *testing.T, d time.Duration, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(d)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still runs %v later", pid, d)
			}
			time.Sleep(5 * time.Millisecond) // poll /proc
		}
	}
}

// killLater kills every pid at the end of the test, whatever happened.
func killLater(t *testing.T, pids ...int) {
	t.Cleanup(func() {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// The lock lost while the command runs: the command and everything it
// started are killed before lockctl returns 76.
func TestRunKillsTheWholeGroupWhenTheLockIsLost(t *testing.T) {
	for _, how := range []string{"deleted", "expired"} {
		t.Run(how, func(t *testing.T) {
			url, rdb := redisURL(t)
			dir := t.TempDir()
			done := make(chan int)
			var stderr string
			go func() {
				var code int
				code, _, stderr = call(t, nil, "run", "--backend", url, "--ttl", "300ms", "job", "--", "sh", "-c", familyScript(dir))
				done <- code
			}()
			waitForFile(t, filepath.Join(dir, "started"))
			ps := pids(t, dir)
			killLater(t, ps...)
			ctx := context.Background()
			if how == "deleted" {
				rdb.Del(ctx, "lock:{job}")
			} else {
				rdb.PExpire(ctx, "lock:{job}", time.Millisecond)
			}
			select {
			case code := <-done:
				if code != exitLost {
					t.Fatalf("status %d; want 76 (lock lost, command stopped); stderr %q", code, stderr)
				}
				if !strings.Contains(stderr, "SIGKILL") {
					t.Errorf("stderr %q does not say the command was killed", stderr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("lockctl did not return within 10s of losing the lock")
			}
			for _, pid := range ps {
				if alive(pid) {
					t.Errorf("process %d of the command's group still runs after lockctl returned", pid)
				}
			}
		})
	}
}

// startLockctl runs lockctl as a process of its own (the test binary in
// lockctl's place), for the tests that signal or kill it.
func startLockctl(t *testing.T, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, &stderr
}

// SIGTERM and SIGINT sent to lockctl reach the command's whole group.
func TestRunPassesSignalsToTheWholeGroup(t *testing.T) {
	url, _ := redisURL(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			cmd, stderr := startLockctl(t, "run", "--backend", url, "job-"+strconv.Itoa(int(sig)), "--", "sh", "-c", familyScript(dir))
			waitForFile(t, filepath.Join(dir, "started"))
			ps := pids(t, dir)
			killLater(t, ps...)
			cmd.Process.Signal(sig)
			waitDead(t, 10*time.Second, ps...)
			cmd.Wait()
			if code := cmd.ProcessState.ExitCode(); code == 0 || code == exitBackend {
				t.Errorf("lockctl exited %d after %v; want the shell's status for the signal (stderr %q)", code, sig, stderr)
			}
		})
	}
}

// kill -9 of lockctl: the command and its children die at once, long
// before the lock expires and another owner can take it.
func TestRunCommandDiesWithLockctl(t *testing.T) {
	url, rdb := redisURL(t)
	dir := t.TempDir()
	cmd, _ := startLockctl(t, "run", "--backend", url, "--ttl", "20s", "job", "--", "sh", "-c", familyScript(dir))
	waitForFile(t, filepath.Join(dir, "started"))
	ps := pids(t, dir)
	killLater(t, ps...)
	cmd.Process.Kill()
	waitDead(t, 5*time.Second, ps...)
	if left := rdb.PTTL(context.Background(), "lock:{job}").Val(); left <= 0 {
		t.Fatalf("the lock had expired (PTTL %v) before the command died: the test proves nothing", left)
	}
}

// With renewals failing, the command gets SIGTERM grace before the lock's
// deadline, and a command that ignores it is killed no later than the
// deadline: in both cases before a successor gets the lock.
func TestRunStopsTheCommandBeforeASuccessorCanAcquire(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	for _, kind := range []string{"finishes-on-sigterm", "ignores-sigterm"} {
		t.Run(kind, func(t *testing.T) {
			proxy := faultproxy.Start(t, srv.Addr)
			dir := t.TempDir()
			// The well-behaved command needs 300ms after SIGTERM to finish
			// its work; the other one ignores SIGTERM. Both note the time
			// (in µs) of their last work, on the clock this test reads.
			script := fmt.Sprintf(`trap 'sleep 0.3; date +%%s%%6N > %[1]s/finished; exit 0' TERM; touch %[1]s/started; while :; do date +%%s%%6N > %[1]s/beat; sleep 0.02; done`, dir)
			if kind == "ignores-sigterm" {
				script = fmt.Sprintf(`trap '' TERM; touch %[1]s/started; while :; do date +%%s%%6N > %[1]s/beat.new; mv %[1]s/beat.new %[1]s/beat; done`, dir)
			}
			done := make(chan int)
			var stderr string
			go func() {
				var code int
				code, _, stderr = call(t, nil, "run", "--backend", "redis://"+proxy.Addr, "--ttl", "2s", "--grace", "800ms", "job-"+kind, "--", "sh", "-c", script)
				done <- code
			}()
			waitForFile(t, filepath.Join(dir, "started"))
			proxy.Cut() // lockctl's renewals hang from now on

			// A successor on a connection of its own waits for the key.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			succ, err := lock.New(lockredis.New(redistest.Client(t, srv.Addr)))
			if err != nil {
				t.Fatal(err)
			}
			defer succ.Close()
			l, err := succ.Acquire(ctx, "job-"+kind, lock.WithTTL(time.Second))
			if err != nil {
				t.Fatalf("successor: %v", err)
			}
			acquired := time.Now().UnixMicro()
			defer l.Release(ctx)
			code := <-done
			proxy.Heal()
			if code != exitLost {
				t.Errorf("lockctl status %d; want 76; stderr %q", code, stderr)
			}
			last := "beat"
			if kind == "finishes-on-sigterm" {
				last = "finished"
				if !strings.Contains(stderr, "sending SIGTERM") {
					t.Errorf("stderr %q does not say SIGTERM was sent", stderr)
				}
			}
			b2, err := os.ReadFile(filepath.Join(dir, last))
			if err != nil {
				t.Fatalf("the command never wrote %s: %v (stderr %q)", last, err, stderr)
			}
			at, err := strconv.ParseInt(strings.TrimSpace(string(b2)), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			if at >= acquired {
				t.Fatalf("the command still worked %v after the successor acquired the lock", time.Duration(at-acquired)*time.Microsecond)
			}
			t.Logf("the command's last work came %v before the successor acquired", time.Duration(acquired-at)*time.Microsecond)
		})
	}
}

// 75 means "another owner held the key"; a store that cannot be reached or
// does not answer is 69, said in one line.
func TestRunExitStatusesTellHeldFromBackendFailure(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	nodes := []*redistest.Server{redistest.Start(t, redistest.NoPersistence), redistest.Start(t, redistest.NoPersistence), redistest.Start(t, redistest.NoPersistence)}
	redlock := "redlock://" + nodes[0].Addr + "," + nodes[1].Addr + "," + nodes[2].Addr
	if code, _, stderr := call(t, nil, "init-nodes", "--backend", redlock); code != exitOK {
		t.Fatalf("init-nodes: %d %q", code, stderr)
	}
	srv.Stop()
	defer srv.Continue()
	nodes[1].Stop()
	defer nodes[1].Continue()
	nodes[2].Stop()
	defer nodes[2].Continue()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"refused", []string{"--backend", "redis://127.0.0.1:1", "--no-wait"}, "the backend failed"},
		{"stopped, --timeout", []string{"--backend", "redis://" + srv.Addr, "--timeout", "1s"}, "did not answer"},
		{"stopped, --no-wait", []string{"--backend", "redis://" + srv.Addr, "--no-wait"}, "did not answer"},
		{"redlock majority stopped, --no-wait", []string{"--backend", redlock, "--no-wait"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"run"}, tc.args...), "job", "--", "true")
			start := time.Now()
			code, _, stderr := call(t, nil, args...)
			// A bound on a hang, not a timing claim: --timeout 1s, or the
			// 3s --no-wait limit, plus the cleanup release (at most 3s).
			if took := time.Since(start); took > 8*time.Second {
				t.Errorf("took %v; want the attempt's deadline plus the cleanup's second", took)
			}
			if code != exitBackend {
				t.Fatalf("status %d; want 69 (stderr %q)", code, stderr)
			}
			if !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "not acquired") {
				t.Errorf("stderr %q; want a line that says %q", stderr, tc.want)
			}
		})
	}
}

// A flag the user did not give does not override the URL's ttl; one the
// user gave does.
func TestRunTTLFromTheURLUnlessTheFlagIsGiven(t *testing.T) {
	url, _ := redisURL(t)
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--backend", url + "?ttl=3s"}, nil, "3s"},
		{nil, map[string]string{"LOCK_BACKEND": url + "?ttl=4s"}, "4s"},
		{[]string{"--backend", url + "?ttl=3s", "--ttl", "5s"}, nil, "5s"},
		{[]string{"--backend", url}, nil, "10s"},
	} {
		args := append(append([]string{"run"}, tc.args...), "job", "--", "sh", "-c", "echo $LOCK_TTL")
		code, out, stderr := call(t, tc.env, args...)
		if code != 0 || strings.TrimSpace(out) != tc.want {
			t.Errorf("%q %v: status %d, LOCK_TTL %q; want %s (stderr %q)", args, tc.env, code, strings.TrimSpace(out), tc.want, stderr)
		}
	}
}

// A command that does not exist: 127, and the lock is not taken.
func TestRunMissingCommandIs127AndTakesNoLock(t *testing.T) {
	url, rdb := redisURL(t)
	code, _, stderr := call(t, nil, "run", "--backend", url, "job", "--", "no-such-command-here")
	if code != exitNotFound || !strings.Contains(stderr, "no-such-command-here") {
		t.Fatalf("status %d, stderr %q; want 127 naming the command", code, stderr)
	}
	if n := rdb.Exists(context.Background(), "lock:{job}", "lock:{job}:fence").Val(); n != 0 {
		t.Errorf("%d keys of the lock exist after a command that could not start; want none", n)
	}
}

// The demo against a backend that is not there fails in seconds, in one
// line, instead of crawling through its buyers.
func TestDemoFailsFastWithoutABackend(t *testing.T) {
	start := time.Now()
	code, out, stderr := call(t, nil, "demo", "--backend", "redis://127.0.0.1:1")
	if code != exitBackend {
		t.Fatalf("status %d; want 69 (stdout %q, stderr %q)", code, out, stderr)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("took %v; want a few seconds", took)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "lockctl demo:") || !strings.Contains(lines[0], "127.0.0.1:1") {
		t.Errorf("stderr %q; want one line, lockctl's, naming the backend (no go-redis log lines)", stderr)
	}
}

func TestVersionAndHelp(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		code, out, _ := call(t, nil, args...)
		if code != 0 || !strings.HasPrefix(out, "lockctl ") || !strings.Contains(out, "go1.") {
			t.Errorf("%q: %d %q; want lockctl's version", args, code, out)
		}
	}
	code, out, _ := call(t, nil, "run", "--help")
	for _, want := range []string{"usage: lockctl run [flags] KEY -- CMD", "--ttl D", "--grace D", "(default TTL/4)", "--wait", "(default true)", "--timeout D"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("run --help: %d, output lacks %q:\n%s", code, want, out)
		}
	}
}

// A holder's text says the time left only when the store reports it: a
// Consul session's is unknown, not "0s".
func TestHolderText(t *testing.T) {
	for _, tc := range []struct {
		h    backend.Holder
		want string
	}{
		{backend.Holder{}, "free"},
		{backend.Holder{Held: true, Token: "tok", Fence: 7}, "held by tok, fence 7, time left unknown"},
		{backend.Holder{Held: true, Token: "tok", Fence: 7, Remaining: 1500 * time.Millisecond}, "held by tok, fence 7, expires in 1.5s unless renewed"},
	} {
		if got := holderText(tc.h, tc.h.Token); got != tc.want {
			t.Errorf("holderText(%+v) = %q; want %q", tc.h, got, tc.want)
		}
	}
}
