package redis_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// captureStderr runs f with the process's file descriptor 2 (where
// go-redis's default logger writes) sent to a pipe, and returns what was
// written there.
func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Dup2(int(w.Fd()), 2); err != nil {
		t.Fatal(err)
	}
	out := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		out <- string(b)
	}()
	f()
	syscall.Dup2(saved, 2)
	syscall.Close(saved)
	w.Close()
	s := <-out
	r.Close()
	return s
}

// lockedBuffer is a bytes.Buffer for a slog handler written from several
// goroutines.
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

// unreachable uses locks against a store that refuses connections: one
// TryAcquire, one Acquire under a deadline, and Close.
func unreachable(t *testing.T, locks *lock.Client) {
	t.Helper()
	ctx := context.Background()
	if _, err := locks.TryAcquire(ctx, "k"); err == nil {
		t.Error("TryAcquire on a closed port succeeded")
	}
	actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := locks.Acquire(actx, "k"); err == nil {
		t.Error("Acquire on a closed port succeeded")
	}
	locks.Close()
}

// go-redis's logger writes to the process's stderr, 4-9 lines per call
// while a server is unreachable. SetQuietGoRedisLogger keeps backends
// opened from a URL quiet; SetGoRedisLogger routes every go-redis message
// to log/slog, or drops them; the user's own clients log as go-redis does
// unless told otherwise. (Without either call, go-redis's logger is left
// alone: TestOpenLeavesGoRedisLoggerAlone.)
func TestGoRedisLogging(t *testing.T) {
	t.Cleanup(redis.ResetGoRedisLogger)
	ctx := context.Background()
	addrs := closedPorts(t, 3)
	urls := []string{"redis://" + addrs[0], "redlock://" + strings.Join(addrs, ",")}
	opened := func(t *testing.T) {
		for _, u := range urls {
			locks, err := lock.Open(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			unreachable(t, locks)
		}
	}
	own := func(t *testing.T) {
		locks, err := lock.New(redis.New(plainClient(t, addrs[0])))
		if err != nil {
			t.Fatal(err)
		}
		unreachable(t, locks)
	}

	t.Run("quiet: opened from a URL", func(t *testing.T) {
		redis.SetQuietGoRedisLogger()
		if out := captureStderr(t, func() { opened(t) }); out != "" {
			t.Errorf("backends opened from a URL wrote to stderr after SetQuietGoRedisLogger:\n%s", out)
		}
	})
	t.Run("quiet: own client as go-redis does", func(t *testing.T) {
		redis.SetQuietGoRedisLogger()
		out := captureStderr(t, func() { own(t) })
		if !strings.Contains(out, "failed to dial") {
			t.Errorf("a client the user built logged %q to stderr; want go-redis's messages, as without this package", out)
		}
	})
	t.Run("routed to slog", func(t *testing.T) {
		var buf lockedBuffer
		redis.SetGoRedisLogger(slog.New(slog.NewTextHandler(&buf, nil)))
		out := captureStderr(t, func() {
			opened(t)
			own(t)
		})
		if out != "" {
			t.Errorf("wrote to stderr after SetGoRedisLogger:\n%s", out)
		}
		if logged := buf.String(); !strings.Contains(logged, "failed to dial") || !strings.Contains(logged, "logger=go-redis") || !strings.Contains(logged, "level=WARN") {
			t.Errorf("slog got %q; want go-redis's messages at WARN with logger=go-redis", logged)
		}
	})
	t.Run("dropped", func(t *testing.T) {
		redis.SetGoRedisLogger(nil)
		if out := captureStderr(t, func() {
			opened(t)
			own(t)
		}); out != "" {
			t.Errorf("wrote to stderr after SetGoRedisLogger(nil):\n%s", out)
		}
	})
	t.Run("the last call wins", func(t *testing.T) {
		rdb := oneDialClient(addrs[0])
		defer rdb.Close()
		redis.SetGoRedisLogger(nil)
		rec := &recordingLogger{}
		goredis.SetLogger(rec)
		rdb.Ping(ctx)
		if rec.count("failed to dial") == 0 {
			t.Errorf("goredis.SetLogger after SetGoRedisLogger: the user's logger got %q; want go-redis's messages", rec.all())
		}
		redis.SetQuietGoRedisLogger()
		n := rec.count("")
		if out := captureStderr(t, func() { rdb.Ping(ctx) }); !strings.Contains(out, "failed to dial") {
			t.Errorf("SetQuietGoRedisLogger after goredis.SetLogger: stderr got %q; want go-redis's messages about the user's client", out)
		}
		if rec.count("") != n {
			t.Errorf("SetQuietGoRedisLogger after goredis.SetLogger: the replaced logger still got messages")
		}
	})
}

// oneDialClient returns a go-redis client of addr that dials once per
// call.
func oneDialClient(addr string) *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
}

// recordingLogger is a go-redis logger that keeps every message.
type recordingLogger struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recordingLogger) Printf(_ context.Context, format string, v ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, fmt.Sprintf(format, v...))
}

// count returns the number of messages that contain sub.
func (r *recordingLogger) count(sub string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

func (r *recordingLogger) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// loggerChildEnv makes the test binary run TestOpenLeavesGoRedisLoggerAlone's
// check in a process of its own.
const loggerChildEnv = "LOCK_REDIS_LOGGER_CHILD"

// lock.Open of a Redis URL, and the calls of the Client it returns, leave
// go-redis's process-wide logger as it was: a logger the program set with
// goredis.SetLogger before still gets go-redis's messages, those about the
// backend opened from the URL too. The check runs in a fresh process (the
// test binary started again), where no earlier test has set a logger.
func TestOpenLeavesGoRedisLoggerAlone(t *testing.T) {
	if os.Getenv(loggerChildEnv) != "" {
		openLeavesGoRedisLoggerAlone(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenLeavesGoRedisLoggerAlone$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), loggerChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestOpenLeavesGoRedisLoggerAlone") {
		t.Errorf("the check in a fresh process failed (%v):\n%s", err, out)
	}
}

func openLeavesGoRedisLoggerAlone(t *testing.T) {
	ctx := context.Background()
	rec := &recordingLogger{}
	goredis.SetLogger(rec)
	t.Cleanup(redis.ResetGoRedisLogger)
	addrs := closedPorts(t, 4)
	own, opened, nodes := addrs[0], addrs[1], addrs[1:]
	rdb := oneDialClient(own) // the user's own client

	// stillRecords fails t unless go-redis's message about a failed dial
	// of the user's own client still reaches rec.
	stillRecords := func(after string) {
		t.Helper()
		n := rec.count(own)
		if err := rdb.Ping(ctx).Err(); err == nil {
			t.Fatal("Ping of a closed port succeeded")
		}
		if rec.count(own) == n {
			t.Errorf("after %s, go-redis's message about a failed dial did not reach the logger set with goredis.SetLogger: go-redis's logger was replaced (recorded: %q)", after, rec.all())
		}
	}
	stillRecords("goredis.SetLogger") // the check itself works

	for _, u := range []string{"redis://" + opened, "redlock://" + strings.Join(nodes, ",")} {
		locks, err := lock.Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		stillRecords("lock.Open(" + u + ")")
		if _, err := locks.TryAcquire(ctx, "k"); err == nil {
			t.Fatalf("TryAcquire on %s (closed ports) succeeded", u)
		}
		stillRecords("TryAcquire on lock.Open(" + u + ")")
		if rec.count(opened) == 0 {
			t.Errorf("go-redis's messages about the backend opened from %s did not reach the logger set with goredis.SetLogger (recorded: %q)", u, rec.all())
		}
		locks.Close()
	}
	rdb.Close()
	redistest.WaitForDialers(t)
}
