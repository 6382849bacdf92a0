package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/redistest"
)

// marker stands for a password or a token: no output of lockctl may hold
// it, whatever the scheme, the command, the place in the URL or the way
// the URL was given.
const marker = "Qx7SecretMarker9"

// closedAddr returns a loopback address on which nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// captureStderr sends everything written to this process's descriptor 2
// (loggers of client libraries that write to os.Stderr directly) to a
// pipe until the test ends, and returns what was written by then.
func captureStderr(t *testing.T) func() string {
	t.Helper()
	saved, err := unix.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Dup2(int(w.Fd()), 2); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var buf bytes.Buffer
	done := make(chan struct{})
	go func() {
		io.Copy(&buf, r)
		close(done)
	}()
	var once sync.Once
	restore := func() {
		once.Do(func() {
			unix.Dup2(saved, 2) // closes the pipe's last write end
			unix.Close(saved)
			<-done
			r.Close()
		})
	}
	t.Cleanup(restore)
	return func() string {
		restore()
		return buf.String()
	}
}

// secretURLs returns, for scheme, URLs on unreachable addresses with the
// marker in each place a secret can be: the userinfo, each secret query
// parameter, next to a bad escape. Each is named for the place.
func secretURLs(t *testing.T, scheme string) map[string]string {
	hosts := closedAddr(t)
	path, query := "", ""
	switch {
	case scheme == "mem":
		hosts = "lockctl-secrets"
	case scheme == "unix":
		hosts, path = "", filepath.Join(t.TempDir(), "none.sock")
	case strings.HasPrefix(scheme, "redlock"):
		hosts = closedAddr(t) + "," + closedAddr(t) + "," + closedAddr(t)
	case strings.Contains(scheme, "sentinel"):
		query = "master_name=mymaster&"
	}
	base := func(userinfo, q string) string {
		u := scheme + "://" + userinfo + hosts + path
		if query+q != "" {
			u += "?" + strings.TrimSuffix(query+q, "&")
		}
		return u
	}
	return map[string]string{
		"userinfo":                base("admin:"+marker+"@", ""),
		"userinfo password only":  base(":"+marker+"@", ""),
		"userinfo without colon":  base(marker+"@", ""),
		"password":                base("", "password="+marker),
		"token":                   base("", "token="+marker),
		"sentinel_password":       base("", "sentinel_password="+marker),
		"every place":             base("admin:"+marker+"@", "password="+marker+"&token="+marker+"&sentinel_password="+marker),
		"bad escape in userinfo":  base("admin:"+marker+"%zz@", ""),
		"bad escape in query":     base("", "password="+marker+"%zz"),
		"bad escape after secret": base("", "password="+marker+"&ttl=%zz"),
		"semicolon query":         base("", "password="+marker+";ttl=1s"),
		"escaped secret":          base("admin:"+strings.Replace(marker, "S", "%53", 1)+"@", ""),
		"fragment":                base("admin:"+marker+"@", "") + "#" + marker,
		"bad port":                scheme + "://admin:" + marker + "@127.0.0.1:port",
	}
}

// schemelessURLs are URLs without a scheme, or with one nobody registered.
func schemelessURLs(t *testing.T) map[string]string {
	addr := closedAddr(t)
	return map[string]string{
		"no scheme, //":            "//admin:" + marker + "@" + addr,
		"no scheme, user:pass@":    "admin:" + marker + "@" + addr,
		"no scheme, bad escape":    "admin:" + marker + "%zz@" + addr,
		"no scheme, bare password": marker,
		"unknown scheme":           "nosuch://admin:" + marker + "@" + addr + "?password=" + marker,
		"unknown scheme, opaque":   "nosuch:admin:" + marker + "@" + addr,
		"leading space":            " redis://admin:" + marker + "@" + addr,
		"control character":        "redis://admin:" + marker + "@" + addr + "/\x1b",
	}
}

// secretCommands are lockctl's commands that take a backend, with
// arguments that make each reach the backend and give up quickly.
var secretCommands = map[string][]string{
	"run":        {"run", "--timeout", "200ms"},
	"status":     {"status"},
	"break":      {"break", "--yes"},
	"demo":       {"demo", "--buyers", "2", "--units", "1"},
	"bench":      {"bench", "--duration", "50ms"},
	"init-nodes": {"init-nodes"},
}

// secretCommandTail is what comes after the flags of each command.
var secretCommandTail = map[string][]string{
	"run":    {"job", "--", "true"},
	"status": {"job"},
	"break":  {"job"},
}

// No output of lockctl holds a secret of the backend URL: every
// registered scheme, every command that takes a backend, the secret in
// each place, and the URL given by --backend, LOCK_BACKEND and
// --backend-file. The addresses are closed ports, and each call has a
// short deadline: commands fail fast, after they tried the network.
func TestNoOutputHoldsTheURLsSecrets(t *testing.T) {
	t.Cleanup(func() { redistest.WaitForDialers(t) })
	stderrOf := captureStderr(t)
	urls := map[string]map[string]string{"-": schemelessURLs(t)}
	for _, scheme := range lock.Schemes() {
		urls[scheme] = secretURLs(t, scheme)
	}
	dir := t.TempDir()
	type call struct {
		what string
		args []string
		env  map[string]string
	}
	var calls []call
	for scheme, cases := range urls {
		for place, url := range cases {
			file := filepath.Join(dir, fmt.Sprintf("url-%d", len(calls)))
			if err := os.WriteFile(file, []byte("\n  "+url+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			for cmd, args := range secretCommands {
				for _, way := range []string{"--backend", "LOCK_BACKEND", "--backend-file"} {
					c := call{what: fmt.Sprintf("%s, %s, %s via %s", scheme, place, cmd, way), args: append([]string(nil), args...), env: map[string]string{}}
					switch way {
					case "--backend":
						c.args = append(c.args, "--backend", url)
					case "--backend-file":
						c.args = append(c.args, "--backend-file", file)
					default:
						c.env[backendEnv] = url
					}
					c.args = append(c.args, secretCommandTail[cmd]...)
					calls = append(calls, c)
				}
			}
		}
	}
	// Most calls wait on a refused connection or their deadline: many at
	// once.
	work := make(chan call)
	var wg sync.WaitGroup
	for range 128 {
		wg.Go(func() {
			for c := range work {
				ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
				var stdout, stderr lockedBuffer
				code := lockctl(ctx, c.args, &stdout, &stderr, func(k string) string { return c.env[k] })
				cancel()
				for name, out := range map[string]string{"stdout": stdout.String(), "stderr": stderr.String()} {
					if strings.Contains(out, marker) {
						t.Errorf("%s: status %d, %s holds the secret:\n%s", c.what, code, name, out)
					}
				}
			}
		})
	}
	start := time.Now()
	for _, c := range calls {
		work <- c
	}
	close(work)
	wg.Wait()
	t.Logf("%d calls in %v", len(calls), time.Since(start).Round(time.Millisecond))
	if out := stderrOf(); strings.Contains(out, marker) {
		t.Errorf("a library wrote the secret to the process's stderr:\n%s", out)
	} else if out != "" {
		t.Logf("written to the process's stderr meanwhile:\n%s", out)
	}
}
