// Package serverproc runs a store's server as a process of its own for a
// test: on a free loopback port, stopped and resumed with SIGSTOP and
// SIGCONT (a server that hangs), killed with SIGKILL (a crash), and
// restarted on the same port and arguments (a restart; whether it keeps its
// data is the server's and its arguments' business). It is for backend
// authors writing a conformance harness (see package conformance), and
// works on Unix-like systems.
//
// The server runs in a process group of its own, and Stop, Continue and
// Kill signal the whole group and, on Linux, every descendant of the main
// process found through /proc, also those that left the group (setsid):
// a server with a process per connection (PostgreSQL, whose backends call
// setsid) or helper processes hangs, answers again and dies as a whole.
// Its standard output and error go to Log(), a file in its
// directory, whose end a failing test shows. A server that exits while
// Start or Restart waits for it to get ready fails the test at once,
// saying how it exited and what it printed.
//
// Ready defaults to dialing the port. A server that accepts connections
// before it can serve (PostgreSQL while it starts up or recovers: it
// accepts and then answers "the database system is starting up") needs a
// Ready that asks it a real question.
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
	"os/user"
	"path/filepath"
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
	// User, when set, runs the server as that user (a name or a numeric
	// uid; its primary group too), for servers that refuse to run as root
	// (PostgreSQL). It needs a test run as root, and Dir must be writable
	// by the user (Start makes a default Dir so).
	User string
	// AfterKill, when set, runs after every Kill (and so after the
	// server's end at the end of the test, and before Restart starts it
	// again), to free what a killed server leaves behind: shared memory
	// segments, lock or pid files in Dir. Its error fails the test.
	AfterKill func(dir string) error
}

// Process is a server process started by Start.
type Process struct {
	// Addr is host:port on the loopback interface; Port the port.
	Addr string
	Port int

	t    testing.TB
	argv []string
	opts Options

	log string // Log()

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil while killed
	exited chan struct{} // closed when cmd has exited (waited for)
	status error         // cmd.Wait's, once exited is closed
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
	if o.Dir == "" && o.User != "" {
		// A directory the user can reach and write in: t.TempDir's
		// parent is the test's alone.
		dir, err := os.MkdirTemp("", "serverproc-")
		if err == nil {
			err = os.Chmod(dir, 0o777)
		}
		if err != nil {
			t.Fatalf("serverproc: a directory for user %s: %v", o.User, err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		o.Dir = dir
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
	p := &Process{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, t: t, argv: argv, opts: o,
		log: filepath.Join(o.Dir, "serverproc.log")}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("serverproc: the end of %s's output (%s):\n%s", p, p.log, p.tail())
		}
	})
	p.start()
	return p
}

// Log is the file that receives the server's standard output and error,
// over all its starts.
func (p *Process) Log() string { return p.log }

// tail returns the last lines of the log, at most 4 KB.
func (p *Process) tail() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// credential returns the credential of Options.User.
func credential(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if u, err = user.LookupId(name); err != nil {
			return nil, fmt.Errorf("user %q: %w", name, err)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user %q: uid %q, gid %q are not numbers", name, u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
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
	// A group of its own: a signal to the test's group does not reach
	// it, and the package's signals reach every process of the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	dieWithParent(cmd.SysProcAttr)
	if p.opts.User != "" {
		cred, err := credential(p.opts.User)
		if err != nil {
			p.t.Fatalf("serverproc: starting %v: %v", args, err)
		}
		cmd.SysProcAttr.Credential = cred
	}
	log, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		p.t.Fatalf("serverproc: starting %v: its log: %v", args, err)
	}
	defer log.Close() // the process has its own copy
	fmt.Fprintf(log, "--- serverproc: %s: starting %q\n", time.Now().Format(time.RFC3339Nano), args)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("serverproc: starting %v: %v", args, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.status = err
		p.mu.Unlock()
		close(exited)
	}()
	deadline := time.Now().Add(p.opts.ReadyTimeout)
	for !p.opts.Ready(p.Addr) {
		select {
		case <-exited:
			p.mu.Lock()
			status := p.status
			p.mu.Unlock()
			p.Kill()
			p.t.Fatalf("serverproc: %v exited before it was ready on %s (%v); the end of its output (%s):\n%s", args, p.Addr, status, p.log, p.tail())
		default:
		}
		if time.Now().After(deadline) {
			p.Kill()
			p.t.Fatalf("serverproc: %v not ready on %s within %v; the end of its output (%s):\n%s", args, p.Addr, p.opts.ReadyTimeout, p.log, p.tail())
		}
		time.Sleep(10 * time.Millisecond) // poll until the server answers
	}
}

// mainPid returns the server's main process id, or 0 when it is not running.
func (p *Process) mainPid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Stop suspends the server with SIGSTOP: connections are accepted by the
// kernel, nothing is answered, until Continue. It stops the main process
// first, so that it forks nothing new, then its process group and every
// descendant of the main process (on Linux, from /proc: also those that
// left the group, as PostgreSQL's backends do), and returns once all of
// them are stopped (a signal is delivered asynchronously). Where there is
// no /proc it signals the group and returns.
func (p *Process) Stop() {
	if pid := p.mainPid(); pid != 0 {
		stopAll(pid)
	}
}

// stopAll stops the server whose main process is pid (see Stop) and
// returns the processes it stopped, main included; nil where there is no
// /proc.
func stopAll(pid int) map[int]byte {
	syscall.Kill(pid, syscall.SIGSTOP)
	// The main process first: once it is stopped, nothing it forks can
	// escape the walk below.
	waitUntil(func() bool {
		m := members(pid)
		st, ok := m[pid]
		return m == nil || !ok || stopped(st)
	})
	syscall.Kill(-pid, syscall.SIGSTOP)
	var last map[int]byte
	waitUntil(func() bool {
		last = members(pid)
		done := true
		for q, st := range last {
			if !stopped(st) {
				// Again and again: one that a descendant forked
				// meanwhile shows up in the next walk.
				syscall.Kill(q, syscall.SIGSTOP)
				done = false
			}
		}
		return done
	})
	return last
}

// Continue resumes a stopped server with SIGCONT, in the reverse order of
// Stop: the descendants of the main process and its process group first,
// the main process last. On Linux it returns once none of them is
// stopped.
func (p *Process) Continue() {
	pid := p.mainPid()
	if pid == 0 {
		return
	}
	for q := range members(pid) {
		if q != pid {
			syscall.Kill(q, syscall.SIGCONT)
		}
	}
	syscall.Kill(pid, syscall.SIGCONT)
	syscall.Kill(-pid, syscall.SIGCONT) // where there is no /proc
	waitUntil(func() bool {
		done := true
		for q, st := range members(pid) {
			if stopped(st) {
				syscall.Kill(q, syscall.SIGCONT)
				done = false
			}
		}
		return done
	})
}

func stopped(state byte) bool { return state == 'T' || state == 't' }

// waitUntil polls cond, up to a second, until it holds.
func waitUntil(cond func() bool) {
	for deadline := time.Now().Add(time.Second); !cond() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // poll /proc until the signals took effect
	}
}

// Kill kills the server with SIGKILL, as a crash would: it stops it first
// (see Stop), so that no process forks another meanwhile, then kills the
// main process, its process group and every descendant of the main
// process (also those that left the group: setsid), reaps the main
// process, waits (on Linux, up to 5s) until none of them runs, and runs
// Options.AfterKill. It is idempotent; Restart after Kill starts the
// server again. A process that a descendant started and that left the
// server before Kill (its parent exited, so that it no longer descends
// from the main process) is not found: free it in AfterKill.
func (p *Process) Kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	pid := cmd.Process.Pid
	all := stopAll(pid)
	syscall.Kill(-pid, syscall.SIGKILL)
	cmd.Process.Kill() // the main process, should it have left the group
	for q := range all {
		syscall.Kill(q, syscall.SIGKILL)
	}
	<-exited
	waitGone(pid, all)
	if p.opts.AfterKill != nil {
		if err := p.opts.AfterKill(p.opts.Dir); err != nil {
			p.t.Errorf("serverproc: cleaning up after %s: %v", p, err)
		}
	}
}

// Restart kills the server (when it runs) and starts it again with the
// same arguments, on the same port and in the same directory, and waits
// until it is ready. It fails the test at once when the new server exits
// before it is ready (a server that finds what its killed predecessor left
// behind, say: see Options.AfterKill).
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

// waitGone waits, up to 5s, until /proc shows no live process (other
// than a zombie) in process group pgid, nor any of the processes in pids:
// a SIGKILL is delivered asynchronously, and a process of a server that
// still runs holds its port and files. Where there is no /proc it returns
// at once.
func waitGone(pgid int, pids map[int]byte) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		table := procs()
		left := false
		for q, pr := range table {
			if _, ok := pids[q]; (ok || pr.pgrp == pgid) && pr.live() {
				left = true
			}
		}
		if !left {
			return
		}
		time.Sleep(5 * time.Millisecond) // poll /proc until the kernel tore them down
	}
}

// proc is what /proc/PID/stat says of a process.
type proc struct {
	state      byte // 'R', 'S', 'T', 'Z', ...
	ppid, pgrp int
}

func (p proc) live() bool { return p.state != 'Z' && p.state != 'X' }

// procs reads every process's state, parent and process group from
// /proc; nil where there is no /proc.
func procs() map[int]proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	table := map[int]proc{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// After the command name in parentheses: state, ppid, pgrp.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 {
			continue
		}
		ppid, err1 := strconv.Atoi(f[1])
		pgrp, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			continue
		}
		table[pid] = proc{state: f[0][0], ppid: ppid, pgrp: pgrp}
	}
	return table
}

// members returns the state of every live process (not a zombie) of the
// server whose main process is pid: pid itself, the processes of its
// process group, and every descendant of pid, following parent links, also
// those that left the group (setsid). It is an empty map when none is
// left, nil where there is no /proc.
func members(pid int) map[int]byte {
	table := procs()
	if table == nil {
		return nil
	}
	children := map[int][]int{}
	for q, pr := range table {
		children[pr.ppid] = append(children[pr.ppid], q)
	}
	in := map[int]bool{}
	for q, pr := range table {
		if pr.pgrp == pid {
			in[q] = true
		}
	}
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		q := queue[0]
		if _, ok := table[q]; ok {
			in[q] = true
		}
		queue = append(queue, children[q]...)
	}
	m := map[int]byte{}
	for q := range in {
		if table[q].live() {
			m[q] = table[q].state
		}
	}
	return m
}
