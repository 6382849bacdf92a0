package main

import (
	crand "crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The command that run starts is never lockctl's direct child: lockctl
// starts a copy of itself, the guard, in a process group of its own, and
// the guard starts the command as the leader of another new group, the
// command's group. Three processes, three groups:
//
//	lockctl          the caller's group: a terminal's ^C and ^Z reach it
//	└─ guard         a group of its own, which nobody signals as a group
//	   └─ command    the command's group, with all it starts
//
//   - lockctl signals the command's group (SIGINT, SIGTERM, SIGHUP, SIGTSTP
//     and SIGCONT it receives; SIGTERM and SIGKILL on its own timeline), so
//     a shell's children are stopped with the shell.
//   - The guard holds the lease's deadline and kills the command's group
//     (SIGKILL) when it passes, whatever state lockctl is in. lockctl
//     tells it the deadline before the command starts and again whenever
//     the lease's Deadline moves (it looks every TTL/10), as an absolute
//     time on CLOCK_BOOTTIME (see bootDeadline).
//   - The guard reads lockctl's deadlines from a pipe whose only write end
//     is lockctl's. When lockctl dies in any way, kill -9 included, the
//     kernel closes it, the guard reads EOF and kills the command's group at
//     once: well before the lock can expire.
//   - When the command's leader exits, the guard kills what it left in its
//     group before reaping it (an unreaped leader keeps the group's id from
//     being reused), then exits with the command's status.
//   - The command also gets the parent-death signal (SIGKILL) for the
//     guard, in case the guard alone is killed.
//
// Why the command never runs past the lease's deadline, whatever lockctl
// does (stopped, starved of CPU, in a long GC pause):
//
//  1. Every deadline lockctl sends is no later than the lease's: lockctl
//     reads CLOCK_BOOTTIME first and the time left to the deadline after
//     it, on Go's monotonic clock (CLOCK_MONOTONIC), so the time between
//     the two readings is taken off, never added; and CLOCK_BOOTTIME
//     advances at least as fast as CLOCK_MONOTONIC (it also counts a
//     suspend). Both clocks are the kernel's, read alike by every process;
//     Go's monotonic readings cannot cross a process boundary.
//  2. The guard waits on the kernel's clock (a timerfd on CLOCK_BOOTTIME,
//     which fires on time after a suspend too), not on lockctl: lockctl can
//     move the deadline only by a message, and it only sends the lease's
//     deadlines. A renewal it has not told the guard about yet leaves the
//     guard on the older, earlier deadline.
//  3. Nothing stops the guard. SIGSTOP and SIGTSTP for lockctl, for its
//     group (^Z) or for the command's group never reach the guard's own
//     group; the guard catches SIGTSTP, SIGTTIN and SIGTTOU, so only a
//     SIGSTOP sent to the guard by hand stops it. Its clock runs while
//     lockctl and the command are stopped, and SIGKILL ends stopped
//     processes too.
//  4. Job control: SIGTSTP to lockctl (^Z) sends SIGTSTP to the command's
//     group, then lockctl stops itself with SIGSTOP (the kernel would
//     discard a SIGTSTP in an orphaned group, and lockctl would then renew
//     the lock for a stopped command). SIGCONT to lockctl (fg, bg, kill
//     -CONT) goes on to the command's group. Nothing renews while lockctl
//     is stopped: if the deadline comes first, the guard kills the
//     command, and lockctl, once continued, reports the loss (status 76).
//
// The deadline comes before the store can expire the lock (package lock
// subtracts a drift allowance), so the command is dead before another
// owner can take the lock.
//
// What remains: a process that leaves the command's group (setsid,
// setpgid, a daemon) escapes all of this; the guard itself must get the
// CPU to kill (it does nothing else); and a command in a group of its own
// is not in the terminal's foreground group, so it does not read from the
// terminal.

// guardEnv marks a process started as the guard. Its value is a nonce,
// 32 hex digits, that lockctl run also writes first on the deadline pipe:
// see startedByLockctl.
const guardEnv = "LOCKCTL_GUARD"

// nonceLen is the length of the guard's nonce, in bytes.
const nonceLen = 16

// The guard's descriptors for its two pipes with lockctl.
const (
	deadlineFD = 3 // lockctl's deadlines: 8 bytes each, see bootDeadline
	reportFD   = 4 // the guard's reports: a kind byte, then 8 bytes
)

// Kinds of the guard's reports to lockctl.
const (
	reportStarted  = 's' // the command runs; the value is its group's id
	reportDeadline = 'd' // the deadline passed: the guard killed the command (or never started it)
)

// isGuard reports whether this process was started as a guard.
func isGuard() bool { return os.Getenv(guardEnv) != "" }

// guardMain runs the command given in args as the leader of a new process
// group, kills that group at the deadline lockctl last sent or when
// lockctl is gone, and returns the command's exit status.
func guardMain(args []string) int {
	nonce := os.Getenv(guardEnv)
	os.Unsetenv(guardEnv)
	if err := startedByLockctl(nonce); err != nil {
		fmt.Fprintf(os.Stderr, "lockctl: %s is lockctl's own variable, set only for the guard that lockctl run starts, and this process was not started so (%s): unset %s and run lockctl again\n", guardEnv, err, guardEnv)
		return exitUsage
	}
	// The parent-death signal is tied to the thread that starts the child:
	// keep this goroutine on its thread for the process's life.
	runtime.LockOSThread()
	syscall.CloseOnExec(deadlineFD) // the command inherits neither pipe
	syscall.CloseOnExec(reportFD)
	deadlines := os.NewFile(deadlineFD, "lockctl deadlines")
	report := os.NewFile(reportFD, "lockctl reports")
	// Stay alive, and running, through the signals that could be sent to
	// this process, to keep the deadline and report the command's status.
	// Caught, not ignored: the command gets them with default handling.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP,
		syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU)
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "lockctl run: guard: no command")
		return exitUsage
	}
	first, err := readDeadline(deadlines)
	if err != nil {
		return exitBackend // lockctl is gone before the command started
	}
	timer, err := newBootTimer(first)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lockctl run: guard: %v\n", err)
		return exitBackend
	}
	// A guard slow to start (a loaded machine) may find the first
	// deadline passed, and later ones that lockctl sent meanwhile after
	// renewals (see startGroup) waiting in the pipe: the latest counts.
	// The command starts only before a deadline lockctl sent.
	for timer.passed() {
		if !pending(deadlineFD) {
			writeReport(report, reportDeadline, 0)
			return exitLost
		}
		d, err := readDeadline(deadlines)
		if err != nil {
			return exitBackend // lockctl is gone
		}
		if err := timer.set(d); err != nil {
			fmt.Fprintf(os.Stderr, "lockctl run: guard: %v\n", err)
			return exitBackend
		}
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "lockctl run: %s\n", show(err.Error()))
		return startFailure(err)
	}
	pgid := cmd.Process.Pid
	writeReport(report, reportStarted, int64(pgid))

	var mu sync.Mutex
	reaped := false     // the leader is reaped: pgid may name another group
	atDeadline := false // the guard killed the group at the deadline
	kill := func(deadline bool) {
		mu.Lock()
		defer mu.Unlock()
		if !reaped {
			syscall.Kill(-pgid, syscall.SIGKILL)
			atDeadline = atDeadline || deadline
		}
	}
	go func() {
		for {
			d, err := readDeadline(deadlines)
			if err != nil { // lockctl is gone
				kill(false)
				return
			}
			if err := timer.set(d); err != nil {
				kill(true) // no clock to keep the deadline by
				return
			}
		}
	}()
	go func() {
		timer.wait()
		kill(true)
	}()

	// The leader exited (not reaped yet): kill what it left behind.
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, pgid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	mu.Lock()
	syscall.Kill(-pgid, syscall.SIGKILL)
	reaped = true
	killed := atDeadline
	mu.Unlock()
	cmd.Wait()
	if killed {
		writeReport(report, reportDeadline, 0)
	}
	return exitStatus(cmd.ProcessState)
}

// startedByLockctl checks that this process is a guard that lockctl run
// started (startGroup), before it runs anything: descriptors 3 and 4 are
// pipes, the parent process runs this very executable, and the deadline
// pipe starts with nonce, the value of LOCKCTL_GUARD. A LOCKCTL_GUARD left
// set in a user's environment fails the first checks and nothing is read
// from any descriptor.
func startedByLockctl(nonce string) error {
	want, err := hex.DecodeString(nonce)
	if err != nil || len(want) != nonceLen {
		return errors.New("its value is not lockctl's")
	}
	for _, fd := range []int{deadlineFD, reportFD} {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			return fmt.Errorf("descriptor %d is not a pipe from lockctl", fd)
		}
	}
	self, err := os.Stat("/proc/self/exe")
	if err != nil {
		return err
	}
	// A parent this process may not look into (not dumpable) leaves the
	// nonce to tell.
	parent, err := os.Stat(fmt.Sprintf("/proc/%d/exe", os.Getppid()))
	if err != nil && !errors.Is(err, fs.ErrPermission) || err == nil && !os.SameFile(self, parent) {
		return errors.New("the parent process is not lockctl")
	}
	// lockctl writes the nonce before it starts the guard.
	if !pending(deadlineFD) {
		return errors.New("no word from lockctl on descriptor 3")
	}
	// Read with the system call: an os.File would close the descriptor
	// when collected, and guardMain opens its own.
	got := make([]byte, nonceLen)
	for n := 0; n < nonceLen; {
		m, err := unix.Read(deadlineFD, got[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || m <= 0 {
			return errors.New("descriptor 3 does not carry lockctl's nonce")
		}
		n += m
	}
	if subtle.ConstantTimeCompare(got, want) != 1 {
		return errors.New("descriptor 3 does not carry lockctl's nonce")
	}
	return nil
}

// pending reports whether fd has bytes to read now.
func pending(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&unix.POLLIN != 0
}

// startFailure is the shell's status for a command that could not start:
// 127 when it was not found, 126 when it could not be executed.
func startFailure(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return exitNotFound
	}
	return exitCannotExec
}

// exitStatus is a finished child's status as lockctl reports it: its exit
// code, or 128+signal when a signal ended it.
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return exitBackend
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// bootClock reads CLOCK_BOOTTIME, in nanoseconds.
func bootClock() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, fmt.Errorf("reading CLOCK_BOOTTIME: %w", err)
	}
	return ts.Nano(), nil
}

// bootDeadline is the lease deadline d as an absolute CLOCK_BOOTTIME time,
// never later than d: the clock is read before the time left to d is
// measured (point 1 above). When the clock cannot be read it is 0, a
// deadline long past.
func bootDeadline(d time.Time) int64 {
	now, err := bootClock()
	if err != nil {
		return 0
	}
	return now + int64(time.Until(d))
}

// readDeadline reads one deadline from lockctl.
func readDeadline(r io.Reader) (int64, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return int64(binary.BigEndian.Uint64(b[:])), nil
}

// writeReport writes one report to lockctl. A failure means lockctl is
// gone, and then nobody needs it.
func writeReport(w io.Writer, kind byte, value int64) {
	b := binary.BigEndian.AppendUint64([]byte{kind}, uint64(value))
	w.Write(b)
}

// readReport reads one report from the guard.
func readReport(r io.Reader) (kind byte, value int64, err error) {
	var b [9]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, 0, err
	}
	return b[0], int64(binary.BigEndian.Uint64(b[1:])), nil
}

// bootTimer is the guard's deadline: a timerfd on CLOCK_BOOTTIME, armed at
// an absolute time. Go's timers count CLOCK_MONOTONIC, which stops during
// a suspend; the kernel fires this one on time after a resume too.
type bootTimer struct {
	fd int
	f  *os.File // fd, read through Go's poller

	mu sync.Mutex
	at int64 // the deadline: CLOCK_BOOTTIME nanoseconds
}

// newBootTimer returns a timer armed at at.
func newBootTimer(at int64) (*bootTimer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_BOOTTIME, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating a CLOCK_BOOTTIME timer for the lock's deadline: %w", err)
	}
	t := &bootTimer{fd: fd, f: os.NewFile(uintptr(fd), "lock deadline")}
	if err := t.set(at); err != nil {
		t.f.Close()
		return nil, err
	}
	return t, nil
}

// set moves the deadline to at, later or earlier: lockctl's last word
// counts.
func (t *bootTimer) set(at int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.at = at
	// A zero time disarms a timerfd; a deadline at or before the clock's
	// zero has passed, as its first nanosecond has.
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(at, 1))}
	if err := unix.TimerfdSettime(t.fd, unix.TFD_TIMER_ABSTIME, &spec, nil); err != nil {
		return fmt.Errorf("arming the lock's deadline: %w", err)
	}
	return nil
}

// passed reports whether the deadline has passed (or the clock cannot be
// read).
func (t *bootTimer) passed() bool {
	t.mu.Lock()
	at := t.at
	t.mu.Unlock()
	now, err := bootClock()
	return err != nil || now >= at
}

// wait returns once the deadline has passed: the timer fired, and was not
// moved later meanwhile. It also returns when the timer cannot be read.
func (t *bootTimer) wait() {
	var b [8]byte
	for {
		if _, err := t.f.Read(b[:]); err != nil || t.passed() {
			return
		}
	}
}

// group is a started guard and the command's process group.
type group struct {
	cmd       *exec.Cmd
	deadlines *os.File // lockctl's end; closing it makes the guard kill the command
	pgid      int      // the command's group; 0 when the command did not start
	told      time.Time
	exited    chan guardExit
}

// guardExit is how the guard ended.
type guardExit struct {
	status     int  // the guard's exit status: the command's
	atDeadline bool // the guard killed the command at the deadline it was told
}

// startGroup starts the guard, which starts command in a new process
// group once it has a deadline, the lease's (deadline reads it);
// startGroup returns when the command runs, or could not start. Until
// then it tells the guard each later deadline (the lease renews
// meanwhile), so that a guard slow to start finds one that has not passed.
func startGroup(command []string, env []string, stdin io.Reader, stdout, stderr io.Writer, deadline func() time.Time) (*group, error) {
	// The guard runs the very file this process runs, even when it was
	// replaced or removed since: the guard checks that its parent runs the
	// same executable.
	const self = "/proc/self/exe"
	if _, err := os.Stat(self); err != nil {
		return nil, fmt.Errorf("finding lockctl's own executable to start the command under: %w", err)
	}
	var nonce [nonceLen]byte
	crand.Read(nonce[:])
	if _, err := bootClock(); err != nil {
		return nil, fmt.Errorf("the guard needs the system's boot-time clock: %w", err)
	}
	dr, dw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer dr.Close()
	rr, rw, err := os.Pipe()
	if err != nil {
		dw.Close()
		return nil, err
	}
	g := &group{deadlines: dw, exited: make(chan guardExit, 1)}
	// Before the guard starts: the nonce that it checks first, and a
	// deadline, without which it does not start the command.
	_, err = dw.Write(nonce[:])
	if err == nil {
		err = g.tell(deadline())
	}
	if err != nil {
		dw.Close()
		rr.Close()
		rw.Close()
		return nil, fmt.Errorf("telling the guard the lock's deadline: %w", err)
	}
	cmd := exec.Command(self, command...)
	cmd.Args[0] = "lockctl-guard"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.Env = append(env, guardEnv+"="+hex.EncodeToString(nonce[:]))
	cmd.ExtraFiles = []*os.File{dr, rw} // descriptors 3 and 4 in the guard
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// When the output is copied (not a file), a process that left the
	// command's group may hold the copy open: Wait gives up on it after
	// this.
	cmd.WaitDelay = time.Second
	err = cmd.Start()
	rw.Close() // the guard's now: EOF on rr when the guard is gone
	if err != nil {
		dw.Close()
		rr.Close()
		return nil, err
	}
	g.cmd = cmd
	stopTelling, told := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(told)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopTelling:
				return
			case <-t.C:
				if d := deadline(); d.After(g.told) && g.tell(d) != nil {
					return
				}
			}
		}
	}()
	kind, value, err := readReport(rr)
	close(stopTelling)
	<-told
	atDeadline := false
	switch {
	case err != nil: // the command did not start; the guard said why
	case kind == reportStarted:
		g.pgid = int(value)
	case kind == reportDeadline:
		atDeadline = true
	}
	go func() {
		for {
			kind, _, err := readReport(rr)
			if err != nil {
				break
			}
			atDeadline = atDeadline || kind == reportDeadline
		}
		rr.Close()
		cmd.Wait()
		g.exited <- guardExit{exitStatus(cmd.ProcessState), atDeadline}
	}()
	return g, nil
}

// tell sends the guard the lease's deadline d.
func (g *group) tell(d time.Time) error {
	g.told = d
	_, err := g.deadlines.Write(binary.BigEndian.AppendUint64(nil, uint64(bootDeadline(d))))
	return err
}

// signal sends sig to every process of the command's group.
func (g *group) signal(sig syscall.Signal) {
	if g.pgid > 0 {
		syscall.Kill(-g.pgid, sig)
	}
}

// close lets the guard go. A guard still running then kills the
// command's group; one that exited killed it before it did. (lockctl does
// not kill the group itself here: once the guard has reaped the leader,
// the group's id may come to name another group.)
func (g *group) close() {
	g.deadlines.Close()
}
