package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// The hot key contended by 16 separate processes: each a copy of this
// program (a child, told so by childEnv) with one peer instance over its
// own go-redis client, as a deployment's processes would be. The parent
// starts them, waits until each has connected and warmed up, tells them
// all when to start, and merges the sections they report.

const childEnv = "LOCKBENCH_CHILD"

// childReport is what a child prints when its run ends.
type childReport struct {
	Sections [][2]int64 `json:"sections"` // UnixNano start and end of each section
	Requests int64      `json:"requests"` // commands its client sent during the run
	Err      string     `json:"err,omitempty"`
}

// maybeChild runs this process as a child when childEnv says so ("PEER
// ADDR KEY DURATION"), and reports whether it did.
func maybeChild() bool {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return false
	}
	f := strings.Fields(spec)
	if len(f) != 4 {
		fatal(fmt.Errorf("%s=%q: want PEER ADDR KEY DURATION", childEnv, spec))
	}
	pi, err := strconv.Atoi(f[0])
	if err != nil || pi < 0 || pi >= len(peers) {
		fatal(fmt.Errorf("%s: peer %q: want 0 to %d", childEnv, f[0], len(peers)-1))
	}
	d, err := time.ParseDuration(f[3])
	if err != nil {
		fatal(fmt.Errorf("%s: duration: %v", childEnv, err))
	}
	c := &counter{}
	rdb := goredis.NewClient(&goredis.Options{
		Addr:                     f[1],
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	defer rdb.Close()
	rdb.AddHook(c)
	l := peers[pi].new(rdb)
	// Warm up: the connection, the scripts, the subscription.
	ctx := context.Background()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	unlock, err := l.wait(wctx, f[2]+":warm:"+strconv.Itoa(os.Getpid()))
	wcancel()
	if err != nil {
		fatal(err)
	}
	unlock(ctx)
	fmt.Println("ready")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		fatal(fmt.Errorf("reading the start time: %v", err))
	}
	startNs, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		fatal(err)
	}
	start := time.Unix(0, startNs)
	time.Sleep(time.Until(start)) // the common start, not synchronisation of state
	rctx, cancel := context.WithDeadline(ctx, start.Add(d))
	defer cancel()
	var rep childReport
	before := c.n.Load()
	for rctx.Err() == nil {
		unlock, err := l.wait(rctx, f[2])
		if err != nil {
			if rctx.Err() == nil {
				rep.Err = err.Error()
			}
			break // the run ended while waiting
		}
		began := time.Now()
		hold()
		end := time.Now()
		rep.Sections = append(rep.Sections, [2]int64{began.UnixNano(), end.UnixNano()})
		if err := unlock(ctx); err != nil {
			rep.Err = err.Error()
			break
		}
	}
	rep.Requests = c.n.Load() - before
	json.NewEncoder(os.Stdout).Encode(rep)
	return true
}

// hotProcesses runs the hot key with n child processes of peer pi for d.
func hotProcesses(pi int, addr string, admin *goredis.Client, n int, d time.Duration) sepResult {
	exe, err := os.Executable()
	if err != nil {
		fatal(err)
	}
	key := fmt.Sprintf("bench:procs:%d", run.Add(1))
	type child struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Reader
	}
	var children []child
	defer func() {
		for _, c := range children {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	}()
	for range n {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %s %s %s", childEnv, pi, addr, key, d))
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			fatal(err)
		}
		if err := cmd.Start(); err != nil {
			fatal(err)
		}
		children = append(children, child{cmd, in, bufio.NewReader(out)})
	}
	for _, c := range children {
		if line, err := c.out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
			fatal(fmt.Errorf("a child process did not get ready: %q, %v", line, err))
		}
	}
	before := commands(admin)
	start := time.Now().Add(50 * time.Millisecond)
	for _, c := range children {
		fmt.Fprintln(c.in, start.UnixNano())
	}
	var all [][2]int64
	var requests, busiest int64
	for _, c := range children {
		var rep childReport
		if err := json.NewDecoder(c.out).Decode(&rep); err != nil {
			fatal(fmt.Errorf("a child's report: %v", err))
		}
		if rep.Err != "" {
			fatal(fmt.Errorf("a child process failed: %s", rep.Err))
		}
		all = append(all, rep.Sections...)
		requests += rep.Requests
		busiest = max(busiest, int64(len(rep.Sections)))
	}
	cmdsRun := float64(commands(admin) - before - 1)
	if len(all) == 0 {
		return sepResult{}
	}
	sort.Slice(all, func(i, j int) bool { return all[i][0] < all[j][0] })
	var gaps []float64
	last := all[0][1]
	for _, s := range all[1:] {
		if s[0] < last {
			fatal(fmt.Errorf("two sections overlap: one began %v before the other ended", time.Duration(last-s[0])))
		}
		gaps = append(gaps, float64(s[0]-last)/1e3)
		last = s[1]
	}
	wall := time.Duration(max(last, start.Add(d).UnixNano()) - start.UnixNano())
	secs := float64(len(all))
	return sepResult{
		util:    100 * secs * float64(time.Millisecond) / float64(wall),
		reqs:    float64(requests) / secs,
		cmds:    cmdsRun / secs,
		gap:     median(gaps),
		busiest: 100 * float64(busiest) / secs,
	}
}
