package redis_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/redis"
)

// queueHelperEnv makes the test binary a waiter process (see
// maybeQueueHelper): "ADDR KEY NAME TTL".
const queueHelperEnv = "LOCK_REDIS_QUEUE_HELPER"

// maybeQueueHelper runs the test binary as a waiter process when
// queueHelperEnv is set: it waits for the key with its own client, then,
// inside its section, counts itself in a shared counter (which must read 1:
// nobody else inside), appends its name to a shared list (the order
// sections ran in), holds 20ms, and releases. It prints what it saw.
func maybeQueueHelper() {
	spec := os.Getenv(queueHelperEnv)
	if spec == "" {
		return
	}
	f := strings.Fields(spec)
	if len(f) != 4 {
		fmt.Println("bad helper spec", spec)
		os.Exit(2)
	}
	addr, key, name := f[0], f[1], f[2]
	ttl, err := time.ParseDuration(f[3])
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	ctx := context.Background()
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	c, err := lock.New(redis.New(rdb), lock.WithTTL(ttl))
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	defer c.Close()
	fmt.Println("waiting")
	l, err := c.Acquire(ctx, key)
	if err != nil {
		fmt.Println("acquire:", err)
		os.Exit(1)
	}
	inside := rdb.Incr(ctx, "test:inside").Val()
	rdb.RPush(ctx, "test:order", name)
	time.Sleep(20 * time.Millisecond) // the section
	rdb.Decr(ctx, "test:inside")
	if err := l.Release(ctx); err != nil {
		fmt.Println("release:", err)
		os.Exit(1)
	}
	fmt.Printf("done inside=%d fence=%d\n", inside, l.Fence())
	os.Exit(0)
}

// Waiters in separate processes, each with its own client, on one key: they
// are served in the order they queued, never two at once; a waiter process
// killed (kill -9) while queued delays the others by at most its TTL (its
// record expires, and the waiter after it tries then).
func TestQueueAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	ctx := context.Background()
	rdb := newGoRedis(t, srv.Addr)
	const ttl = time.Second
	holder := newLocks(t, redis.New(rdb), lock.WithTTL(ttl))
	l, err := holder.TryAcquire(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	queue := "lock:{p}:q"
	type proc struct {
		name string
		cmd  *exec.Cmd
		out  *bufio.Scanner
	}
	start := func(name string) *proc {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), queueHelperEnv+"="+srv.Addr+" p "+name+" "+ttl.String())
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return &proc{name: name, cmd: cmd, out: bufio.NewScanner(out)}
	}
	// Five waiters queue one after the other; the third will be killed.
	var procs []*proc
	for i, name := range []string{"w1", "w2", "victim", "w3", "w4"} {
		p := start(name)
		procs = append(procs, p)
		deadline := time.Now().Add(10 * time.Second)
		for rdb.ZCard(ctx, queue).Val() < int64(i+1) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not queue within 10s", name)
			}
			time.Sleep(5 * time.Millisecond) // poll the store
		}
	}
	if err := procs[2].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	procs[2].cmd.Wait()
	released := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for rdb.LLen(ctx, "test:order").Val() < 4 && time.Since(released) < 10*time.Second {
		time.Sleep(5 * time.Millisecond) // poll the store
	}
	took := time.Since(released)
	for _, p := range append(procs[:2:2], procs[3:]...) {
		var last string
		for p.out.Scan() { // until the process exits
			last = p.out.Text()
		}
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("%s: %v (last said %q)", p.name, err, last)
		}
		if !strings.HasPrefix(last, "done inside=1 ") {
			t.Fatalf("%s ended with %q; want done, alone inside its section", p.name, last)
		}
	}
	order := rdb.LRange(ctx, "test:order", 0, -1).Val()
	if strings.Join(order, " ") != "w1 w2 w3 w4" {
		t.Fatalf("sections ran in the order %v; want w1 w2 w3 w4 (the order they queued, without the killed one)", order)
	}
	// Three sections of 20ms before the last one began, and the killed
	// waiter's record (or a lock handed to it) left to expire: at most its
	// TTL after its last refresh, learned by the waiter behind it within a
	// third of the TTL.
	if bound := ttl*4/3 + 60*time.Millisecond + 500*time.Millisecond; took > bound {
		t.Fatalf("the four live waiters were served in %v after the release; want within %v (4/3 of the killed waiter's TTL, the sections, 500ms slack)", took, bound)
	}
	t.Logf("served in order %v in %v after the release (the killed waiter's TTL is %v)", order, took.Round(time.Millisecond), ttl)
	if n, _ := strconv.Atoi(rdb.Get(ctx, "test:inside").Val()); n != 0 {
		t.Fatalf("inside counter %d at the end", n)
	}
}
