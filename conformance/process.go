package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/anishathalye/porcupine"

	"github.com/distlock/lock"
)

// Contenders in processes of their own. A fault run over a harness that
// implements ProcessContenders adds helper processes to its contenders: the
// test binary started again, whose TestMain hands over to MaybeContend. A
// helper opens the store from the harness's URL, contends as the run's
// other contenders do, and reports its history and its leases' validity
// intervals when the run stops it, with times on the machine's monotonic
// clock (CLOCK_MONOTONIC, which Go's monotonic readings use on Linux), so
// that the run checks them beside its own. The faults then include a
// helper stopped with SIGSTOP for twice the TTL, which may hold a lock
// meanwhile: a process paused past its lease, as by a long GC pause. (The
// fenced resource of the run lives in the test process: the helpers'
// sections are checked by their intervals and the history; the GC-pause
// story with a fenced resource is internal/sqltest/gcpause's test.)

// ProcessContenders is an optional Harness hook for stores that other
// processes can reach.
type ProcessContenders interface {
	// ContenderURL returns a URL that lock.Open in another process
	// accepts, reaching the store with the options of the harness's
	// backends.
	ContenderURL(ctx context.Context) (string, error)
}

// contenderEnv carries a helper's configuration.
const contenderEnv = "LOCK_FAULT_CONTENDER"

type contenderConfig struct {
	URL          string
	Keys         []string
	TTL          time.Duration
	Client       int
	Seed1, Seed2 uint64
}

// childReport is what a helper prints when it ends: one JSON line.
type childReport struct {
	StartMono int64 // CLOCK_MONOTONIC at its recorder's start, ns
	Ops       []childOp
	Sections  []childSection
	Errs      int
	Lost      int
	Err       string
}

type childOp struct {
	Kind  opKind
	Key   string
	Owner string
	TTL   int64
	Call  int64 // ns since the helper's recorder started
	Back  int64 // modelInput.back
	Ret   int64 // likewise; math.MaxInt64 when unknown
	Res   result
	Fence uint64
}

type childSection struct {
	Key        string
	Fence      uint64
	Start, End int64 // ns since the helper's recorder started
}

// clockMonotonic is Linux's CLOCK_MONOTONIC.
const clockMonotonic = 1

// monoNow reads CLOCK_MONOTONIC, which every process of the machine
// shares (Go's own monotonic readings have a per-process origin).
func monoNow() int64 {
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		panic("conformance: clock_gettime(CLOCK_MONOTONIC): " + errno.Error())
	}
	return ts.Nano()
}

// MaybeContend is for a test binary's TestMain only, and only in a package
// whose harness implements ProcessContenders: call it first, before
// m.Run, as in
//
//	func TestMain(m *testing.M) {
//		conformance.MaybeContend()
//		os.Exit(m.Run())
//	}
//
// A fault run starts helper contenders by running the test binary
// (os.Args[0]) again with the environment variable LOCK_FAULT_CONTENDER
// set to the helper's configuration (JSON: the URL from ContenderURL, the
// keys, the TTL, a seed). When that variable is empty or unset,
// MaybeContend does nothing and returns at once. When it is set,
// MaybeContend never returns: it opens the URL with lock.Open (the
// backend's package must be imported by the test binary), prints "ready"
// on stdout, contends until its stdin is closed (the run closes it to stop
// the helper), prints its report as one JSON line on stdout, and ends the
// process with os.Exit: status 0, or 1 when the configuration, lock.Open
// or the run failed. Nothing else in a program should call it.
func MaybeContend() {
	v := os.Getenv(contenderEnv)
	if v == "" {
		return
	}
	os.Exit(contendMain(v, os.Stdin, os.Stdout))
}

func contendMain(conf string, stdin io.Reader, stdout io.Writer) int {
	var cfg contenderConfig
	report := func(r childReport) int {
		json.NewEncoder(stdout).Encode(r)
		if r.Err != "" {
			return 1
		}
		return 0
	}
	if err := json.Unmarshal([]byte(conf), &cfg); err != nil {
		return report(childReport{Err: "bad configuration: " + err.Error()})
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	c, err := lock.Open(ctx, cfg.URL, lock.WithTTL(cfg.TTL))
	if err != nil {
		return report(childReport{Err: "lock.Open: " + err.Error()})
	}
	rec := newRecorder()
	startMono := monoNow()
	fmt.Fprintln(stdout, "ready")
	go func() {
		io.Copy(io.Discard, stdin) // the run closes it to stop the helper
		stop()
	}()
	var out childReport
	ct := &contender{client: cfg.Client, c: c, keys: cfg.Keys, ttl: cfg.TTL, rec: rec,
		rng:    rand.New(rand.NewPCG(cfg.Seed1, cfg.Seed2)),
		failed: func() { out.Errs++ },
		done: func(sec section) {
			if sec.relErr != nil {
				out.Errs++
			}
			if errors.Is(sec.l.Err(), lock.ErrLost) {
				out.Lost++
			}
			out.Sections = append(out.Sections, childSection{Key: sec.key, Fence: sec.l.Fence(),
				Start: int64(sec.start.Sub(rec.start)), End: int64(sec.end.Sub(rec.start))})
		},
	}
	ct.run(ctx)
	c.Close()
	out.StartMono = startMono
	rec.mu.Lock()
	for _, op := range rec.ops {
		in, o := op.Input.(modelInput), op.Output.(modelOutput)
		out.Ops = append(out.Ops, childOp{Kind: in.kind, Key: in.key, Owner: in.owner, TTL: in.ttl,
			Call: in.call, Back: in.back, Ret: o.ret, Res: o.res, Fence: o.fence})
	}
	rec.mu.Unlock()
	return report(out)
}

// helper is a helper contender process, seen from the run.
type helper struct {
	client int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  *bufio.Scanner
	stderr *bytes.Buffer
	mu     sync.Mutex // serializes signals with the end
	ended  bool
}

// startHelper starts a helper contender and waits until it is ready.
func startHelper(cfg contenderConfig) (*helper, error) {
	conf, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), contenderEnv+"="+string(conf))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the run
	h := &helper{client: cfg.Client, cmd: cmd, stderr: &bytes.Buffer{}}
	cmd.Stderr = h.stderr
	if h.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting a helper contender: %w", err)
	}
	h.lines = bufio.NewScanner(stdout)
	h.lines.Buffer(nil, 64<<20)
	ready := make(chan string, 1)
	go func() {
		if h.lines.Scan() {
			ready <- h.lines.Text()
		}
		close(ready)
	}()
	select {
	case line := <-ready:
		if line == "ready" {
			return h, nil
		}
		h.kill()
		return nil, fmt.Errorf("helper contender did not start (it said %q; stderr: %s): the test binary's TestMain must call conformance.MaybeContend first", line, h.stderr.String())
	case <-time.After(30 * time.Second):
		h.kill()
		return nil, fmt.Errorf("helper contender not ready within 30s (stderr: %s): the test binary's TestMain must call conformance.MaybeContend first", h.stderr.String())
	}
}

// signal sends sig to the helper unless it ended.
func (h *helper) signal(sig syscall.Signal) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ended {
		h.cmd.Process.Signal(sig)
	}
}

func (h *helper) kill() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ended {
		h.cmd.Process.Kill()
		h.cmd.Wait()
		h.ended = true
	}
}

// finish stops the helper and returns its report: it ends its section,
// releases, and reports, within bound.
func (h *helper) finish(bound time.Duration) (childReport, error) {
	h.signal(syscall.SIGCONT)
	h.stdin.Close()
	got := make(chan childReport, 1)
	failed := make(chan error, 1)
	go func() {
		var r childReport
		if !h.lines.Scan() {
			failed <- fmt.Errorf("helper contender %d ended without a report (stderr: %s)", h.client, h.stderr.String())
			return
		}
		if err := json.Unmarshal(h.lines.Bytes(), &r); err != nil {
			failed <- fmt.Errorf("helper contender %d: bad report: %v", h.client, err)
			return
		}
		got <- r
	}()
	select {
	case r := <-got:
		h.mu.Lock()
		h.cmd.Wait()
		h.ended = true
		h.mu.Unlock()
		if r.Err != "" {
			return r, fmt.Errorf("helper contender %d: %s", h.client, r.Err)
		}
		return r, nil
	case err := <-failed:
		h.kill()
		return childReport{}, err
	case <-time.After(bound):
		h.kill()
		return childReport{}, fmt.Errorf("helper contender %d did not report within %v of the end of the run (stderr: %s)", h.client, bound, h.stderr.String())
	}
}

// merge adds a helper's history to the run's recorder and its intervals,
// on the run's clock, to intervals.
func (r *recorder) merge(client int, rep childReport, intervals map[string][]interval) {
	offset := rep.StartMono - r.startMono
	r.mu.Lock()
	for _, op := range rep.Ops {
		in := modelInput{kind: op.Kind, key: op.Key, owner: op.Owner, ttl: op.TTL, call: op.Call + offset, back: op.Back}
		out := modelOutput{res: op.Res, fence: op.Fence, ret: op.Ret}
		if out.ret != math.MaxInt64 {
			out.ret += offset
		}
		r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: in.call, Output: out, Return: out.ret})
	}
	r.mu.Unlock()
	for _, s := range rep.Sections {
		intervals[s.Key] = append(intervals[s.Key], interval{client: client, fence: s.Fence,
			start: r.start.Add(time.Duration(s.Start + offset)), end: r.start.Add(time.Duration(s.End + offset)),
			startOffset: time.Duration(s.Start + offset)})
	}
}
