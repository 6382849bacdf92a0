package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/distlock/lock/internal/consultest"
	"github.com/distlock/lock/internal/etcdtest"
	"github.com/distlock/lock/internal/redistest"
)

// mainEnv makes the test binary run as lockctl itself, for the tests that
// need a lockctl process to signal or kill.
const mainEnv = "LOCKCTL_TEST_MAIN"

func TestMain(m *testing.M) {
	etcdtest.MaybeRunMember() // a test's etcd server
	quietLibraries()          // as main does: the tests call lockctl, not main
	// Processes built with -race (this binary, run as lockctl's guard)
	// otherwise wait a second when they exit.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	switch {
	case isGuard(): // lockctl run starts its guard from its own executable
		os.Exit(guardMain(os.Args[1:]))
	case os.Getenv(mainEnv) != "":
		os.Unsetenv(mainEnv)
		main()
	}
	goleak.VerifyTestMain(m)
}

// lockedBuffer is written by lockctl and by the copy of a child's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// call runs lockctl in-process and returns its status and outputs.
func call(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr lockedBuffer
	code := lockctl(context.Background(), args, &stdout, &stderr, func(k string) string { return env[k] })
	return code, stdout.String(), stderr.String()
}

func TestBadUsageIsOneLineAndStatus2(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "usage: lockctl"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"; valid: run, status, break, demo, bench`},
		{[]string{"run", "--bogus", "k", "--", "true"}, "valid flags: --backend"},
		{[]string{"run", "--backend", "nosuch://x", "k", "--", "true"}, "registered: consul, consuls, etcd, etcds, mem, migrate, redis"},
		{[]string{"run", "--backend", "redis://localhost:6379?colour=red", "k", "--", "true"}, `unknown query parameter "colour"`},
		{[]string{"run", "--backend", "mem://", "k", "true"}, "want KEY -- CMD"},
		{[]string{"run", "k", "--", "true"}, "no backend: set LOCK_BACKEND, or give --backend-file PATH or --backend URL"},
		{[]string{"run", "--backend", "mem://", "--ttl", "-1s", "k", "--", "true"}, `invalid value "-1s" for flag --ttl: want a duration of 0 or more`},
		{[]string{"run", "--backend", "mem://", "--ttl", "0s", "k", "--", "true"}, "--ttl must be more than 0"},
		{[]string{"run", "--backend", "mem://", "--ttl", "10", "k", "--", "true"}, "flag --ttl: a duration needs a unit: 10s"},
		{[]string{"run", "--backend", "mem://", "--timeout", "-1s", "k", "--", "true"}, "flag --timeout: want a duration of 0 or more"},
		{[]string{"run", "--backend", "mem://", "--grace", "soon", "k", "--", "true"}, "flag --grace: want a duration such as"},
		{[]string{"run", "--backend", "mem://", "--grace", "6s", "k", "--", "true"}, "--grace 6s is more than half the TTL 10s"},
		{[]string{"run", "--backend", "mem://", "k", "--ttl", "5s", "--", "true"}, `flag --ttl after KEY "k": flags go before KEY`},
		{[]string{"run", "--backend", "mem://", "", "--", "true"}, "empty key"},
		{[]string{"status", "--backend", "mem://", ""}, "empty key; a key is 1 to 512 bytes"},
		{[]string{"status", "--backend", "mem://", strings.Repeat("k", 100000)}, "key of 100000 bytes"},
		{[]string{"status", "--backend", "mem://", "\xff"}, "not valid UTF-8"},
		{[]string{"bench", "extra"}, `takes no arguments, got "extra"`},
		{[]string{"demo", "--buyers", "5", "x"}, `takes no arguments, got "x"`},
		{[]string{"status", "--backend", "redis://127.0.0.1:6379?ttl=3", "k"}, "Open: ttl=\"3\": want a Go duration"},
		{[]string{"status", "--backend", "mem://"}, "want exactly one KEY"},
		{[]string{"demo", "--units", "0"}, "need 1 <= --units <= --buyers"},
		{[]string{"bench", "--duration", "0s"}, "--duration must be more than 0"},
		{[]string{"demo", "--backend", "mem://x?ttl=soon"}, "want a Go duration"},
		{[]string{"status", "--backend", "redis://[::1", "k"}, "want SCHEME://ADDRESS with a registered scheme (consul, consuls, etcd, etcds, mem"},
		{[]string{"status", "--backend", "localhost:6379", "k"}, `unknown URL scheme "localhost"`},
	}
	for _, tc := range cases {
		code, _, stderr := call(t, nil, tc.args...)
		if code != exitUsage {
			t.Errorf("%q: status %d; want 2 (stderr %q)", tc.args, code, stderr)
		}
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: stderr %q does not say %q", tc.args, stderr, tc.want)
		}
		if tc.args != nil && strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%q: message is not one line: %q", tc.args, stderr)
		}
		if strings.Count(stderr, "lock: ") > 0 {
			t.Errorf("%q: message repeats the library's prefix: %q", tc.args, stderr)
		}
	}
}

func TestDemoOnMemory(t *testing.T) {
	code, out, stderr := call(t, nil, "demo", "--buyers", "2000", "--units", "50")
	if code != exitOK {
		t.Fatalf("demo: status %d\n%s\n%s", code, out, stderr)
	}
	for _, want := range []string{
		"With the lock: 50 sold, 0 oversold",
		"flash sale, with the lock          50 sold of 50, oversold by 0",
		"rejected; B's",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	m := regexp.MustCompile(`Without a lock: (\d+) sold, oversold by (\d+)`).FindStringSubmatch(out)
	if m == nil || m[2] == "0" {
		t.Errorf("demo did not show the oversold sale without a lock:\n%s", out)
	}
}

func TestBenchOnMemory(t *testing.T) {
	code, out, stderr := call(t, nil, "bench", "--duration", "200ms")
	if code != exitOK || !strings.Contains(out, "cycles/s") || !strings.Contains(out, "utilisation") {
		t.Fatalf("bench: status %d\n%s\n%s", code, out, stderr)
	}
}

func redisURL(t *testing.T) (string, *goredis.Client) {
	srv := redistest.Start(t, redistest.NoPersistence)
	return "redis://" + srv.Addr, redistest.Client(t, srv.Addr)
}

func TestRunExportsTheLockAndPropagatesTheStatus(t *testing.T) {
	url, _ := redisURL(t)
	env := map[string]string{"LOCK_BACKEND": url}
	code, out, stderr := call(t, env, "run", "job", "--", "sh", "-c", `echo "$LOCK_KEY $LOCK_FENCE $LOCK_TOKEN"; exit 7`)
	if code != 7 {
		t.Fatalf("status %d; want the child's 7 (stderr %q)", code, stderr)
	}
	fields := strings.Fields(out)
	if len(fields) != 3 || fields[0] != "job" || fields[1] == "0" || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(fields[2]) {
		t.Fatalf("child saw %q; want LOCK_KEY, a fence > 0 and a 32-hex token", out)
	}
	// Released after the child exited: a second run gets the next fence.
	code, out, _ = call(t, env, "run", "--no-wait", "job", "--", "sh", "-c", `echo "$LOCK_FENCE"`)
	if code != 0 || strings.TrimSpace(out) != "2" {
		t.Fatalf("second run: status %d, fence %q; want 0 and 2", code, out)
	}
	code, out, _ = call(t, env, "status", "job")
	if code != 0 || strings.TrimSpace(out) != "job: free" {
		t.Fatalf("status: %d %q", code, out)
	}
}

func TestRunNoWaitAndTimeoutWhenHeld(t *testing.T) {
	url, _ := redisURL(t)
	done := holdJob(t, url)
	code, out, _ := call(t, nil, "status", "--backend", url, "job")
	if code != 0 || !strings.Contains(out, "job: held by") || !strings.Contains(out, "fence 1") {
		t.Errorf("status while held: %d %q", code, out)
	}
	if code, _, stderr := call(t, nil, "run", "--backend", url, "--no-wait", "job", "--", "true"); code != exitNotAcquired {
		t.Errorf("--no-wait while held: status %d; want 75 (%q)", code, stderr)
	}
	if code, _, stderr := call(t, nil, "run", "--backend", url, "--timeout", "100ms", "job", "--", "true"); code != exitNotAcquired {
		t.Errorf("--timeout while held: status %d; want 75 (%q)", code, stderr)
	}
	if code := <-done; code != 0 {
		t.Errorf("holder: status %d", code)
	}
}

// holdJob starts lockctl run on key job at url with a command that holds
// it for a second, and returns once the command runs; the run's status
// comes on the channel.
func holdJob(t *testing.T, url string) <-chan int {
	t.Helper()
	started := filepath.Join(t.TempDir(), "started")
	done := make(chan int, 1)
	go func() {
		code, _, _ := call(t, nil, "run", "--backend", url, "job", "--", "sh", "-c", "touch "+started+"; sleep 1")
		done <- code
	}()
	waitForFile(t, started)
	return done
}

func waitForFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConcurrentRunsNeverOverlap(t *testing.T) {
	url, _ := redisURL(t)
	dir := t.TempDir()
	inside := filepath.Join(dir, "inside")
	script := fmt.Sprintf("mkdir %s || exit 99; sleep 0.05; rmdir %s", inside, inside)
	var wg sync.WaitGroup
	codes := make(chan int, 12)
	for i := 0; i < 4; i++ {
		wg.Go(func() {
			for r := 0; r < 3; r++ {
				code, _, _ := call(t, nil, "run", "--backend", url, "--ttl", "2s", "job", "--", "sh", "-c", script)
				codes <- code
			}
		})
	}
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != 0 {
			t.Errorf("a run exited %d (99: two commands were inside at once)", code)
		}
	}
}

func TestDemoOnRedis(t *testing.T) {
	url, _ := redisURL(t)
	demoTellsBoth(t, url, 1000)
}

// On Consul the GC-pause story takes the backend's minimum TTL, 2s here,
// and B waits out the lock-delay.
func TestDemoOnConsul(t *testing.T) {
	demoTellsBoth(t, "consul://"+consultest.Start(t).Addr+"?minttl=2s&lockdelay=1s", 200)
}

// demoTellsBoth runs lockctl demo at url with buyers buyers and 20 units,
// and fails t unless the lock sold exactly 20 and the fenced resource
// rejected the paused holder's write.
func demoTellsBoth(t *testing.T, url string, buyers int) {
	t.Helper()
	code, out, stderr := call(t, nil, "demo", "--backend", url, "--buyers", strconv.Itoa(buyers), "--units", "20")
	if code != exitOK || !strings.Contains(out, "With the lock: 20 sold, 0 oversold") || !strings.Contains(out, "rejected; B's") {
		t.Fatalf("demo on %s: status %d\n%s\n%s", url, code, out, stderr)
	}
}

func TestRunOnRedlock(t *testing.T) {
	var addrs []string
	for i := 0; i < 3; i++ {
		addrs = append(addrs, redistest.Start(t, redistest.NoPersistence).Addr)
	}
	url := "redlock://" + strings.Join(addrs, ",")
	// New servers: they vote at once instead of waiting the maximum TTL.
	if code, out, stderr := call(t, nil, "init-nodes", "--backend", url); code != 0 || !strings.HasPrefix(out, "3 nodes marked") {
		t.Fatalf("init-nodes: status %d, output %q, stderr %q", code, out, stderr)
	}
	if code, out, _ := call(t, nil, "init-nodes", "--backend", url); code != 0 || !strings.HasPrefix(out, "0 nodes marked") {
		t.Fatalf("init-nodes again: status %d, output %q; want nothing marked", code, out)
	}
	if code, _, stderr := call(t, nil, "init-nodes", "--backend", "mem://"); code != exitUsage || !strings.Contains(stderr, "only redlock://") {
		t.Fatalf("init-nodes on mem://: status %d, stderr %q; want a usage error", code, stderr)
	}
	code, out, stderr := call(t, nil, "run", "--backend", url, "job", "--", "sh", "-c", `echo "$LOCK_FENCE"`)
	if code != 0 || strings.TrimSpace(out) != "1" {
		t.Fatalf("run on redlock: status %d, output %q, stderr %q", code, out, stderr)
	}
	code, out, _ = call(t, nil, "status", "--backend", url, "job")
	if code != 0 || strings.TrimSpace(out) != "job: free" {
		t.Fatalf("status on redlock: %d %q", code, out)
	}
}

// lockctl on etcd, a real member as a process of its own: the same
// commands as on Redis with only the URL changed, fences from etcd's
// revisions.
func TestRunOnEtcd(t *testing.T) {
	url := "etcd://" + etcdtest.Start(t).Addr
	done := holdJob(t, url)
	code, out, _ := call(t, nil, "status", "--backend", url, "job")
	m := regexp.MustCompile(`^job: held by \S+` + described + `, fence (\d+),`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("status while held: %d %q; want the holder and its fence", code, out)
	}
	held, _ := strconv.ParseUint(m[1], 10, 64)
	if code, _, stderr := call(t, nil, "run", "--backend", url, "--no-wait", "job", "--", "true"); code != exitNotAcquired {
		t.Errorf("--no-wait while held: status %d; want 75 (%q)", code, stderr)
	}
	if code := <-done; code != 0 {
		t.Fatalf("holder: status %d", code)
	}
	code, out, stderr := call(t, nil, "run", "--backend", url, "--no-wait", "job", "--", "sh", "-c", `echo "$LOCK_FENCE"`)
	next, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
	if code != 0 || err != nil || next <= held {
		t.Fatalf("run after the holder: status %d, fence %q (stderr %q); want 0 and a fence above %d", code, out, stderr, held)
	}
	if code, out, _ := call(t, nil, "status", "--backend", url, "job"); code != 0 || strings.TrimSpace(out) != "job: free" {
		t.Fatalf("status after: %d %q", code, out)
	}
	demoTellsBoth(t, url, 200)
}
