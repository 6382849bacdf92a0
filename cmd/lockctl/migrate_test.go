package main

import (
	"context"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/redistest"
)

// migrateURL is the migrate:// URL of phase over the stores at from and
// to.
func migrateURL(from, to string, phase int) string {
	return "migrate://?from=" + from + "&to=" + to + "&phase=" + strconv.Itoa(phase)
}

// openClient opens a lock.Client of url, closed when the test ends. A
// client of mem://NAME keeps the named store alive while it is open.
func openClient(t *testing.T, url string) *lock.Client {
	t.Helper()
	c, err := lock.Open(context.Background(), url)
	if err != nil {
		t.Fatalf("Open(%s): %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// hold takes key through c at once, released when the test ends.
func hold(t *testing.T, c *lock.Client, key string) *lock.Lease {
	t.Helper()
	l, err := c.TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatalf("TryAcquire(%s): %v", key, err)
	}
	t.Cleanup(func() { l.Release(context.Background()) })
	return l
}

// callStdin is call with stdin as lockctl's standard input.
func callStdin(t *testing.T, stdin string, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	return callReader(t, strings.NewReader(stdin), env, args...)
}

// callReader is call with stdin, read as it is read, as lockctl's
// standard input.
func callReader(t *testing.T, stdin io.Reader, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr lockedBuffer
	e := &environment{stdin: stdin, stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return env[k] }}
	code := e.command(context.Background(), args)
	return code, stdout.String(), stderr.String()
}

// In phases 2 and 3, status shows the holder on each store, one line
// each, with that store's fence; in phases 1 and 4, and for a plain URL,
// one line as before.
func TestMigrateStatusShowsBothStores(t *testing.T) {
	const from, to = "mem://lockctl-status-from", "mem://lockctl-status-to"
	ctx := context.Background()
	plainFrom := openClient(t, from)
	// Fences apart: From's next fence is 4, To's 1, so each line must
	// show its own store's.
	for range 3 {
		hold(t, plainFrom, "job").Release(ctx)
	}
	both := openClient(t, migrateURL(from, to, 2))
	l := hold(t, both, "job")
	held := regexp.QuoteMeta(short(l.Token()))

	for _, phase := range []int{2, 3} {
		code, out, stderr := call(t, nil, "status", "--backend", migrateURL(from, to, phase), "job")
		want := regexp.MustCompile(`^job: from: held by ` + held + described + `, fence 4, expires in \S+ unless renewed\n` +
			`job: to: held by ` + held + described + `, fence 1, expires in \S+ unless renewed\n$`)
		if code != exitOK || !want.MatchString(out) {
			t.Errorf("status in phase %d: %d, stdout %q, stderr %q; want the holder on each store, From's fence 4, To's 1", phase, code, out, stderr)
		}
	}

	// A key held on From only (a phase 1 instance): To is free.
	hold(t, plainFrom, "old")
	code, out, stderr := call(t, nil, "status", "--backend", migrateURL(from, to, 2), "old")
	if code != exitOK || !regexp.MustCompile(`^old: from: held by \S+`+described+`, fence 5, expires in .*\nold: to: free\n$`).MatchString(out) {
		t.Errorf("status of a From-only holder: %d, stdout %q, stderr %q", code, out, stderr)
	}
	code, out, _ = call(t, nil, "status", "--backend", migrateURL(from, to, 3), "idle")
	if code != exitOK || out != "idle: from: free\nidle: to: free\n" {
		t.Errorf("status of a free key in phase 3: %d %q; want both stores free", code, out)
	}

	// Phases 1 and 4 use one store: status as for its plain URL.
	for _, tc := range []struct {
		url, fence string
	}{{migrateURL(from, to, 1), "4"}, {from, "4"}, {migrateURL(from, to, 4), "1"}, {to, "1"}} {
		code, out, stderr := call(t, nil, "status", "--backend", tc.url, "job")
		want := regexp.MustCompile(`^job: held by ` + held + described + `, fence ` + tc.fence + `, expires in \S+ unless renewed\n$`)
		if code != exitOK || !want.MatchString(out) {
			t.Errorf("status of %s: %d, stdout %q, stderr %q; want one line, fence %s", tc.url, code, out, stderr, tc.fence)
		}
	}
}

// migrate check for phase 3 (URL in phase 2) finds a key that a phase 1
// instance holds (on From only) not clear, and clear once released; a key
// held by a phase 2 instance on both stores, and a free key, are clear.
func TestMigrateCheckFindsAPhase1Holder(t *testing.T) {
	const from, to = "mem://lockctl-check-from", "mem://lockctl-check-to"
	phase1 := openClient(t, from)
	phase2 := openClient(t, migrateURL(from, to, 2))
	old := hold(t, phase1, "old")
	hold(t, phase2, "both")
	env := map[string]string{backendEnv: migrateURL(from, to, 2)}

	code, out, stderr := call(t, env, "migrate", "check", "--settle", "0s", "old", "both", "free")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != exitNotClear || len(lines) != 4 {
		t.Fatalf("check with a phase 1 holder: status %d, stdout %q, stderr %q; want 1 and four lines", code, out, stderr)
	}
	if !strings.HasPrefix(lines[0], "old: NOT clear: the from store holds it and the to store does not: a phase 1 instance holds it") ||
		!regexp.MustCompile(`\(from: held by `+regexp.QuoteMeta(short(old.Token()))+described+`, fence 1,`).MatchString(lines[0]) || !strings.HasSuffix(lines[0], "; to: free)") {
		t.Errorf("line of the phase 1 holder: %q; want NOT clear, why, and each store's holder", lines[0])
	}
	if lines[1] != "both: clear" || lines[2] != "free: clear" {
		t.Errorf("lines of the phase 2 holder and the free key: %q; want both clear", lines[1:3])
	}
	if !strings.HasPrefix(lines[3], "1 of 3 keys NOT clear to move from phase 2 ") || !strings.Contains(lines[3], "to phase 3 ") {
		t.Errorf("summary %q; want 1 of 3 keys not clear for phase 3", lines[3])
	}

	if err := old.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	code, out, stderr = call(t, env, "migrate", "check", "--settle", "0s", "old", "both", "free")
	if code != exitOK || !strings.HasPrefix(out, "old: clear\nboth: clear\nfree: clear\nall 3 keys clear to move from phase 2 ") {
		t.Errorf("check after the release: status %d, stdout %q, stderr %q; want all clear, 0", code, out, stderr)
	}

	// For phase 4 (URL in phase 3) too: a phase 1 holder is not clear.
	hold(t, phase1, "old")
	code, out, _ = call(t, nil, "migrate", "check", "--backend", migrateURL(from, to, 3), "--settle", "0s", "old", "both")
	if code != exitNotClear || !strings.HasPrefix(out, "old: NOT clear: ") || !strings.Contains(out, "\nboth: clear\n") {
		t.Errorf("check for phase 4: status %d, stdout %q; want old not clear, both clear", code, out)
	}

	// For phase 2 (URL in phase 1): every key is clear, phase 1 holder
	// and all.
	code, out, stderr = call(t, nil, "migrate", "check", "--backend", migrateURL(from, to, 1), "old", "both", "free")
	if code != exitOK || !strings.HasPrefix(out, "old: clear\nboth: clear\nfree: clear\nall 3 keys clear to move from phase 1 ") {
		t.Errorf("check for phase 2: status %d, stdout %q, stderr %q; want all clear", code, out, stderr)
	}
}

// A key found held on From only is read again after --settle: an
// acquire or release in flight is not reported.
func TestMigrateCheckSettles(t *testing.T) {
	const from, to = "mem://lockctl-settle-from", "mem://lockctl-settle-to"
	phase1 := openClient(t, from)
	l := hold(t, phase1, "k")
	released := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		released <- l.Release(context.Background())
	}()
	start := time.Now()
	code, out, stderr := call(t, nil, "migrate", "check", "--backend", migrateURL(from, to, 2), "--settle", "1s", "k")
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if code != exitOK || !strings.HasPrefix(out, "k: clear\n") {
		t.Errorf("check with --settle 1s, released after 100ms: status %d, stdout %q, stderr %q; want clear", code, out, stderr)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("took %v; want the settle time, 1s, before the key was read again", took)
	}
	// Without a settle time, the same holder is reported.
	hold(t, phase1, "k")
	if code, out, _ := call(t, nil, "migrate", "check", "--backend", migrateURL(from, to, 2), "--settle", "0s", "k"); code != exitNotClear {
		t.Errorf("check with --settle 0s of a held key: status %d, stdout %q; want 1", code, out)
	}
}

// Keys from a file or standard input: one a line, whitespace trimmed,
// blank and # lines skipped, repeats once; the output in their order.
func TestMigrateCheckKeysFile(t *testing.T) {
	const from, to = "mem://lockctl-keys-from", "mem://lockctl-keys-to"
	hold(t, openClient(t, from), "held")
	env := map[string]string{backendEnv: migrateURL(from, to, 2)}
	keys := "# keys of the nightly jobs\n\n  report \r\nheld\n\t# indented comment\nreport\nbackup\n"
	file := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(file, []byte(keys), 0o600); err != nil {
		t.Fatal(err)
	}
	const want = "report: clear\nheld: NOT clear: "
	code, out, stderr := call(t, env, "migrate", "check", "--settle", "0s", "--keys-file", file)
	if code != exitNotClear || !strings.HasPrefix(out, want) || !strings.Contains(out, "\nbackup: clear\n1 of 3 keys NOT clear") {
		t.Errorf("--keys-file: status %d, stdout %q, stderr %q; want report, held, backup", code, out, stderr)
	}
	code, out, stderr = callStdin(t, keys, env, "migrate", "check", "--settle", "0s", "--keys-file", "-")
	if code != exitNotClear || !strings.HasPrefix(out, want) || !strings.Contains(out, "\nbackup: clear\n1 of 3 keys NOT clear") {
		t.Errorf("--keys-file -: status %d, stdout %q, stderr %q; want report, held, backup", code, out, stderr)
	}

	for _, tc := range []struct {
		name, content, want string
	}{
		{"empty", "", "holds no keys"},
		{"comments only", "# none\n\n", "holds no keys"},
		{"bad key", "ok\n" + strings.Repeat("k", 600) + "\n", "line 2: key \"kkkk"},
		{"not UTF-8", "ok\n\xff\n", "line 2: key \"\\xff\": "},
		{"long line", strings.Repeat("k", 100<<10) + "\n", "a line longer than 64 KiB"},
	} {
		path := filepath.Join(t.TempDir(), "keys")
		if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, stderr := call(t, env, "migrate", "check", "--keys-file", path)
		if code != exitUsage || out != "" || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 || strings.Contains(stderr, "lock: ") {
			t.Errorf("--keys-file, %s: status %d, stdout %q, stderr %q; want 2 and one line saying %q", tc.name, code, out, stderr, tc.want)
		}
	}
	code, _, stderr = call(t, env, "migrate", "check", "--keys-file", filepath.Join(t.TempDir(), "none"))
	if code != exitUsage || !strings.Contains(stderr, "no such file") {
		t.Errorf("--keys-file of a missing file: %d %q", code, stderr)
	}
}

// Bad usage of migrate check: status 2, one line that says what is
// wrong, before any store is read.
func TestMigrateCheckBadUsage(t *testing.T) {
	const from, to = "mem://lockctl-usage-from", "mem://lockctl-usage-to"
	keysFile := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keysFile, []byte("k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := migrateURL(from, to, 2)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"migrate"}, "want a subcommand: lockctl migrate check"},
		{[]string{"migrate", "verify"}, `unknown subcommand "verify"; valid: check`},
		{[]string{"migrate", "check", "--backend", "mem://x", "k"}, `want a migrate:// URL (migrate://?from=URL&to=URL&phase=N) as the backend, got "mem://x"`},
		{[]string{"migrate", "check", "--backend", "redis://admin:pw12345@127.0.0.1:1", "k"}, `got "redis://admin:xxxxx@127.0.0.1:1"`},
		{[]string{"migrate", "check", "--backend", migrateURL(from, to, 4), "k"}, "phase 4 (to only, epoch+1) is the last phase of a move: there is no next phase"},
		{[]string{"migrate", "check", "--backend", migrateURL(from, to, 7), "k"}, `phase="7"; want phase=1`},
		{[]string{"migrate", "check", "--backend", "migrate://?from=" + from + "&phase=2", "k"}, "want both from=URL and to=URL"},
		{[]string{"migrate", "check", "--backend", ok + "&colour=red", "k"}, `unknown query parameter "colour"`},
		{[]string{"migrate", "check", "--backend", ok}, "no keys: give KEY arguments or --keys-file PATH"},
		{[]string{"migrate", "check", "k"}, "no backend: set LOCK_BACKEND"},
		{[]string{"migrate", "check", "--backend", ok, "--prefix", "jobs/"}, `--prefix "jobs/": the stores cannot list their keys`},
		{[]string{"migrate", "check", "--backend", ok, "--keys-file", keysFile, "k"}, "give KEY arguments or --keys-file, not both"},
		{[]string{"migrate", "check", "--backend", ok, "k", "--settle", "0s"}, "flag --settle after a KEY: flags go before the keys"},
		{[]string{"migrate", "check", "--backend", ok, "--settle", "-1s", "k"}, "flag --settle: want a duration of 0 or more"},
		{[]string{"migrate", "check", "--backend", ok, "k", ""}, "empty key"},
		{[]string{"migrate", "check", "--backend", ok, strings.Repeat("k", 1000)}, "key of 1000 bytes"},
		// Phase 1 opens only From, but check reads To too: its URL must open.
		{[]string{"migrate", "check", "--backend", migrateURL(from, "nosuch://x", 1), "k"}, `the to store: `},
		{[]string{"migrate", "check", "--backend", migrateURL(from, "nosuch://x", 1), "k"}, `unknown URL scheme "nosuch"`},
		{[]string{"migrate", "check", "--backend", migrateURL(from, "mem://y%3Fttl=5s", 1), "k"}, "to has client parameters"},
	}
	for _, tc := range cases {
		// The URL in LOCK_BACKEND: a --backend URL with credentials adds
		// a warning line.
		args, env := tc.args, map[string]string{}
		if i := slices.Index(args, "--backend"); i >= 0 {
			env[backendEnv] = args[i+1]
			args = slices.Delete(slices.Clone(args), i, i+2)
		}
		code, out, stderr := call(t, env, args...)
		if code != exitUsage || out != "" {
			t.Errorf("%q: status %d, stdout %q; want 2 and no output (stderr %q)", tc.args, code, out, stderr)
		}
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: stderr %q does not say %q", tc.args, stderr, tc.want)
		}
		if strings.Count(stderr, "\n") != 1 || strings.Contains(stderr, "lock: ") {
			t.Errorf("%q: want one line without the library's prefix: %q", tc.args, stderr)
		}
	}
}

// The help texts name the command, its flags and that there is no
// --prefix; the migrate scheme is registered.
func TestMigrateHelp(t *testing.T) {
	code, out, _ := call(t, nil, "help")
	if code != exitOK || !strings.Contains(out, "migrate check [BACKEND] [--settle D] [--keys-file PATH | KEY...]") || !regexp.MustCompile(`schemes: .*\bmigrate\b`).MatchString(out) {
		t.Errorf("help: %d %q; want migrate check and the migrate scheme", code, out)
	}
	code, out, _ = call(t, nil, "migrate", "check", "--help")
	for _, want := range []string{"usage: lockctl migrate check", "There is no --prefix: the stores cannot list their", "--settle D", "(default 1s)", "--keys-file PATH", "Exit status: 0 when every key is clear, 1 when one"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("migrate check --help: %d, output lacks %q:\n%s", code, want, out)
		}
	}
	if code, out, _ := call(t, nil, "migrate", "--help"); code != exitOK || !strings.Contains(out, "lockctl migrate check") {
		t.Errorf("migrate --help: %d %q", code, out)
	}
}

// No output of status, break or migrate check holds a secret of a store URL
// inside the migrate URL: in From (phases 2 and 3 open it) or in To
// (check opens it in phase 1 too), escaped or not, on a closed port.
func TestMigrateSecretsDoNotLeak(t *testing.T) {
	t.Cleanup(func() { redistest.WaitForDialers(t) })
	secret := "redis://admin:" + marker + "@" + closedAddr(t)
	const other = "mem://lockctl-secret-other"
	escaped := func(from, to string, phase int) string {
		return "migrate://?" + url.Values{"from": {from}, "to": {to}, "phase": {strconv.Itoa(phase)}}.Encode()
	}
	urls := map[string]string{
		"from, phase 2":           migrateURL(secret, other, 2),
		"from, phase 3, escaped":  escaped(secret, other, 3),
		"to, phase 1":             migrateURL(other, secret, 1),
		"to, phase 1, escaped":    escaped(other, secret, 1),
		"from, password=":         migrateURL("redis://"+closedAddr(t)+"?password="+marker, other, 2),
		"from, bad escape":        migrateURL("redis://admin:"+marker+"%zz@"+closedAddr(t), other, 2),
		"to, bad port, phase 1":   migrateURL(other, "redis://admin:"+marker+"@127.0.0.1:port", 1),
		"outer fragment, phase 2": migrateURL(secret, other, 2) + "#" + marker,
	}
	for name, u := range urls {
		for _, args := range [][]string{
			{"migrate", "check", "--settle", "0s", "k"},
			{"status", "k"},
			{"break", "--yes", "k"},
		} {
			for _, way := range []string{"--backend", backendEnv} {
				a, env := append([]string(nil), args...), map[string]string{}
				if way == backendEnv {
					env[backendEnv] = u
				} else { // flags before the key
					a = append(append(a[:len(a)-1:len(a)-1], "--backend", u), args[len(args)-1])
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				var stdout, stderr lockedBuffer
				code := lockctl(ctx, a, &stdout, &stderr, func(k string) string { return env[k] })
				cancel()
				// Status and break in phase 1 open From alone, as its
				// plain URL does: they may succeed; check reads both
				// stores.
				if args[0] == "migrate" && (code == exitOK || code == exitNotClear) {
					t.Errorf("%s, %s via %s: status %d; want a failure (stderr %q)", name, args[0], way, code, stderr.String())
				}
				for what, out := range map[string]string{"stdout": stdout.String(), "stderr": stderr.String()} {
					if strings.Contains(out, marker) {
						t.Errorf("%s, %s via %s: status %d, %s holds the secret:\n%s", name, args[0], way, code, what, out)
					}
				}
			}
		}
	}
	// The phase 1 check reads To, where the secret is: it failed there,
	// and says so.
	code, _, stderr := call(t, nil, "migrate", "check", "--backend", migrateURL(other, secret, 1), "k")
	if code != exitBackend || !strings.HasPrefix(stderr, "lockctl migrate check: ") || !strings.Contains(stderr, "to store") {
		t.Errorf("phase 1 check with To unreachable: %d %q; want 69 and a message about the to store", code, stderr)
	}
}

// A skip_verify=true inside the migrate URL (in from or to) gets the
// warning that a top-level one gets.
func TestMigrateWarnsOfANestedSkipVerify(t *testing.T) {
	t.Cleanup(func() { redistest.WaitForDialers(t) })
	tls := "rediss://" + closedAddr(t) + "?skip_verify=true"
	for _, u := range []string{
		migrateURL(tls, "mem://lockctl-skip", 2),
		migrateURL("mem://lockctl-skip", url.QueryEscape(tls), 1),
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var stdout, stderr lockedBuffer
		lockctl(ctx, []string{"migrate", "check", "--backend", u, "k"}, &stdout, &stderr, func(string) string { return "" })
		cancel()
		if !strings.Contains(stderr.String(), "warning: skip_verify=true") {
			t.Errorf("%s: stderr %q; want the skip_verify warning", u, stderr.String())
		}
	}
	if !lock.SkipsVerify("migrate://?from=mem://a&to=" + url.QueryEscape("rediss://h:1?skip_verify=true") + "&phase=1") {
		t.Errorf("lock.SkipsVerify misses an escaped nested skip_verify")
	}
	if lock.SkipsVerify(migrateURL("mem://a", "mem://b", 2)) || lock.SkipsVerify("mem://a") {
		t.Errorf("lock.SkipsVerify of URLs without skip_verify: true")
	}
}
