package redis

import (
	"context"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// pipeliner is what a go-redis client needs to send several scripts in one
// write: every client kind has it (Client, ClusterClient, Ring,
// UniversalClient). A Client without it gets one request per call.
type pipeliner interface {
	Pipeline() goredis.Pipeliner
}

// maxOnWire is how many requests (single calls or pipelines) a batcher lets
// run at once before it queues calls and sends the queue as one pipeline.
// A few requests on the wire keep the client and the server busy at the
// same time; many would only add round trips that a pipeline saves. On two
// cores, with 32 goroutines on their own keys (bench/), 1 to 8 on the wire
// ran 1.1-1.6 times the cycles per second of a bare go-redis SET NX per
// goroutine, where one request per script ran 0.8 times; 4 did best.
const maxOnWire = 4

// batcher runs the backend's scripts on one go-redis client. A call made
// while fewer than maxOnWire requests are on the wire goes out at once, on
// the caller's goroutine, as one EVALSHA: a single goroutine pays nothing
// for batching. Calls made while the wire is busy queue, and the queue goes
// out as one pipeline when a request comes back. Under load, one write and
// one read (on the client and on the server) then carry many scripts instead
// of one each: the system calls per script, which dominate a script's cost,
// fall with the load.
//
// A queued call whose context ends returns the context's error at once; if
// it was already in a pipeline, its script may still run, which is the same
// unknown outcome as a call cut short on the wire. Why that is safe: package
// lock undoes an acquire of unknown outcome with a release of its token,
// which may reach the server before the pipeline does (another connection);
// the release kills the token (see Dead tokens in redis.go), so the late
// acquire is refused instead of taking the lock for a whole TTL. The same
// holds for a script the NOSCRIPT fallback below sends again after the rest
// of its pipeline.
type batcher struct {
	rdb  Conn
	pipe pipeliner // nil: no pipelining
	// renewals says how queued renewals may share one script (see
	// renewbatch.go): one script for all, one per Cluster hash slot, or
	// none.
	renewals coalescing
	// deadlines is true when rdb ends a socket read or write at the
	// call's context deadline (go-redis's ContextTimeoutEnabled).
	deadlines bool
	// owned is true when the backend created rdb (from a URL): its
	// calls' contexts are marked so that go-redis's messages about them
	// are dropped once the program installed SetQuietGoRedisLogger.
	owned bool

	mu     sync.Mutex
	onWire int
	queue  []*call
}

// call is one queued script run.
type call struct {
	ctx    context.Context
	script *goredis.Script
	keys   []string
	args   []any
	cmd    *goredis.Cmd
	done   chan struct{}
}

func newBatcher(rdb Conn, owned bool) *batcher {
	b := &batcher{rdb: rdb, deadlines: honoursDeadlines(rdb), owned: owned}
	if p, ok := rdb.(pipeliner); ok {
		b.pipe = p
	}
	switch rdb.(type) {
	case *goredis.Client:
		b.renewals = coalesceAll
	case *goredis.ClusterClient:
		b.renewals = coalesceBySlot
	}
	return b
}

// honoursDeadlines reports whether rdb ends its socket reads and writes at a
// call's context deadline: a go-redis client created with
// ContextTimeoutEnabled. Without it, go-redis waits for its own read and
// write timeouts (3s by default, then perhaps retries) whatever the
// context says. Clients it does not know count as not honouring them.
func honoursDeadlines(rdb Conn) bool {
	switch c := rdb.(type) {
	case withOptions[goredis.Options]:
		return c.Options().ContextTimeoutEnabled
	case withOptions[goredis.ClusterOptions]:
		return c.Options().ContextTimeoutEnabled
	case withOptions[goredis.RingOptions]:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// withOptions is a go-redis client kind, by its options.
type withOptions[T any] interface{ Options() *T }

// run runs script with keys and args and returns its reply. It returns
// when ctx ends, however rdb was built (see direct).
func (b *batcher) run(ctx context.Context, script *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	if b.owned {
		ctx = markOwned(ctx)
	}
	if b.pipe == nil {
		return b.direct(ctx, script, keys, args, nil)
	}
	b.mu.Lock()
	if b.onWire < maxOnWire && len(b.queue) == 0 {
		b.onWire++
		b.mu.Unlock()
		return b.direct(ctx, script, keys, args, b.returned)
	}
	c := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.cmd
	case <-ctx.Done():
		cmd := goredis.NewCmd(ctx)
		cmd.SetErr(ctx.Err())
		return cmd
	}
}

// newCall returns a call of script for runAll.
func (b *batcher) newCall(ctx context.Context, script *goredis.Script, keys []string, args ...any) *call {
	if b.owned {
		ctx = markOwned(ctx)
	}
	return &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
}

// runAll runs calls, made by newCall, and returns their replies, in order,
// when each has one or ctx ended (those left get ctx's error). With
// pipelining they join the queue together, and so go out in one pipeline
// (sharing scripts where they can, see renewbatch.go); without, each runs
// as run does, concurrently.
func (b *batcher) runAll(ctx context.Context, calls []*call) []*goredis.Cmd {
	out := make([]*goredis.Cmd, len(calls))
	if len(calls) == 0 {
		return out
	}
	if b.pipe == nil {
		var wg sync.WaitGroup
		for i, c := range calls {
			wg.Go(func() { out[i] = b.direct(c.ctx, c.script, c.keys, c.args, nil) })
		}
		wg.Wait()
		return out
	}
	b.mu.Lock()
	b.queue = append(b.queue, calls...)
	batch := b.takeLocked()
	b.mu.Unlock()
	if batch != nil {
		go b.send(batch)
	}
	for i, c := range calls {
		select {
		case <-c.done:
			out[i] = c.cmd
			continue
		case <-ctx.Done():
		}
		// c.cmd is the sender's until done is closed.
		select {
		case <-c.done:
			out[i] = c.cmd
		default:
			out[i] = goredis.NewCmd(ctx)
			out[i].SetErr(ctx.Err())
		}
	}
	return out
}

// direct runs script on the caller's goroutine, and then done (if not nil),
// when that is enough for the call to end with ctx: ctx never ends, or it
// has a deadline and the client ends its socket I/O there. Otherwise (a
// client built without ContextTimeoutEnabled, or a context without a
// deadline that can be cancelled) the request runs on a goroutine of its
// own, and direct returns ctx's error when ctx ends first: the request
// then goes on until go-redis gives up on it (its read timeout), and its
// outcome is unknown, as for a request cut short on the wire (see
// batcher: package lock undoes an acquire of unknown outcome). The price,
// a goroutine per call, is paid only there. One case is left to the
// client: a context with a deadline that is cancelled before it, on a
// client with ContextTimeoutEnabled, ends the call at the earlier of the
// deadline and go-redis's read timeout.
func (b *batcher) direct(ctx context.Context, script *goredis.Script, keys []string, args []any, done func()) *goredis.Cmd {
	_, hasDeadline := ctx.Deadline()
	if ctx.Done() == nil || (b.deadlines && hasDeadline) {
		cmd := script.Run(ctx, b.rdb, keys, args...)
		if done != nil {
			done()
		}
		return cmd
	}
	reply := make(chan *goredis.Cmd, 1)
	go func() {
		cmd := script.Run(ctx, b.rdb, keys, args...)
		if done != nil {
			done()
		}
		reply <- cmd
	}()
	select {
	case cmd := <-reply:
		return cmd
	case <-ctx.Done():
		cmd := goredis.NewCmd(ctx)
		cmd.SetErr(ctx.Err())
		return cmd
	}
}

// returned notes that a request came back, and sends the queue if one
// waits.
func (b *batcher) returned() {
	b.mu.Lock()
	b.onWire--
	batch := b.takeLocked()
	b.mu.Unlock()
	if batch != nil {
		go b.send(batch)
	}
}

// takeLocked takes the queue for sending, if there is one and the wire has
// room.
func (b *batcher) takeLocked() []*call {
	if len(b.queue) == 0 || b.onWire >= maxOnWire {
		return nil
	}
	batch := b.queue
	b.queue = nil
	b.onWire++
	return batch
}

// send sends batches as pipelines until the queue is empty.
func (b *batcher) send(batch []*call) {
	for batch != nil {
		b.sendOne(batch)
		b.mu.Lock()
		b.onWire--
		batch = b.takeLocked()
		b.mu.Unlock()
	}
}

func (b *batcher) sendOne(batch []*call) {
	live := batch[:0:0]
	for _, c := range batch {
		if c.ctx.Err() != nil {
			c.cmd = goredis.NewCmd(c.ctx)
			c.cmd.SetErr(c.ctx.Err())
			close(c.done)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := batchContext(live)
	defer cancel()
	p := b.pipe.Pipeline()
	live, groups := b.groupRenewals(live)
	for _, g := range groups {
		g.send(ctx, p)
	}
	for _, c := range live {
		c.cmd = c.script.EvalSha(ctx, p, c.keys, c.args...)
	}
	_, _ = p.Exec(ctx) // each call's error is on its own command
	for _, g := range groups {
		g.deliver(ctx, b)
	}
	for _, c := range live {
		if goredis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			// The server's script cache was flushed: send the script.
			c.cmd = c.script.Eval(ctx, b.rdb, c.keys, c.args...)
		}
		close(c.done)
	}
}

// batchContext is the context a pipeline runs under: the first call's values,
// no cancellation (one caller giving up must not fail the others), and the
// latest of the calls' deadlines when every call has one, so that a
// pipeline to a hung server ends when the last caller has stopped waiting.
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	for _, c := range batch {
		dl, ok := c.ctx.Deadline()
		if !ok {
			return ctx, func() {}
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	return context.WithDeadline(ctx, latest)
}
