package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock/internal/redistest"
)

// pipelineCounter is a go-redis hook counting the scripts sent alone, and
// the pipelines of scripts with the scripts in them. Connection handshakes
// (HELLO and others, pipelined by go-redis) are not counted.
type pipelineCounter struct {
	pipelines, piped, single atomic.Int64
}

func (c *pipelineCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *pipelineCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if isScript(cmd) {
			c.single.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *pipelineCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		n := 0
		for _, cmd := range cmds {
			if isScript(cmd) {
				n++
			}
		}
		if n > 0 {
			c.pipelines.Add(1)
			c.piped.Add(int64(n))
		}
		return next(ctx, cmds)
	}
}

func isScript(cmd goredis.Cmder) bool {
	return cmd.Name() == "evalsha" || cmd.Name() == "eval"
}

// cycle acquires and releases key n times on b, checking each fence grows.
func cycle(ctx context.Context, b *Backend, key string, n int) error {
	var last uint64
	for i := 0; i < n; i++ {
		token := fmt.Sprintf("%s-%d", key, i)
		g, err := b.Acquire(ctx, key, token, time.Minute)
		if err != nil {
			return fmt.Errorf("acquire %s #%d: %w", key, i, err)
		}
		if g.Fence <= last {
			return fmt.Errorf("acquire %s #%d: fence %d after %d", key, i, g.Fence, last)
		}
		last = g.Fence
		if err := b.Release(ctx, key, token); err != nil {
			return fmt.Errorf("release %s #%d: %w", key, i, err)
		}
	}
	return nil
}

// One goroutine sends one request per script; many goroutines share
// pipelines, and every script still gets its own, right, reply.
func TestBatchingUnderLoad(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := redistest.Client(t, srv.Addr)
	b := New(rdb)
	defer b.Close()
	ctx := context.Background()
	if err := cycle(ctx, b, "warm", 1); err != nil { // connect, load the scripts
		t.Fatal(err)
	}
	count := &pipelineCounter{}
	rdb.AddHook(count)

	if err := cycle(ctx, b, "alone", 200); err != nil {
		t.Fatal(err)
	}
	if n := count.pipelines.Load(); n != 0 {
		t.Fatalf("one goroutine sent %d pipelines; want none", n)
	}
	if n := count.single.Load(); n != 400 {
		t.Fatalf("one goroutine sent %d requests for 200 cycles; want 400", n)
	}

	const workers, rounds = 32, 200
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			if err := cycle(ctx, b, fmt.Sprintf("own-%d", w), rounds); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	pipes, piped, single := count.pipelines.Load(), count.piped.Load(), count.single.Load()-400
	t.Logf("%d goroutines x %d cycles: %d requests alone, %d in %d pipelines", workers, rounds, single, piped, pipes)
	if pipes == 0 || piped <= pipes {
		t.Fatalf("%d goroutines sent %d commands in %d pipelines; want pipelines of more than one command", workers, piped, pipes)
	}
	if single+piped != 2*workers*rounds {
		t.Fatalf("%d goroutines sent %d scripts for %d cycles; want %d", workers, single+piped, workers*rounds, 2*workers*rounds)
	}
}

// A queued call whose context ends returns at once, while the requests on
// the wire wait for a stopped server; when the server comes back they
// complete.
func TestBatchedCallLeavesWhenItsContextEnds(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	b := New(redistest.Client(t, srv.Addr))
	defer b.Close()
	ctx := context.Background()
	if err := cycle(ctx, b, "warm", 1); err != nil { // load the scripts
		t.Fatal(err)
	}

	srv.Stop()
	stopped := true
	defer func() {
		if stopped {
			srv.Continue()
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, maxOnWire)
	for i := 0; i < maxOnWire; i++ {
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			_, err := b.Acquire(wctx, fmt.Sprintf("wire-%d", i), "t", time.Minute)
			errs <- err
		})
	}
	for {
		b.batch.mu.Lock()
		full := b.batch.onWire == maxOnWire
		b.batch.mu.Unlock()
		if full {
			break
		}
		time.Sleep(time.Millisecond) // poll for the calls to reach the wire
	}

	qctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(qctx, "queued", "t", time.Minute)
		done <- err
	}()
	for {
		b.batch.mu.Lock()
		queued := len(b.batch.queue)
		b.batch.mu.Unlock()
		if queued == 1 {
			break
		}
		time.Sleep(time.Millisecond) // poll for the call to queue
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued acquire after its context was cancelled: %v; want context.Canceled", err)
	}

	srv.Continue()
	stopped = false
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("acquire on the wire after the server came back: %v", err)
		}
	}
	// The cancelled call left nothing behind: it never reached the server.
	h, err := b.Inspect(ctx, "queued")
	if err != nil {
		t.Fatal(err)
	}
	if h.Held {
		t.Fatalf("the cancelled queued acquire holds the lock: %+v", h)
	}
}

// A pipeline sent after the server's script cache was flushed falls back to
// sending the scripts themselves.
func TestPipelineAfterScriptFlush(t *testing.T) {
	srv := redistest.Start(t, redistest.NoPersistence)
	rdb := redistest.Client(t, srv.Addr)
	b := New(rdb)
	defer b.Close()
	ctx := context.Background()
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var batch []*call
	for i := 0; i < 3; i++ {
		lk, fk := keys(b.opts.prefix, fmt.Sprint("flushed-", i))
		batch = append(batch, &call{ctx: ctx, script: acquireScript, keys: []string{lk, fk, lk + ":dead:t", lk + ":next"}, args: []any{"t", 60000}, done: make(chan struct{})})
	}
	b.batch.sendOne(batch)
	for i, c := range batch {
		select {
		case <-c.done:
		default:
			t.Fatalf("call %d not completed", i)
		}
		if fence, err := c.cmd.Int64(); err != nil || fence != 1 {
			t.Fatalf("call %d after SCRIPT FLUSH: fence %d, %v; want fence 1", i, fence, err)
		}
	}
}
