package serverproc_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/distlock/lock/conformance/serverproc"
)

// serveArg makes the test binary a line-echo server on the given port: the
// server process of these tests.
const serveArg = "-serverproc.echo="

// forkArg makes the test binary a server of two processes: it listens on
// the port and starts a child of itself (childArg) that serves the
// connections on the inherited listener, as a server with a process per
// connection does; the parent only waits.
const (
	forkArg  = "-serverproc.fork="
	childArg = "-serverproc.child"
	failArg  = "-serverproc.fail"
)

// setsidArg, after forkArg's port, makes the child leave the server's
// process group and session (setsid) before it serves, as PostgreSQL's
// backends do.
const setsidArg = "-serverproc.setsid"

func TestMain(m *testing.M) {
	for _, a := range os.Args[1:] {
		if port, ok := strings.CutPrefix(a, serveArg); ok {
			echo(listen(port))
			return
		}
		if port, ok := strings.CutPrefix(a, forkArg); ok {
			fmt.Println("server starting") // written before the port listens
			fork(listen(port), slices.Contains(os.Args, setsidArg))
			return
		}
		if a == childArg {
			if slices.Contains(os.Args, setsidArg) {
				if _, err := syscall.Setsid(); err != nil {
					fmt.Fprintln(os.Stderr, "setsid:", err)
					os.Exit(1)
				}
			}
			ln, err := net.FileListener(os.NewFile(3, "listener"))
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			echo(ln)
			return
		}
		if a == failArg {
			fmt.Fprintln(os.Stderr, "FATAL: pre-existing shared memory block is still in use")
			os.Exit(3)
		}
	}
	os.Exit(m.Run())
}

func listen(port string) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return ln
}

// fork serves ln from a child process and waits for it; with setsid the
// child calls setsid before it serves.
func fork(ln net.Listener, setsid bool) {
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ln.Close() // the child serves; the parent answers nothing
	cmd := exec.Command(os.Args[0], childArg)
	if setsid {
		cmd.Args = append(cmd.Args, setsidArg)
	}
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("child %d\n", cmd.Process.Pid)
	cmd.Wait()
	select {} // a parent that outlives its child, as a postmaster does
}

func echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				fmt.Fprint(c, line)
			}
		}()
	}
}

// ask sends a line and waits for its echo, up to d.
func ask(addr string, d time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	if _, err := fmt.Fprintln(c, "ping"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return fmt.Errorf("echo %q", line)
	}
	return nil
}

func TestStopContinueKillRestart(t *testing.T) {
	p := serverproc.Start(t, []string{os.Args[0], serveArg + serverproc.PortPlaceholder})
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a started server: %v", err)
	}
	p.Stop()
	if err := ask(p.Addr, 300*time.Millisecond); err == nil {
		t.Fatal("a stopped server answered")
	}
	p.Continue()
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a continued server: %v", err)
	}
	p.Kill()
	if p.Running() {
		t.Fatal("Running after Kill")
	}
	if err := ask(p.Addr, time.Second); err == nil {
		t.Fatal("a killed server answered")
	}
	p.Restart()
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a restarted server on the same port: %v", err)
	}
}

// A server of several processes (a parent and the child that answers)
// hangs, answers again and dies as a whole: Stop, Continue and Kill
// signal its process group. With signals to the main process alone, the
// child answers while "stopped" and keeps the port after Kill.
func TestSignalsReachTheWholeGroup(t *testing.T) {
	var cleaned []string
	p := serverproc.Start(t, []string{os.Args[0], forkArg + serverproc.PortPlaceholder},
		serverproc.Options{AfterKill: func(dir string) error { cleaned = append(cleaned, dir); return nil }})
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a started server: %v", err)
	}
	p.Stop()
	if err := ask(p.Addr, 300*time.Millisecond); err == nil {
		t.Fatal("the child of a stopped server answered")
	}
	p.Continue()
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a continued server: %v", err)
	}
	child := childPid(t, p)
	p.Kill()
	if err := ask(p.Addr, time.Second); err == nil {
		t.Fatal("the child of a killed server answered")
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(child)); err == nil {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(child) + "/stat"); !strings.Contains(string(b), ") Z") {
			t.Fatalf("the child %d of a killed server still runs: %s", child, b)
		}
	}
	if len(cleaned) != 1 || cleaned[0] != p.Dir() {
		t.Fatalf("AfterKill ran with %q; want once, with %q", cleaned, p.Dir())
	}
	p.Restart() // after Kill: starts it again
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a server restarted after Kill: %v", err)
	}
}

// A child that left the server's process group and session (setsid, as
// PostgreSQL's backends do) hangs, answers again and dies with the
// server too: Stop, Continue and Kill reach the main process's
// descendants. With signals to the group alone, the child answers while
// "stopped" and outlives Kill, keeping the port.
func TestSignalsReachDescendantsThatLeftTheGroup(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc to find the server's descendants")
	}
	p := serverproc.Start(t, []string{os.Args[0], forkArg + serverproc.PortPlaceholder, setsidArg})
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a started server: %v", err)
	}
	child := childPid(t, p)
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) }) // should the test fail
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(child) + "/stat")
	if _, after, _ := strings.Cut(string(b), ") "); len(strings.Fields(after)) < 3 || strings.Fields(after)[2] != strconv.Itoa(child) {
		t.Fatalf("the child %d did not call setsid (it does not lead its own process group): %s", child, b)
	}
	for round := range 2 {
		p.Stop()
		if err := ask(p.Addr, 300*time.Millisecond); err == nil {
			t.Fatalf("round %d: the child of a stopped server, which left its group, answered", round)
		}
		p.Continue()
		if err := ask(p.Addr, 5*time.Second); err != nil {
			t.Fatalf("round %d: a continued server: %v", round, err)
		}
	}
	p.Kill()
	if err := ask(p.Addr, time.Second); err == nil {
		t.Fatal("the child of a killed server, which left its group, answered")
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(child) + "/stat"); err == nil && !strings.Contains(string(b), ") Z") {
		t.Fatalf("the child %d of a killed server, which left its group, still runs: %s", child, b)
	}
	p.Restart()
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a server restarted after Kill: %v", err)
	}
}

// childPid reads the child's pid that the forking server printed.
func childPid(t *testing.T, p *serverproc.Process) int {
	t.Helper()
	b, err := os.ReadFile(p.Log())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if s, ok := strings.CutPrefix(line, "child "); ok {
			pid, err := strconv.Atoi(s)
			if err == nil {
				return pid
			}
		}
	}
	t.Fatalf("no child pid in the server's log:\n%s", b)
	return 0
}

// fatalTB records a Start's failure instead of failing the test.
type fatalTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

// startFails runs Start (or Restart through it) under a fatalTB and
// returns its failure message, and how long it took.
func startFails(t *testing.T, run func(tb testing.TB)) (string, time.Duration) {
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	began := time.Now()
	go func() {
		defer close(done)
		run(f)
	}()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.msg, time.Since(began)
}

// A server that exits before it is ready fails Start at once, with its
// exit status and its output, not after the ready timeout; so does a
// Restart whose new server exits.
func TestEarlyExitFailsAtOnceWithTheOutput(t *testing.T) {
	msg, took := startFails(t, func(tb testing.TB) {
		serverproc.Start(tb, []string{os.Args[0], failArg}, serverproc.Options{ReadyTimeout: time.Minute})
	})
	if !strings.Contains(msg, "exited before it was ready") || !strings.Contains(msg, "exit status 3") ||
		!strings.Contains(msg, "pre-existing shared memory block is still in use") || took > 20*time.Second {
		t.Fatalf("Start of a server that exits at once: %q after %v; want its exit status and output, well before the 1m ready timeout", msg, took)
	}
	// A Restart whose new server cannot listen (a process outside the
	// server's group took the port meanwhile) exits: Restart says so.
	var squatter net.Listener
	defer func() {
		if squatter != nil {
			squatter.Close()
		}
	}()
	msg, _ = startFails(t, func(tb testing.TB) {
		echoes := func(addr string) bool { return ask(addr, 200*time.Millisecond) == nil } // not the squatter
		p := serverproc.Start(tb, []string{os.Args[0], serveArg + serverproc.PortPlaceholder}, serverproc.Options{ReadyTimeout: time.Minute, Ready: echoes})
		p.Kill()
		var err error
		if squatter, err = net.Listen("tcp", p.Addr); err != nil {
			tb.Fatalf("taking the port: %v", err)
		}
		p.Restart()
	})
	if !strings.Contains(msg, "exited before it was ready") || !strings.Contains(msg, "address already in use") {
		t.Fatalf("Restart of a server that cannot listen: %q; want its exit and its error", msg)
	}
}

// The server's output goes to Log(), over its restarts.
func TestOutputGoesToTheLog(t *testing.T) {
	p := serverproc.Start(t, []string{os.Args[0], forkArg + serverproc.PortPlaceholder})
	p.Restart()
	b, err := os.ReadFile(p.Log())
	if err != nil || filepath.Dir(p.Log()) != p.Dir() || strings.Count(string(b), "--- serverproc:") != 2 || strings.Count(string(b), "server starting\n") != 2 {
		t.Fatalf("the log %s after a restart: %v\n%s\nwant two starts, each with the server's first line", p.Log(), err, b)
	}
}

// Options.User runs the server as another user.
func TestRunsAsAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a process as another user")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	// The test binary, where nobody can run it.
	dir, err := os.MkdirTemp("", "serverproc-user")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "server")
	b, err := os.ReadFile(os.Args[0])
	if err == nil {
		err = os.WriteFile(bin, b, 0o755)
	}
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	p := serverproc.Start(t, []string{bin, serveArg + serverproc.PortPlaceholder}, serverproc.Options{User: "nobody"})
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a server run as nobody: %v", err)
	}
	pid := serverPid(t, p)
	b, err = os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			if f[1] != nobody.Uid {
				t.Fatalf("the server runs as uid %s; want nobody's %s", f[1], nobody.Uid)
			}
			return
		}
	}
	t.Fatalf("no Uid line in %s", b)
}

// serverPid finds the pid of the process that listens on p's port.
func serverPid(t *testing.T, p *serverproc.Process) int {
	t.Helper()
	out, err := exec.Command("sh", "-c", "ss -Hltnp 'sport = :"+strconv.Itoa(p.Port)+"' | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2").Output()
	pid, aerr := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || aerr != nil {
		t.Fatalf("the pid listening on %d: %v %q", p.Port, err, out)
	}
	return pid
}

// orphanEnv makes TestServerDiesWithItsTest's child start a server and
// wait to be killed.
const orphanEnv = "SERVERPROC_TEST_ORPHAN"

// TestServerDiesWithItsTest kills a test process (a child of this one)
// that started a server: the server must not outlive it.
func TestServerDiesWithItsTest(t *testing.T) {
	if os.Getenv(orphanEnv) != "" {
		p := serverproc.Start(t, []string{os.Args[0], serveArg + serverproc.PortPlaceholder})
		fmt.Printf("addr %s\n", p.Addr)
		select {} // until killed
	}
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerDiesWithItsTest$")
	cmd.Env = append(os.Environ(), orphanEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var addr string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "addr "); ok {
			addr = a
			break
		}
	}
	if addr == "" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("the child test started no server")
	}
	if err := ask(addr, time.Second); err != nil {
		t.Fatalf("the child's server does not answer: %v", err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	for deadline := time.Now().Add(5 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return // gone with its test
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("the server on %s still answers 5s after its test process was killed", addr)
		}
		time.Sleep(10 * time.Millisecond) // poll until the kernel tore it down
	}
}
