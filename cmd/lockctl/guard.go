package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"
)

// The command that run starts is never lockctl's direct child: lockctl
// starts a copy of itself, the guard, as the leader of a new process group,
// and the guard starts the command in that group.
//
//   - lockctl signals the whole group (SIGINT, SIGTERM, SIGHUP it receives;
//     SIGTERM and SIGKILL on its own timeline), so a shell's children are
//     stopped with the shell.
//   - The guard holds the read end of a pipe whose only write end is
//     lockctl's. When lockctl dies in any way, kill -9 included, the kernel
//     closes it, the guard reads EOF and kills the whole group with
//     SIGKILL at once: well before the lock can expire.
//   - The command also gets the parent-death signal (SIGKILL) for the
//     guard, in case the guard alone is killed.
//
// What remains: a process that leaves the group (setsid, setpgid, a daemon)
// escapes all of this; and a command in a group of its own is not in the
// terminal's foreground group, so it does not read from the terminal.

// guardEnv marks a process started as the guard; its value is the command's
// exit status when it cannot be started (unused otherwise).
const guardEnv = "LOCKCTL_GUARD"

// guardFD is the guard's descriptor for the pipe from lockctl.
const guardFD = 3

// isGuard reports whether this process was started as a guard.
func isGuard() bool { return os.Getenv(guardEnv) != "" }

// guardMain runs the command given in args in this process's group and
// returns its exit status.
func guardMain(args []string) int {
	os.Unsetenv(guardEnv)
	// The parent-death signal is tied to the thread that starts the child:
	// keep this goroutine on its thread for the process's life.
	runtime.LockOSThread()
	syscall.CloseOnExec(guardFD) // the command does not inherit it
	pipe := os.NewFile(guardFD, "lockctl")
	// Stay alive through the signals sent to the group, to report the
	// command's status; the command gets them with default handling.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "lockctl run: guard: no command")
		return exitUsage
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "lockctl run: %v\n", err)
		return startFailure(err)
	}
	leader := syscall.Getpgrp() == os.Getpid()
	go func() {
		io.Copy(io.Discard, pipe) // returns when lockctl is gone
		if leader {
			syscall.Kill(0, syscall.SIGKILL) // the whole group, this process too
		}
		cmd.Process.Kill()
	}()
	cmd.Wait()
	return exitStatus(cmd.ProcessState)
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

// group is a started guard and its process group.
type group struct {
	cmd    *exec.Cmd
	pipe   *os.File // lockctl's end; closing it makes the guard kill the group
	exited chan int // the guard's exit status
}

// startGroup starts the guard with command in a new process group.
func startGroup(command []string, env []string, stdin io.Reader, stdout, stderr io.Writer) (*group, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding lockctl's own executable to start the command under: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(self, command...)
	cmd.Args[0] = "lockctl-guard"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.Env = append(env, guardEnv+"=1")
	cmd.ExtraFiles = []*os.File{r} // descriptor 3 in the guard
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// When the output is copied (not a file), a process the command left
	// behind may hold the copy open: Wait gives up on it after this, so
	// that lockctl can kill the rest of the group.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	g := &group{cmd: cmd, pipe: w, exited: make(chan int, 1)}
	go func() {
		cmd.Wait()
		g.exited <- exitStatus(cmd.ProcessState)
	}()
	return g, nil
}

// signal sends sig to every process of the group.
func (g *group) signal(sig syscall.Signal) {
	syscall.Kill(-g.cmd.Process.Pid, sig)
}

// close kills what is left of the group and lets the guard go.
func (g *group) close() {
	g.signal(syscall.SIGKILL)
	g.pipe.Close()
}
