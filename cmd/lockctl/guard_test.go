package main

import (
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
	lockredis "github.com/distlock/lock/redis"
)

// A stopped lockctl renews nothing, and its command must not outlive the
// lock: the guard kills the command's whole group at the lease's
// deadline, so it is dead before a second owner can acquire the key. With
// SIGTSTP (^Z) the command also stops with lockctl, as job control does.
// Once continued, lockctl reports the loss (76).
func TestRunStoppedLockctlCommandDiesBeforeTheNextOwner(t *testing.T) {
	url, rdb := redisURL(t)
	for _, sig := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGTSTP} {
		t.Run(sigName(sig), func(t *testing.T) {
			dir := t.TempDir()
			key := "stopped-" + sigName(sig)
			lockctl, stderr := startLockctl(t, "run", "--backend", url, "--ttl", "1s", key, "--", "sh", "-c", familyScript(dir))
			waitForFile(t, filepath.Join(dir, "started"))
			ps := pids(t, dir)
			killLater(t, ps...)
			lockctl.Process.Signal(sig)
			waitStopped(t, lockctl.Process.Pid)
			if sig == syscall.SIGTSTP {
				waitStopped(t, ps...)
			}

			succ, err := lock.New(lockredis.New(rdb))
			if err != nil {
				t.Fatal(err)
			}
			defer succ.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			l, err := succ.Acquire(ctx, key, lock.WithTTL(time.Second))
			if err != nil {
				t.Fatalf("a second owner did not get %q within 10s of the first lockctl's stop (1s TTL): %v", key, err)
			}
			for _, pid := range ps {
				if alive(pid) {
					t.Errorf("process %d of the stopped lockctl's command still runs (state %c) when a second owner has the lock", pid, procState(pid))
				}
			}
			if err := l.Release(ctx); err != nil {
				t.Errorf("second owner's release: %v", err)
			}

			lockctl.Process.Signal(syscall.SIGCONT)
			if code := waitExit(t, lockctl, 10*time.Second); code != exitLost {
				t.Errorf("continued lockctl exited %d; want 76 (lock lost, command stopped); stderr %q", code, stderr)
			}
			t.Logf("lockctl said: %s", stderr)
		})
	}
}

// A short stop of lockctl, well before the lease's deadline, changes
// nothing: once continued, lockctl renews again, the command runs on for
// more than two TTLs (the guard hears of the renewals) and lockctl exits
// with the command's status. With SIGTSTP the command is stopped until
// lockctl is continued.
func TestRunContinuedLockctlFinishesNormally(t *testing.T) {
	url, _ := redisURL(t)
	for _, sig := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGTSTP} {
		t.Run(sigName(sig), func(t *testing.T) {
			dir := t.TempDir()
			key := "continued-" + sigName(sig)
			// The command waits for the file "go", then holds the lock 2.5s.
			script := fmt.Sprintf(`echo $$ > %[1]s/shell; touch %[1]s/started; while [ ! -e %[1]s/go ]; do sleep 0.01; done; sleep 2.5; touch %[1]s/finished; exit 3`, dir)
			lockctl, stderr := startLockctl(t, "run", "--backend", url, "--ttl", "1s", key, "--", "sh", "-c", script)
			waitForFile(t, filepath.Join(dir, "started"))
			shell := int(readInt(t, filepath.Join(dir, "shell")))
			killLater(t, shell)
			lockctl.Process.Signal(sig)
			waitStopped(t, lockctl.Process.Pid)
			if sig == syscall.SIGTSTP {
				waitStopped(t, shell)
			}
			if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			lockctl.Process.Signal(syscall.SIGCONT)
			if code := waitExit(t, lockctl, 20*time.Second); code != 3 {
				t.Fatalf("lockctl exited %d; want the command's 3; stderr %q", code, stderr)
			}
			if _, err := os.Stat(filepath.Join(dir, "finished")); err != nil {
				t.Errorf("the command did not finish: %v", err)
			}
			if code, out, _ := call(t, nil, "status", "--backend", url, key); code != 0 || strings.TrimSpace(out) != key+": free" {
				t.Errorf("status after lockctl exited: %d %q; want %s: free", code, out, key)
			}
			if sig == syscall.SIGTSTP && !strings.Contains(stderr.String(), "not renewed while lockctl is stopped") {
				t.Errorf("stderr %q does not say that a stopped lockctl does not renew", stderr)
			}
		})
	}
}

// sigName is sig's name as kill -l says it: STOP, TSTP.
func sigName(sig syscall.Signal) string {
	return map[syscall.Signal]string{syscall.SIGSTOP: "STOP", syscall.SIGTSTP: "TSTP"}[sig]
}

// waitStopped fails t unless every pid is stopped (state T) within 10s.
func waitStopped(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for procState(pid) != 'T' {
			if time.Now().After(deadline) {
				t.Fatalf("process %d is not stopped 10s later (state %q)", pid, procState(pid))
			}
			time.Sleep(2 * time.Millisecond) // poll /proc
		}
	}
}

// readInt reads the decimal number in the file at path.
func readInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}

// waitExit waits at most d for cmd to exit and returns its status; it
// kills cmd and fails t when d passes first.
func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration) int {
	t.Helper()
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		t.Fatalf("lockctl did not exit within %v", d)
	}
	return cmd.ProcessState.ExitCode()
}
