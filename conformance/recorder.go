package conformance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// recorder collects a history of operations on package lock.
//
// Its times are ns since start on the monotonic clock, in real time. Under
// virtual time (VirtualTime) many operations happen at one instant, and
// times in ns would tie: the checker would have to try every order of
// operations that the run saw one after the other (eight contenders'
// hundreds of acquires and releases at one instant make it hopeless). So
// there a time is the virtual ns since start times virtualScale plus a
// count of the readings so far: readings at one instant keep the order in
// which they were taken, and readings at different instants the order of
// the instants. The model's durations (a TTL, back) are scaled alike, so
// that it compares as before, on a finer clock.
type recorder struct {
	start     time.Time
	startMono int64 // CLOCK_MONOTONIC at start, for helper processes' times
	scale     int64 // units of the times per ns: 1, or virtualScale
	readings  atomic.Int64
	mu        sync.Mutex
	ops       []porcupine.Operation
}

// virtualScale is the recorder's units per virtual ns: room for this many
// readings in one recorder (a run or a case takes a few thousand), and
// for about 100 days of virtual time in an int64.
const virtualScale = 1 << 20

func newRecorder() *recorder { return &recorder{start: time.Now(), startMono: monoNow(), scale: 1} }

// newRecorder returns a recorder for the suite's clock: virtual or real.
func (s *suite) newRecorder() *recorder {
	r := newRecorder()
	if s.virtual {
		r.scale = virtualScale
	}
	return r
}

func (r *recorder) now() int64 {
	d := int64(time.Since(r.start))
	if r.scale == 1 {
		return d
	}
	n := r.readings.Add(1)
	if n >= r.scale {
		panic(fmt.Sprintf("conformance: more than %d operations recorded in one history under virtual time", r.scale))
	}
	return d*r.scale + n
}

// dur converts a duration to the recorder's units.
func (r *recorder) dur(d time.Duration) int64 { return int64(d) * r.scale }

// ns converts a time of the recorder back to ns since start.
func (r *recorder) ns(v int64) time.Duration { return time.Duration(v / r.scale) }

func (r *recorder) add(client int, in modelInput, err error, fence uint64) {
	out := modelOutput{res: classify(err), fence: fence, ret: r.now()}
	if out.res == resUnknown {
		out.ret = math.MaxInt64
	}
	r.mu.Lock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: in.call, Output: out, Return: out.ret})
	r.mu.Unlock()
}

// lines returns the history as text, one operation a line, in call order:
// what a failing fault run saves for replay and inspection.
func (r *recorder) lines() []string {
	r.mu.Lock()
	ops := append([]porcupine.Operation(nil), r.ops...)
	r.mu.Unlock()
	slices.SortFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	out := make([]string, 0, len(ops))
	for _, op := range ops {
		in, res := op.Input.(modelInput), op.Output.(modelOutput)
		ret := "never"
		if res.ret != math.MaxInt64 {
			ret = r.ns(res.ret).String()
		}
		out = append(out, fmt.Sprintf("client %d %s %q owner %s ttl %v: call %v, return %s, %s fence %d", op.ClientId, in.kind, in.key, short(in.owner), r.ns(in.ttl), r.ns(in.call), ret, res.res, res.fence))
	}
	return out
}

// acquire calls TryAcquire or Acquire on c and records the operation.
func (r *recorder) acquire(ctx context.Context, client int, c *lock.Client, key string, wait bool, ttl time.Duration, opts ...lock.Option) (*lock.Lease, error) {
	opts = append([]lock.Option{lock.WithTTL(ttl)}, opts...)
	call := r.now()
	var l *lock.Lease
	var err error
	if wait {
		l, err = c.Acquire(ctx, key, opts...)
	} else {
		l, err = c.TryAcquire(ctx, key, opts...)
	}
	in := modelInput{kind: opAcquire, key: key, ttl: r.dur(ttl), call: call}
	var fence uint64
	if l != nil {
		in.owner, fence = l.Token(), l.Fence()
		// The lease's deadline less its TTL is at most the moment its
		// validity counts from (less the drift allowance): before the
		// call for a lock handed to a waiter (see modelInput.back).
		in.back = max(0, call-r.dur(l.Deadline().Sub(r.start)-l.TTL()))
	} else {
		in.owner = fmt.Sprintf("failed-%d-%d", client, call) // never a holder
		if _, queues := c.Backend().(backend.Queuer); queues && wait && errors.Is(err, lock.ErrLocked) && ctxErr(err) {
			// A waiter that gave up while queued in the store may have
			// been handed the lock just before, and freed it as it
			// left: to the store the attempt took the lock for a
			// moment. Its outcome is ambiguous.
			err = errGaveUpQueued
		}
		if classify(err) == resUnknown && !isInputErr(err) {
			// The store may have granted a lock that package lock now
			// frees in the background: record the attempt as ambiguous.
			in.owner = fmt.Sprintf("unknown-%d-%d", client, call)
		}
	}
	r.add(client, in, err, fence)
	return l, err
}

func isInputErr(err error) bool { return errors.Is(err, lock.ErrInvalid) }

// errGaveUpQueued records a waiting acquire that gave up while queued in
// the store (see recorder.acquire).
var errGaveUpQueued = errors.New("gave up while queued in the store: the store may have handed it the lock")

// ctxErr reports whether err says that the caller's context ended.
func ctxErr(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// renew renews l and records the operation when the store answered.
func (r *recorder) renew(ctx context.Context, client int, l *lock.Lease) error {
	call := r.now()
	err := l.Renew(ctx)
	r.addLeaseOp(client, opRenew, l, call, err)
	return err
}

// release releases l and records the operation.
func (r *recorder) release(ctx context.Context, client int, l *lock.Lease) error {
	call := r.now()
	err := l.Release(ctx)
	seen := err
	if lost := l.Err(); err == nil && errors.Is(lost, lock.ErrLost) {
		// Lost before the release, which then returns nil (Err keeps
		// the loss): the history records the loss.
		seen = lost
	}
	r.addLeaseOp(client, opRelease, l, call, seen)
	return err
}

func (r *recorder) addLeaseOp(client int, kind opKind, l *lock.Lease, call int64, err error) {
	if err != nil && errors.Is(err, lock.ErrLost) && !errors.Is(err, lock.ErrNotHeld) {
		// Lost on the client's clock: what the store did, if it was asked
		// at all, is unknown.
		err = errors.New("lost on the client's clock")
	}
	r.add(client, modelInput{kind: kind, key: l.Key(), owner: l.Token(), ttl: r.dur(l.TTL()), call: call}, err, 0)
}

// check verifies the history against the lease-lock model.
func (r *recorder) check(timeout time.Duration) error {
	r.mu.Lock()
	ops := append([]porcupine.Operation(nil), r.ops...)
	r.mu.Unlock()
	res, info := porcupine.CheckOperationsVerbose(leaseModel.ToModel(), ops, timeout)
	switch res {
	case porcupine.Ok:
		return nil
	case porcupine.Unknown:
		return fmt.Errorf("history of %d operations: the checker did not decide within %v; an undecided history counts as a failure", len(ops), timeout)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "history of %d operations is not linearizable under the lease-lock model", len(ops))
	for _, part := range info.PartialLinearizations() {
		for _, lin := range part {
			fmt.Fprintf(&b, "\n  longest linearizable prefix of a key's history: %d operations", len(lin))
			break
		}
	}
	return errors.New(b.String())
}
