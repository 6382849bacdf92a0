package main

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/redistest"
	lockredis "github.com/distlock/lock/redis"
)

// redisWithPassword starts a redis-server that wants password marker and
// returns its URL with the password in the userinfo.
func redisWithPassword(t *testing.T) (string, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t, redistest.NoPersistence)
	if err := redistest.Client(t, srv.Addr).ConfigSet(context.Background(), "requirepass", marker).Err(); err != nil {
		t.Fatal(err)
	}
	return "redis://:" + marker + "@" + srv.Addr, srv
}

// The command that lockctl run starts, and the guard between them, see
// no LOCK_BACKEND, and the URL's password nowhere in their environments or
// command lines, however the URL was given; with --keep-backend-env the
// command gets LOCK_BACKEND. lockctl's own output never holds the
// password.
func TestRunCommandGetsNoBackendURL(t *testing.T) {
	url, _ := redisWithPassword(t)
	file := filepath.Join(t.TempDir(), "backend")
	if err := os.WriteFile(file, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The command's environment, then the guard's (its parent's)
	// environment and command line, one entry a line.
	script := `env; echo ---; tr '\0' '\n' < /proc/$PPID/environ; echo ---; tr '\0' '\n' < /proc/$PPID/cmdline`
	for _, tc := range []struct {
		name string
		args []string
		env  bool // LOCK_BACKEND set in lockctl's environment
	}{
		{"LOCK_BACKEND", nil, true},
		{"--backend-file, LOCK_BACKEND set too", []string{"--backend-file", file}, true},
		{"--backend", []string{"--backend", url}, false},
		{"LOCK_BACKEND, --keep-backend-env", []string{"--keep-backend-env"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env {
				t.Setenv(backendEnv, url)
			}
			args := append(append([]string{"run"}, tc.args...), "job", "--", "sh", "-c", script)
			var stdout, stderr lockedBuffer
			code := lockctl(context.Background(), args, &stdout, &stderr, os.Getenv)
			out := stdout.String()
			if code != 0 || strings.Count(out, "\n---\n") != 2 {
				t.Fatalf("status %d, output %q, stderr %q", code, out, stderr.String())
			}
			if strings.Contains(stderr.String(), marker) {
				t.Errorf("lockctl's stderr holds the password: %q", stderr.String())
			}
			keep := strings.Contains(tc.name, "keep")
			if keep {
				if !strings.Contains(out, backendEnv+"="+url+"\n") {
					t.Errorf("with --keep-backend-env the command has no %s=%s:\n%s", backendEnv, url, out)
				}
				return
			}
			if strings.Contains(out, backendEnv+"=") || strings.Contains(out, marker) {
				t.Errorf("the command or the guard has %s or the password:\n%s", backendEnv, out)
			}
		})
	}
}

// LOCKCTL_GUARD set by hand makes no lockctl a guard: it says that the
// variable is lockctl's own, exits 2 and runs nothing. Neither a value
// not lockctl's, nor pipes that carry a deadline without lockctl's
// nonce, from a parent that runs the same executable, make it one.
func TestGuardRefusesUnlessStartedByLockctl(t *testing.T) {
	dir := t.TempDir()
	ran := filepath.Join(dir, "ran")
	var nonce [nonceLen]byte
	crand.Read(nonce[:])
	for _, tc := range []struct {
		name  string
		value string
		pipes bool
	}{
		{"LOCKCTL_GUARD=1, no pipes", "1", false},
		{"LOCKCTL_GUARD=1, pipes with a deadline", "1", true},
		{"a nonce, pipes without it", hex.EncodeToString(nonce[:]), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "sh", "-c", "touch "+ran)
			cmd.Env = append(os.Environ(), guardEnv+"="+tc.value)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if tc.pipes {
				dr, dw, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				rr, rw, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer dw.Close()
				defer rr.Close()
				// A deadline a minute away (all the guard before this
				// change wanted), after another nonce when the variable
				// holds one.
				var first []byte
				if tc.value != "1" {
					var other [nonceLen]byte
					crand.Read(other[:])
					first = other[:]
				}
				now, err := bootClock()
				if err != nil {
					t.Fatal(err)
				}
				dw.Write(binary.BigEndian.AppendUint64(first, uint64(now+int64(time.Minute))))
				cmd.ExtraFiles = []*os.File{dr, rw}
				err = cmd.Start()
				dr.Close()
				rw.Close()
				if err != nil {
					t.Fatal(err)
				}
			} else if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if code := waitExit(t, cmd, 10*time.Second); code != exitUsage {
				t.Errorf("status %d; want 2 (stderr %q)", code, stderr.String())
			}
			msg := stderr.String()
			if strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "LOCKCTL_GUARD is lockctl's own variable") || !strings.Contains(msg, "unset LOCKCTL_GUARD") {
				t.Errorf("stderr %q; want one line that says LOCKCTL_GUARD is lockctl's own and to unset it", msg)
			}
			if _, err := os.Stat(ran); err == nil {
				t.Fatalf("the command ran")
			}
		})
	}
}

// Keys and tokens with terminal escape sequences, bidirectional overrides
// and bytes that are not UTF-8 reach the output escaped: status, run's
// messages and usage errors.
func TestOutputEscapesKeysAndTokens(t *testing.T) {
	url, rdb := redisURL(t)
	locks, err := lock.New(lockredis.New(rdb))
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	ctx := context.Background()
	key := "job\x1b]0;owned\x07\x1b[2J\u202e\n"
	l, err := locks.TryAcquire(ctx, key, lock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	// A token the store hands back as it is: another client's.
	if err := rdb.SetArgs(ctx, "lock:{"+key+"}", "\x9b\x1b[31mred-token", goredis.SetArgs{KeepTTL: true}).Err(); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := call(t, nil, "status", "--backend", url, key)
	if code != 0 {
		t.Fatalf("status: %d %q %q", code, out, stderr)
	}
	wantKey := `job\x1b]0;owned\a\x1b[2J\u202e\n`
	if !strings.HasPrefix(out, wantKey+": held by "+`\x9b\x1b[31mre…, fence 1,`) {
		t.Errorf("status printed %q; want the key and the token escaped: %s: held by \\x9b\\x1b[31mre…", out, wantKey)
	}
	checkPrintable(t, "status", out)

	code, _, stderr = call(t, nil, "run", "--backend", url, "--no-wait", key, "--", "true")
	if code != exitNotAcquired || !strings.Contains(stderr, wantKey) {
		t.Errorf("run --no-wait: status %d, stderr %q; want 75 and the key escaped", code, stderr)
	}
	checkPrintable(t, "run", stderr)

	code, _, stderr = call(t, nil, "run", "--backend", url, key, "--ttl", "\x1b[2J", "--", "true")
	if code != exitUsage || !strings.Contains(stderr, wantKey) || !strings.Contains(stderr, `--ttl after KEY`) {
		t.Errorf("run with a flag after the key: status %d, stderr %q; want 2 and the key escaped", code, stderr)
	}
	checkPrintable(t, "usage error", stderr)

	code, _, stderr = call(t, nil, "frob\x1b[2J")
	if code != exitUsage || !strings.Contains(stderr, `frob\x1b[2J`) {
		t.Errorf("unknown command: status %d, stderr %q; want 2 and the command escaped", code, stderr)
	}
	checkPrintable(t, "unknown command", stderr)
}

// checkPrintable fails t when out has a byte a terminal acts on (besides
// the newlines that end lines) or is not UTF-8.
func checkPrintable(t *testing.T, what, out string) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if show(line) != line {
			t.Errorf("%s: line %q is not printable as it is", what, line)
		}
	}
}

// show leaves printable text as it is and escapes the rest, idempotently.
func TestShow(t *testing.T) {
	for in, want := range map[string]string{
		"plain key/with:punct ü 日本": "plain key/with:punct ü 日本",
		"a\x1b[31mb":                `a\x1b[31mb`,
		"tab\tnl\ncr\rdel\x7f":      `tab\tnl\ncr\rdel\x7f`,
		"bidi\u202eoverride":        `bidi\u202eoverride`,
		"bad\xffutf8\xc3":           `bad\xffutf8\xc3`,
		"c1\u009b":                  `c1\u009b`,
		"bell\a":                    `bell\a`,
		`back\slash \x1b`:           `back\slash \x1b`,
		"zero\u200bwidth":           `zero\u200bwidth`,
	} {
		if got := show(in); got != want {
			t.Errorf("show(%q) = %q; want %q", in, got, want)
		}
		if again := show(show(in)); again != show(in) {
			t.Errorf("show(show(%q)) = %q; want %q", in, again, show(in))
		}
	}
}

// Every flag is checked before a lock is taken or waited for: a --grace
// longer than half the TTL asked for (--ttl, else the URL's ttl, else
// 10s) is a usage error, and the key stays free, without even a fence
// counter in the store. Durations above a year are usage errors naming
// the flag and the valid range, and so is a TTL above the backend's
// maximum (1m unless the URL's maxttl raises it), naming maxttl.
func TestFlagsAreCheckedBeforeTheLock(t *testing.T) {
	url, rdb := redisURL(t)
	ran := filepath.Join(t.TempDir(), "ran")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--backend", url, "--grace", "6s"}, "--grace 6s is more than half the TTL 10s"},
		{[]string{"--backend", url, "--ttl", "2s", "--grace", "1001ms"}, "--grace 1.001s is more than half the TTL 2s"},
		{[]string{"--backend", url + "?ttl=4s", "--grace", "3s"}, "--grace 3s is more than half the TTL 4s"},
		{[]string{"--backend", url, "--ttl", "2562047h47m16.854775807s"}, "flag --ttl: 2562047h47m16.854775807s is more than a year; valid: 0s to 8760h0m0s"},
		{[]string{"--backend", url, "--ttl", "9999999h"}, "flag --ttl: want a duration such as 500ms, 10s or 2m; valid: 0s to 8760h0m0s"},
		{[]string{"--backend", url, "--timeout", "8761h"}, "flag --timeout: 8761h0m0s is more than a year; valid: 0s to 8760h0m0s"},
		{[]string{"--backend", url, "--grace", "8761h"}, "flag --grace: 8761h0m0s is more than a year; valid: 0s to 8760h0m0s"},
		{[]string{"--backend", url, "--ttl", "8760h", "--grace", "4380h1s"}, "--grace 4380h0m1s is more than half the TTL 8760h0m0s"},
		{[]string{"--backend", url, "--ttl", "1h"}, "TTL 1h0m0s is above this backend's maximum of 1m0s; use a shorter TTL (auto-renew keeps a lease longer), or raise the maximum (this module's backends: WithMaxTTL, or the URL parameter maxttl)"},
		{[]string{"--backend", url + "?ttl=2m"}, "TTL 2m0s is above this backend's maximum of 1m0s"},
		{[]string{"--backend", url + "?maxttl=5s"}, "TTL 10s is above this backend's maximum of 5s"},
	} {
		args := append(append([]string{"run"}, tc.args...), "job", "--", "touch", ran)
		code, _, stderr := call(t, nil, args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: status %d, stderr %q; want 2 and %q", args, code, stderr, tc.want)
		}
		if n := rdb.Exists(context.Background(), "lock:{job}", "lock:{job}:fence").Val(); n != 0 {
			t.Fatalf("%q: %d keys of the lock exist: the lock was taken before the flags were checked", args, n)
		}
	}
	if _, err := os.Stat(ran); err == nil {
		t.Errorf("the command ran")
	}
	// The limits themselves are valid.
	code, out, stderr := call(t, nil, "run", "--backend", url, "--ttl", "2s", "--grace", "1s", "--timeout", "8760h", "job", "--", "sh", "-c", "echo $LOCK_TTL")
	if code != 0 || strings.TrimSpace(out) != "2s" {
		t.Errorf("--ttl 2s --grace 1s --timeout 8760h: status %d, output %q, stderr %q", code, out, stderr)
	}
	code, out, stderr = call(t, nil, "run", "--backend", url+"?maxttl=2m", "--ttl", "2m", "job", "--", "sh", "-c", "echo $LOCK_TTL")
	if code != 0 || strings.TrimSpace(out) != "2m0s" {
		t.Errorf("--ttl 2m on a URL with maxttl=2m: status %d, output %q, stderr %q", code, out, stderr)
	}
	if code, _, stderr := call(t, nil, "bench", "--duration", "8761h"); code != exitUsage || !strings.Contains(stderr, "flag --duration: 8761h0m0s is more than a year") {
		t.Errorf("bench --duration 8761h: status %d, stderr %q", code, stderr)
	}
	if code, _, stderr := call(t, nil, "demo", "--buyers", "100000000"); code != exitUsage || !strings.Contains(stderr, "--buyers <= 1000000") {
		t.Errorf("demo --buyers 100000000: status %d, stderr %q", code, stderr)
	}
}

// --backend-file reads the URL from a file, trimmed; an unreadable or
// empty file, or --backend-file with --backend, is a usage error. A
// --backend URL with credentials gets a warning and the command goes on;
// LOCK_BACKEND and --backend-file get none. skip_verify=true gets a
// warning whichever way it came.
func TestBackendFileAndWarnings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := write("good", "\n\t mem://backend-file \n")
	empty := write("empty", " \n\n")
	code, out, stderr := call(t, nil, "status", "--backend-file", good, "k")
	if code != 0 || out != "k: free\n" || stderr != "" {
		t.Errorf("--backend-file: status %d, output %q, stderr %q", code, out, stderr)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--backend-file", filepath.Join(dir, "missing"), "k"}, "--backend-file: open " + filepath.Join(dir, "missing") + ": no such file or directory"},
		{[]string{"status", "--backend-file", dir, "k"}, "--backend-file: read " + dir + ": is a directory"},
		{[]string{"status", "--backend-file", empty, "k"}, "--backend-file: " + empty + " is empty"},
		{[]string{"status", "--backend-file", "", "k"}, "--backend-file: empty path"},
		{[]string{"bench", "--backend-file", good, "--backend", "mem://"}, "give --backend or --backend-file, not both"},
		{[]string{"run", "--backend-file", empty, "k", "--", "true"}, "is empty"},
		{[]string{"demo", "--backend-file", empty}, "is empty"},
		{[]string{"init-nodes", "--backend-file", empty}, "is empty"},
	} {
		code, _, stderr := call(t, nil, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: status %d, stderr %q; want 2 and one line with %q", tc.args, code, stderr, tc.want)
		}
	}

	url, _ := redisWithPassword(t)
	const argvWarning = "warning: the --backend URL carries credentials, and every local user can read lockctl's command line (ps, /proc/PID/cmdline) while it runs; set LOCK_BACKEND or give --backend-file PATH instead"
	code, out, stderr = call(t, nil, "status", "--backend", url, "k")
	if code != 0 || out != "k: free\n" || stderr != "lockctl status: "+argvWarning+"\n" {
		t.Errorf("--backend with a password: status %d, output %q, stderr %q; want k: free and the one-line warning", code, out, stderr)
	}
	code, out, stderr = call(t, map[string]string{backendEnv: url}, "status", "k")
	if code != 0 || out != "k: free\n" || stderr != "" {
		t.Errorf("LOCK_BACKEND with a password: status %d, output %q, stderr %q; want no warning", code, out, stderr)
	}
	code, out, stderr = call(t, nil, "status", "--backend-file", write("secret", url+"\n"), "k")
	if code != 0 || out != "k: free\n" || stderr != "" {
		t.Errorf("--backend-file with a password: status %d, output %q, stderr %q; want no warning", code, out, stderr)
	}
	code, _, stderr = call(t, nil, "status", "--backend", "mem://x", "k")
	if code != 0 || stderr != "" {
		t.Errorf("--backend without credentials: status %d, stderr %q; want no warning", code, stderr)
	}
	skip := "rediss://127.0.0.1:1?skip_verify=true"
	code, _, stderr = call(t, map[string]string{backendEnv: skip}, "run", "--no-wait", "k", "--", "true")
	if code != exitBackend || !strings.HasPrefix(stderr, "lockctl run: warning: skip_verify=true: the backend's TLS certificate is not checked") {
		t.Errorf("skip_verify=true: status %d, stderr %q; want the warning first, then the failure", code, stderr)
	}
}
