package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/internal/consultest"
	"github.com/distlock/lock/internal/etcdtest"
)

// holderOf is key's holder on c's store, as the store sees it.
func holderOf(t *testing.T, c *lock.Client, key string) backend.Holder {
	t.Helper()
	in, ok := c.Backend().(backend.Inspector)
	if !ok {
		t.Fatalf("the backend of %T cannot inspect", c.Backend())
	}
	h, err := in.Inspect(context.Background(), key)
	if err != nil {
		t.Fatalf("Inspect(%s): %v", key, err)
	}
	return h
}

// answerAfter is a standard input whose first read runs act (on the
// goroutine that reads, lockctl's: the test's own), then reads answer:
// what happens while break's question waits.
type answerAfter struct {
	once   sync.Once
	act    func()
	answer io.Reader
}

func (a *answerAfter) Read(p []byte) (int, error) {
	a.once.Do(a.act)
	return a.answer.Read(p)
}

// unusedToken is a token no acquisition used.
func unusedToken(t *testing.T) string {
	var b [16]byte
	if _, err := crand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// testBreak runs break's story on the store at url: nothing held; a
// holder kept when the answer is not yes; a holder that changed while the
// question waited, or between the read and the release, kept; a holder
// removed with y and with --yes, the key then free for another owner and
// the next fence above the removed holder's (the counter kept).
func testBreak(t *testing.T, url string) {
	ctx := context.Background()
	c := openClient(t, url)
	other := openClient(t, url) // another process's client
	args := func(more ...string) []string { return append([]string{"break", "--backend", url}, more...) }

	code, out, stderr := call(t, nil, args("--yes", "idle")...)
	if code != exitNotBroken || out != "idle: free: nothing to remove\n" {
		t.Errorf("break of a free key: %d, stdout %q, stderr %q; want 1 and nothing to remove", code, out, stderr)
	}

	a := hold(t, c, "job")
	shown := regexp.MustCompile(`(?m)^job: held by ` + a.Token() + described + fmt.Sprintf(`, fence %d, (expires in \S+ unless renewed|time left unknown)$`, a.Fence()))
	for _, answer := range []string{"n\n", "no\n", "yes please\n", "", "\n"} {
		code, out, stderr := callStdin(t, answer, nil, args("job")...)
		if code != exitNotBroken || out != "" || !shown.MatchString(stderr) || !strings.Contains(stderr, "remove it? [y/N] ") || !strings.Contains(stderr, "nothing removed") {
			t.Errorf("answer %q: %d, stdout %q, stderr %q; want 1, the holder shown, the question, nothing removed", answer, code, out, stderr)
		}
		if h := holderOf(t, c, "job"); h.Token != a.Token() {
			t.Fatalf("answer %q: the key is held by %q; want the holder %s kept", answer, h.Token, a.Token())
		}
	}

	// The holder changes while the question waits: it released, and
	// another owner took the key.
	var b *lock.Lease
	stdin := &answerAfter{answer: strings.NewReader("y\n"), act: func() {
		if err := a.Release(ctx); err != nil {
			t.Fatalf("release of the shown holder: %v", err)
		}
		b = hold(t, other, "job")
	}}
	code, out, stderr = callReader(t, stdin, nil, args("job")...)
	if code != exitNotBroken || out != "" || !strings.Contains(stderr, "the holder changed while the question waited; now held by "+b.Token()) || !strings.Contains(stderr, "nothing removed") {
		t.Errorf("holder changed while asked: %d, stdout %q, stderr %q; want 1, the new holder, nothing removed", code, out, stderr)
	}
	if h := holderOf(t, c, "job"); h.Token != b.Token() {
		t.Fatalf("after a break whose holder changed: held by %q; want the new holder %s kept", h.Token, b.Token())
	}

	// The holder changes between the read and the release: the release
	// goes out with a token that does not hold the key. (A token that
	// never held it: the token of a holder that released is answered as
	// released, since a release sent again must be.)
	var stdout, errs lockedBuffer
	e := &environment{stdout: &stdout, stderr: &errs}
	stale := &breakStore{b: c.Backend(), h: backend.Holder{Held: true, Token: unusedToken(t), Fence: a.Fence()}}
	if code := e.releaseHolders(ctx, "job", []*breakStore{stale}); code != exitNotBroken || stdout.String() != "" ||
		!strings.Contains(errs.String(), `"job": the holder changed since it was read`) {
		t.Errorf("release for a stale holder: %d, stdout %q, stderr %q; want 1 and the holder changed", code, stdout.String(), errs.String())
	}
	if h := holderOf(t, c, "job"); h.Token != b.Token() {
		t.Fatalf("after a release for a stale holder: held by %q; want %s kept", h.Token, b.Token())
	}

	// y, piped: removed, and the key free for another owner, at a higher
	// fence.
	code, out, stderr = callStdin(t, "y\n", nil, args("job")...)
	removed := fmt.Sprintf("job: removed the holder %s, fence %d; the fence counter is kept: the next holder's fence is above %d\n", b.Token(), b.Fence(), b.Fence())
	if code != exitOK || out != removed || !strings.Contains(stderr, `remove it? [y/N] "y" (read from standard input)`) {
		t.Errorf("answer y: %d, stdout %q, stderr %q; want 0 and %q", code, out, stderr, removed)
	}
	if h := holderOf(t, c, "job"); h.Held {
		t.Fatalf("after the break: held by %q; want free", h.Token)
	}
	next := hold(t, c, "job")
	if next.Fence() <= b.Fence() {
		t.Errorf("the next holder's fence %d is not above the removed holder's %d: the fence counter went back", next.Fence(), b.Fence())
	}

	// --yes: no question, nothing read.
	code, out, stderr = callStdin(t, "", nil, args("--yes", "job")...)
	if code != exitOK || !strings.HasPrefix(out, "job: removed the holder "+next.Token()+",") || strings.Contains(stderr, "remove it?") {
		t.Errorf("--yes: %d, stdout %q, stderr %q; want 0, removed, no question", code, out, stderr)
	}
	// A third client: c and other may not have heard yet that their
	// leases were removed, and refuse the key to their own callers until
	// they do.
	if last := hold(t, openClient(t, url), "job"); last.Fence() <= next.Fence() {
		t.Errorf("after --yes, the next fence %d is not above the removed holder's %d", last.Fence(), next.Fence())
	}
}

func TestBreakOnMemory(t *testing.T) {
	testBreak(t, "mem://lockctl-break")
}

func TestBreakOnRedis(t *testing.T) {
	url, _ := redisURL(t)
	testBreak(t, url)
}

func TestBreakOnEtcd(t *testing.T) {
	testBreak(t, "etcd://"+etcdtest.Start(t).Addr)
}

// Consul: the holder's remaining TTL is not shown (Consul does not say
// it), and the release from another process goes by the entry's index.
func TestBreakOnConsul(t *testing.T) {
	testBreak(t, "consul://"+consultest.Start(t).Addr+"?lockdelay=0s")
}

// In phases 2 and 3 of a move, break shows and removes the holder on each
// store; a holder on From only (a phase 1 instance) is removed there.
func TestBreakOnBothStoresOfAMove(t *testing.T) {
	const from, to = "mem://lockctl-break-from", "mem://lockctl-break-to"
	plainFrom, plainTo := openClient(t, from), openClient(t, to)
	both := openClient(t, migrateURL(from, to, 2))
	for range 3 { // From's fences ahead of To's
		hold(t, plainFrom, "job").Release(context.Background())
	}
	l := hold(t, both, "job")
	fromFence, toFence := holderOf(t, plainFrom, "job").Fence, holderOf(t, plainTo, "job").Fence
	for _, phase := range []int{2, 3} {
		url := migrateURL(from, to, phase)
		code, out, stderr := callStdin(t, "n\n", nil, "break", "--backend", url, "job")
		if code != exitNotBroken || !regexp.MustCompile("job: from: held by "+l.Token()+described+fmt.Sprintf(", fence %d,", fromFence)).MatchString(stderr) ||
			!regexp.MustCompile("job: to: held by "+l.Token()+described+fmt.Sprintf(", fence %d,", toFence)).MatchString(stderr) {
			t.Errorf("phase %d, answer n: %d, stdout %q, stderr %q; want 1 and each store's holder", phase, code, out, stderr)
		}
	}
	code, out, stderr := callStdin(t, "yes\n", nil, "break", "--backend", migrateURL(from, to, 3), "job")
	want := fmt.Sprintf("job: from: removed the holder %[1]s, fence %[2]d; the fence counter is kept: the next holder's fence is above %[2]d\n"+
		"job: to: removed the holder %[1]s, fence %[3]d; the fence counter is kept: the next holder's fence is above %[3]d\n", l.Token(), fromFence, toFence)
	if code != exitOK || out != want {
		t.Errorf("phase 3, answer yes: %d, stdout %q, stderr %q; want 0 and\n%s", code, out, stderr, want)
	}
	if hf, ht := holderOf(t, plainFrom, "job"), holderOf(t, plainTo, "job"); hf.Held || ht.Held {
		t.Fatalf("after the break: from %+v, to %+v; want both free", hf, ht)
	}
	if next := hold(t, both, "job"); next.Fence() <= l.Fence() {
		t.Errorf("the next fence %d is not above the removed holder's %d", next.Fence(), l.Fence())
	}

	// A phase 1 holder: on From only.
	old := hold(t, plainFrom, "old")
	code, out, stderr = callStdin(t, "y\n", nil, "break", "--backend", migrateURL(from, to, 2), "old")
	if code != exitOK || !strings.Contains(stderr, "old: to: free\n") || !strings.HasPrefix(out, "old: from: removed the holder "+old.Token()+",") || strings.Contains(out, "old: to:") {
		t.Errorf("a From-only holder: %d, stdout %q, stderr %q; want 0, removed on From, To shown free", code, out, stderr)
	}
	code, out, _ = call(t, nil, "break", "--backend", migrateURL(from, to, 2), "--yes", "old")
	if code != exitNotBroken || out != "old: from: free: nothing to remove\nold: to: free: nothing to remove\n" {
		t.Errorf("break of a key free on both stores: %d, stdout %q; want 1 and each store free", code, out)
	}
}

// A value that this library did not write is not released (no token to
// release it by): nothing changes, and the key and the value are printed
// escaped, as every other output.
func TestBreakRefusesAValueThatIsNoTokenAndEscapesIt(t *testing.T) {
	url, rdb := redisURL(t)
	ctx := context.Background()
	key := "job\x1b]0;owned\x07\u202e"
	if err := rdb.Set(ctx, "lock:{"+key+"}", "\x9b\x1b[31mred", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := call(t, nil, "break", "--backend", url, "--yes", key)
	if code != exitNotBroken || out != "" || !strings.Contains(stderr, `"job\x1b]0;owned\a\u202e": held by "\x9b\x1b[31mred", which is not a token of this library`) {
		t.Errorf("break of a foreign value: %d, stdout %q, stderr %q; want 1 and the value named, escaped", code, out, stderr)
	}
	checkPrintable(t, "break", stderr)
	if v, err := rdb.Get(ctx, "lock:{"+key+"}").Result(); err != nil || v != "\x9b\x1b[31mred" {
		t.Errorf("the value after break: %q, %v; want it kept", v, err)
	}

	// A lock of this library under the same hostile key: the question
	// shows it escaped.
	c := openClient(t, url)
	if err := rdb.Del(ctx, "lock:{"+key+"}").Err(); err != nil {
		t.Fatal(err)
	}
	l := hold(t, c, key)
	code, _, stderr = callStdin(t, "\x1b[2Jn\n", nil, "break", "--backend", url, key)
	if code != exitNotBroken || !strings.Contains(stderr, `job\x1b]0;owned\a\u202e: held by `+l.Token()) || !strings.Contains(stderr, `the answer was "\x1b[2Jn"`) {
		t.Errorf("question under a hostile key: %d, stderr %q; want 1, key and answer escaped", code, stderr)
	}
	checkPrintable(t, "break's question", stderr)
}

// Bad usage is found before anything is sent: the backend here is a
// closed port.
func TestBreakBadUsage(t *testing.T) {
	url := "redis://" + closedAddr(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"break", "--backend", url}, "want exactly one KEY, got 0 arguments"},
		{[]string{"break", "--backend", url, "a", "b"}, "want exactly one KEY, got 2 arguments"},
		{[]string{"break", "--backend", url, "job", "--yes"}, `flag --yes after KEY "job": flags go before KEY`},
		{[]string{"break", "--backend", url, "--yes=maybe", "job"}, `invalid boolean value "maybe" for --yes`},
		{[]string{"break", "--backend", url, "--force", "job"}, "unknown flag --force; valid flags: --backend, --backend-file, --yes"},
		{[]string{"break", "--backend", url, ""}, "empty key; a key is 1 to 512 bytes"},
		{[]string{"break", "--backend", url, "\xff"}, "not valid UTF-8"},
		{[]string{"break", "job"}, "no backend: set LOCK_BACKEND"},
		{[]string{"break", "--backend", "nosuch://x", "job"}, "registered: consul"},
	} {
		code, out, stderr := call(t, nil, tc.args...)
		if code != exitUsage || out != "" || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: %d, stdout %q, stderr %q; want 2 and one line saying %q", tc.args, code, out, stderr, tc.want)
		}
	}
	// The store unreachable: a failure (69), not "nothing held".
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var stdout, stderr lockedBuffer
	code := lockctl(ctx, []string{"break", "--backend", url, "--yes", "job"}, &stdout, &stderr, func(string) string { return "" })
	if code != exitBackend || stdout.String() != "" || !strings.Contains(stderr.String(), "nothing removed") {
		t.Errorf("break with the store unreachable: %d, stdout %q, stderr %q; want 69, nothing removed", code, stdout.String(), stderr.String())
	}
}

// The help texts name break, its flag and its exit statuses.
func TestBreakHelp(t *testing.T) {
	code, out, _ := call(t, nil, "help")
	if code != exitOK || !strings.Contains(out, "\n  break   [BACKEND] [--yes] KEY ") {
		t.Errorf("help: %d %q; want break", code, out)
	}
	code, out, _ = call(t, nil, "break", "--help")
	for _, want := range []string{"usage: lockctl break [--backend URL | --backend-file PATH] [--yes] KEY", `asks "remove it? [y/N]"`, "echo y | lockctl break KEY", "fence counter is kept", "--yes\n", "Exit status: 0 when every holder found was removed; 1 when"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("break --help: %d, output lacks %q:\n%s", code, want, out)
		}
	}
}

// The answer is one line; what follows it stays unread.
func TestBreakReadsOneLine(t *testing.T) {
	r := strings.NewReader("y\r\nrest")
	if a, err := readAnswer(r); a != "y" || err != nil {
		t.Errorf("readAnswer: %q, %v; want y", a, err)
	}
	if rest, _ := io.ReadAll(r); string(rest) != "rest" {
		t.Errorf("left unread: %q; want rest", rest)
	}
	if a, err := readAnswer(strings.NewReader("yes")); a != "yes" || err != nil {
		t.Errorf("a last line without newline: %q, %v; want yes", a, err)
	}
	if a, err := readAnswer(strings.NewReader("")); a != "" || err == nil {
		t.Errorf("no input: %q, %v; want an error", a, err)
	}
	if a, _ := readAnswer(strings.NewReader(strings.Repeat("y", 5000))); len(a) != maxAnswer {
		t.Errorf("a long line: %d bytes read; want at most %d", len(a), maxAnswer)
	}
	if isTerminal(strings.NewReader("")) {
		t.Errorf("a strings.Reader is a terminal")
	}
	if f, err := os.Open(os.DevNull); err == nil {
		defer f.Close()
		if isTerminal(f) {
			t.Errorf("%s is a terminal", os.DevNull)
		}
	}
}
