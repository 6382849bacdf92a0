package conformance

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/distlock/lock"
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
//     have taken effect, at any time after its call. A lock that an
//     ambiguous acquire may have taken is one its caller never got:
//     package lock frees it in the background (Client.cleanup, a release
//     the history does not record), holding the client's turn for the key
//     meanwhile, so that the client's own attempts on the key are refused
//     with ErrLocked without asking the store. Such a holder may be gone
//     from the moment it can have taken the key: not before the call, nor
//     before the holder it took over from may have expired.
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

// olderEpoch reports whether fence f is of an older fence epoch
// (lock.WithFenceEpoch) than last. While a deployment moves between
// stores (package migrate), instances of the phase before the fence epoch
// changes still take fences of the older epoch beside those of the phase
// after it: a grant may then come with a fence below one granted before.
// It is a grant all the same (the store excluded every other holder); a
// fenced resource that saw the newer epoch refuses its writes, which the
// fault runs count apart (refusedForEpoch). Fences of one epoch must grow.
func olderEpoch(f, last uint64) bool {
	return f>>lock.FenceEpochShift < last>>lock.FenceEpochShift
}

func step(s modelState, in modelInput, out modelOutput) []modelState {
	mayHaveExpired := s.holder != "" && out.ret >= s.expiry
	switch in.kind {
	case opAcquire:
		took := modelState{holder: in.owner, lastFence: s.lastFence, expiry: in.call - in.back + in.ttl}
		switch out.res {
		case resOK:
			if s.holder != "" && !mayHaveExpired {
				return nil
			}
			if out.fence <= s.lastFence {
				if !olderEpoch(out.fence, s.lastFence) {
					return nil
				}
				return []modelState{took} // see olderEpoch
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
				// A lock the store may have granted here is freed by
				// package lock's cleanup, unrecorded: it may be gone
				// from the moment it can have been granted, which is
				// not before the call, nor before the holder it
				// would take over from may have expired.
				took.expiry = in.call
				if s.holder != "" {
					took.expiry = max(took.expiry, s.expiry)
				}
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
