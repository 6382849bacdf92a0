package redis_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/distlock/lock"
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
// while a server is unreachable. Backends opened from a URL keep it quiet;
// SetGoRedisLogger routes every go-redis message to log/slog, or drops
// them; the user's own clients log as go-redis does unless told otherwise.
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

	t.Run("opened from a URL: quiet", func(t *testing.T) {
		if out := captureStderr(t, func() { opened(t) }); out != "" {
			t.Errorf("backends opened from a URL wrote to stderr:\n%s", out)
		}
	})
	t.Run("own client: as go-redis does", func(t *testing.T) {
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
}
