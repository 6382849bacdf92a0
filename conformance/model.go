package conformance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// The history checker: every case that runs several owners records each
// acquire, renew and release with its call and return times, and the history
// is checked against a lease-lock model with porcupine.
//
// The model, per key: the state is the current holder (an owner token or
// none), the highest fence granted so far, and the earliest moment the
// holder's lease may expire on the store: the call time of its last
// successful acquire or renew plus the TTL (a store never expires a lock
// earlier than TTL after receiving the request, and it cannot receive it
// before the call). Expiry itself is nondeterministic: any time after that
// moment. So:
//
//   - acquire ok(f): f is above every fence granted before, and the key is
//     free or its holder may have expired by the time the acquire returned;
//   - acquire locked: someone holds the key;
//   - renew ok: the owner is the holder;
//   - renew or release "not held": the owner is not the holder, or its lease
//     may have expired by then;
//   - release ok: the owner is the holder;
//   - an ambiguous outcome (any other error): the operation may or may not
//     have taken effect, at any time after its call.
//
// A checker timeout counts as a failure: a history the checker could not
// decide has not been shown correct.

type opKind uint8

const (
	opAcquire opKind = iota
	opRenew
	opRelease
)

func (k opKind) String() string {
	return [...]string{"acquire", "renew", "release"}[k]
}

type result uint8

const (
	resOK result = iota
	resLocked
	resNotHeld
	resUnknown
)

func (r result) String() string {
	return [...]string{"ok", "locked", "not-held", "unknown"}[r]
}

type modelInput struct {
	kind  opKind
	key   string
	owner string
	ttl   int64 // ns
	call  int64 // ns since the recorder started
	// back, for a successful acquire: how long before call the store's
	// promise to keep the lock at least ttl counts from (a lock the store
	// handed to a waiter, whose validity counts from a request the waiter
	// sent before this call: see backend.Queue); 0 for others.
	back int64
}

type modelOutput struct {
	res   result
	fence uint64
	ret   int64 // ns since the recorder started; MaxInt64 when unknown
}

type modelState struct {
	holder    string
	lastFence uint64
	expiry    int64 // the earliest moment the holder's lease may expire
}

// classify maps an error from package lock to the store's answer, when the
// error says what the store answered.
func classify(err error) result {
	switch {
	case err == nil:
		return resOK
	case errors.Is(err, lock.ErrLocked):
		return resLocked
	case errors.Is(err, lock.ErrNotHeld):
		return resNotHeld
	default:
		return resUnknown
	}
}

func step(s modelState, in modelInput, out modelOutput) []modelState {
	mayHaveExpired := s.holder != "" && out.ret >= s.expiry
	switch in.kind {
	case opAcquire:
		took := modelState{holder: in.owner, lastFence: s.lastFence, expiry: in.call - in.back + in.ttl}
		switch out.res {
		case resOK:
			if out.fence <= s.lastFence || (s.holder != "" && !mayHaveExpired) {
				return nil
			}
			took.lastFence = out.fence
			return []modelState{took}
		case resLocked:
			if s.holder == "" {
				return nil
			}
			return []modelState{s}
		case resUnknown:
			if s.holder == "" || mayHaveExpired {
				return []modelState{s, took}
			}
			return []modelState{s}
		}
		return nil
	case opRenew:
		switch out.res {
		case resOK:
			if s.holder != in.owner {
				return nil
			}
			s.expiry = max(s.expiry, in.call+in.ttl)
			return []modelState{s}
		case resNotHeld:
			if s.holder == in.owner && !mayHaveExpired {
				return nil
			}
			if s.holder == in.owner {
				s.holder = "" // it expired
			}
			return []modelState{s}
		case resUnknown:
			if s.holder != in.owner {
				return []modelState{s}
			}
			renewed := s
			renewed.expiry = max(s.expiry, in.call+in.ttl)
			return []modelState{s, renewed}
		}
		return nil
	default: // release
		free := s
		free.holder = ""
		switch out.res {
		case resOK:
			if s.holder != in.owner {
				return nil
			}
			return []modelState{free}
		case resNotHeld:
			if s.holder == in.owner && !mayHaveExpired {
				return nil
			}
			if s.holder == in.owner {
				return []modelState{free}
			}
			return []modelState{s}
		case resUnknown:
			if s.holder != in.owner {
				return []modelState{s}
			}
			return []modelState{s, free}
		}
		return nil
	}
}

var leaseModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(modelInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []any { return []any{modelState{}} },
	Step: func(state, input, output any) []any {
		next := step(state.(modelState), input.(modelInput), output.(modelOutput))
		out := make([]any, len(next))
		for i, s := range next {
			out[i] = s
		}
		return out
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(modelInput), output.(modelOutput)
		s := fmt.Sprintf("%s(%s) -> %s", in.kind, short(in.owner), out.res)
		if in.kind == opAcquire && out.res == resOK {
			s += fmt.Sprintf(" fence %d", out.fence)
		}
		return s
	},
	DescribeState: func(state any) string {
		s := state.(modelState)
		return fmt.Sprintf("holder %s, last fence %d, may expire from %v", short(s.holder), s.lastFence, time.Duration(s.expiry))
	},
}

func short(token string) string {
	if token == "" {
		return "none"
	}
	return token[:min(8, len(token))]
}

// recorder collects a history of operations on package lock.
type recorder struct {
	start     time.Time
	startMono int64 // CLOCK_MONOTONIC at start, for helper processes' times
	mu        sync.Mutex
	ops       []porcupine.Operation
}

func newRecorder() *recorder { return &recorder{start: time.Now(), startMono: monoNow()} }

func (r *recorder) now() int64 { return int64(time.Since(r.start)) }

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
			ret = time.Duration(res.ret).String()
		}
		out = append(out, fmt.Sprintf("client %d %s %q owner %s ttl %v: call %v, return %s, %s fence %d", op.ClientId, in.kind, in.key, short(in.owner), time.Duration(in.ttl), time.Duration(in.call), ret, res.res, res.fence))
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
	in := modelInput{kind: opAcquire, key: key, ttl: int64(ttl), call: call}
	var fence uint64
	if l != nil {
		in.owner, fence = l.Token(), l.Fence()
		// The lease's deadline less its TTL is at most the moment its
		// validity counts from (less the drift allowance): before the
		// call for a lock handed to a waiter (see modelInput.back).
		in.back = max(0, call-(int64(l.Deadline().Sub(r.start))-int64(l.TTL())))
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
	r.addLeaseOp(client, opRelease, l, call, err)
	return err
}

func (r *recorder) addLeaseOp(client int, kind opKind, l *lock.Lease, call int64, err error) {
	if err != nil && errors.Is(err, lock.ErrLost) && !errors.Is(err, lock.ErrNotHeld) {
		// Lost on the client's clock: what the store did, if it was asked
		// at all, is unknown.
		err = errors.New("lost on the client's clock")
	}
	r.add(client, modelInput{kind: kind, key: l.Key(), owner: l.Token(), ttl: int64(l.TTL()), call: call}, err, 0)
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
