// Package serverproc runs a store's server as a process of its own for a
// test: on a free loopback port, stopped and resumed with SIGSTOP and
// SIGCONT (a server that hangs), killed with SIGKILL (a crash), and
// restarted on the same port and arguments (a restart; whether it keeps its
// data is the server's and its arguments' business). It is for backend
// authors writing a conformance harness (see package conformance), and
// works on Unix-like systems.
//
//	p := serverproc.Start(t, []string{"redis-server", "--port", "{port}", "--save", ""})
//	rdb := goredis.NewClient(&goredis.Options{Addr: p.Addr})
//	p.Stop()     // the server hangs
//	p.Continue() // and answers again
//	p.Restart()  // kill -9 and start again
package serverproc

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PortPlaceholder in an argument is replaced by the process's port.
const PortPlaceholder = "{port}"

// Options of Start.
type Options struct {
	// Ready reports whether the server answers; the default dials Addr.
	Ready func(addr string) bool
	// ReadyTimeout bounds the wait for Ready after each start; default 30s.
	ReadyTimeout time.Duration
	// Dir is the working directory; default a new t.TempDir().
	Dir string
	// Env is added to the process's environment.
	Env []string
}

// Process is a server process started by Start.
type Process struct {
	// Addr is host:port on the loopback interface; Port the port.
	Addr string
	Port int

	t    testing.TB
	argv []string
	opts Options

	mu  sync.Mutex
	cmd *exec.Cmd // nil while killed
}

// Start starts argv with every PortPlaceholder replaced by a free loopback
// port, waits until the server is ready, and kills it at the end of the
// test. It fails the test when the process cannot start or never gets
// ready.
func Start(t testing.TB, argv []string, opts ...Options) *Process {
	t.Helper()
	if len(argv) == 0 {
		t.Fatal("serverproc: no command")
	}
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 30 * time.Second
	}
	if o.Ready == nil {
		o.Ready = dials
	}
	port := freePort(t)
	p := &Process{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, t: t, argv: argv, opts: o}
	p.start()
	t.Cleanup(p.Kill)
	return p
}

func dials(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before the server binds it; on these test machines that is rare.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("serverproc: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (p *Process) start() {
	p.t.Helper()
	args := make([]string, len(p.argv))
	for i, a := range p.argv {
		args[i] = strings.ReplaceAll(a, PortPlaceholder, strconv.Itoa(p.Port))
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = p.opts.Dir
	cmd.Env = append(os.Environ(), p.opts.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a signal to the test's group does not reach it
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("serverproc: starting %v: %v", args, err)
	}
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	deadline := time.Now().Add(p.opts.ReadyTimeout)
	for !p.opts.Ready(p.Addr) {
		if time.Now().After(deadline) {
			p.Kill()
			p.t.Fatalf("serverproc: %v not ready on %s within %v", args, p.Addr, p.opts.ReadyTimeout)
		}
		time.Sleep(10 * time.Millisecond) // poll until the server answers
	}
}

func (p *Process) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.cmd.Process.Signal(sig)
	}
}

// Stop suspends the server with SIGSTOP: connections are accepted by the
// kernel, nothing is answered, until Continue. On Linux it returns once the
// process is stopped (a signal is delivered asynchronously).
func (p *Process) Stop() {
	p.signal(syscall.SIGSTOP)
	p.waitState(true)
}

// Continue resumes a stopped server with SIGCONT; on Linux it returns once
// the process runs again.
func (p *Process) Continue() {
	p.signal(syscall.SIGCONT)
	p.waitState(false)
}

// waitState waits, up to a second, until /proc says the process is stopped
// (or not). Where there is no /proc it returns at once.
func (p *Process) waitState(stopped bool) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	path := fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		// The state follows the command name, which is in parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) {
			return
		}
		if isStopped := b[i+2] == 'T'; isStopped == stopped {
			return
		}
		time.Sleep(time.Millisecond) // poll /proc until the signal took effect
	}
}

// Kill kills the server with SIGKILL, as a crash would, and reaps it. It is
// idempotent.
func (p *Process) Kill() {
	p.mu.Lock()
	cmd := p.cmd
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies too, but say so
	cmd.Process.Kill()
	cmd.Wait()
}

// Restart kills the server and starts it again with the same arguments, on
// the same port and in the same directory, and waits until it is ready.
func (p *Process) Restart() {
	p.t.Helper()
	p.Kill()
	p.start()
}

// Running reports whether the process is up (started and not killed).
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// Dir is the process's working directory, where it may keep its data and
// logs.
func (p *Process) Dir() string { return p.opts.Dir }

// String describes the process for messages.
func (p *Process) String() string { return fmt.Sprintf("%s on %s", p.argv[0], p.Addr) }
