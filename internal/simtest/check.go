package simtest

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/distlock/lock"
)

// The checkers, run on every simulated run, all on the bubble's one
// virtual clock:
//
//   - exclusion: the validity intervals of the leases of one key never
//     overlap. A lease is valid from Acquire's return until the earliest
//     of its release (the call), its lost signal (Done closing when it was
//     lost) and its last deadline;
//   - fences: in the order of those intervals (those that lasted at all),
//     fences strictly increase per key; the fenced resource (fence.Guard)
//     never refuses a write of a lease that is still valid (see
//     worker.write);
//   - lost signal: a lease that was lost saw Done close no later than its
//     deadline, and no deadline it reported was ever further ahead than
//     lease's TTL less drift;
//   - nothing left behind: once the faults stop, every lock expires
//     within a TTL of the last request landing, and after a phase without
//     faults in which acquires are given up on purpose, with every client
//     closed, the store holds no lock and no watch;
//   - liveness: in the phase without faults every patient waiter is
//     served (see worker.calm).

// leaseRec is one lease as the harness saw it.
type leaseRec struct {
	client, worker int
	key            string
	kind           int
	ttl            time.Duration // the lease's, as asked
	fence          uint64
	token          string
	start          time.Time // Acquire returned
	release        time.Time // Release was called
	done           time.Time // Done closed
	relErr, err    error
	obs            []observation // Lease.Deadline over time
	l              *lock.Lease
	clk            clientClock // the client's
}

// observation is a reading of Lease.Deadline: when (true time), the
// deadline converted to true time, and how far ahead it was on the
// client's clock.
type observation struct {
	at, deadline time.Time
	ahead        time.Duration
}

func (r *leaseRec) observe(l *lock.Lease) {
	dl := l.Deadline()
	r.obs = append(r.obs, observation{at: time.Now(), deadline: r.clk.True(dl), ahead: r.clk.Until(dl)})
}

// lastDeadline is the deadline the lease reported last.
func (r *leaseRec) lastDeadline() time.Time { return r.obs[len(r.obs)-1].deadline }

// lost reports whether the lease was lost before its release.
func (r *leaseRec) lost() bool { return r.err != nil && errors.Is(r.err, lock.ErrLost) }

// end is when the lease stopped being valid.
func (r *leaseRec) end() time.Time {
	e := r.release
	if r.lost() && r.done.Before(e) {
		e = r.done
	}
	if d := r.lastDeadline(); d.Before(e) {
		e = d
	}
	return e
}

// history collects the leases and violations of a run.
type history struct {
	ttl   time.Duration // the run's
	start time.Time

	mu         sync.Mutex
	leases     []*leaseRec
	violations []string
	kinds      map[string]int // violations seen, by format
	dropped    int            // violations not kept
	nCancelled int
	dataLost   bool // a store node restarted empty
}

func (h *history) loseData() {
	h.mu.Lock()
	h.dataLost = true
	h.mu.Unlock()
}

func (h *history) lostData() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dataLost
}

// maxViolations bounds the violations kept of each kind (each call site's
// format is a kind), so that one checker's flood does not hide another's.
const maxViolations = 10

func (h *history) violate(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.kinds == nil {
		h.kinds = map[string]int{}
	}
	if h.kinds[format]++; h.kinds[format] > maxViolations {
		h.dropped++
		return
	}
	h.violations = append(h.violations, fmt.Sprintf("%v ", time.Since(h.start))+fmt.Sprintf(format, args...))
}

func (h *history) add(r *leaseRec) {
	h.mu.Lock()
	h.leases = append(h.leases, r)
	h.mu.Unlock()
}

func (h *history) cancelled() {
	h.mu.Lock()
	h.nCancelled++
	h.mu.Unlock()
}

func (h *history) lastGrant() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var t time.Time
	for _, r := range h.leases {
		if r.start.After(t) {
			t = r.start
		}
	}
	return t
}

func (h *history) at(t time.Time) time.Duration { return t.Sub(h.start) }

func (h *history) describe(r *leaseRec) string {
	return fmt.Sprintf("client %d worker %d (%s, TTL %v, fence %d, token %.8s) valid %v..%v", r.client, r.worker, kindNames[r.kind], r.ttl, r.fence, r.token, h.at(r.start), h.at(r.end()))
}

// check runs the checkers over the history and fills res.
func (h *history) check(res *Result) {
	h.mu.Lock()
	leases := slices.Clone(h.leases)
	res.Cancelled = h.nCancelled
	h.mu.Unlock()
	res.Sections = len(leases)
	byKey := map[string][]*leaseRec{}
	for _, r := range leases {
		if r.lost() {
			res.Lost++
			// A lease whose grant came back after its deadline (a
			// slow reply) is lost as it is made: Done cannot close
			// before Acquire returns.
			due := r.lastDeadline()
			if r.start.After(due) {
				due = r.start
				res.DeadOnArrival++
			}
			// A drifting client's timers fire when its clock reaches
			// the deadline; in true time that may round a few
			// nanoseconds past the deadline converted.
			if r.clk.Rate() != 1 {
				due = due.Add(time.Microsecond)
			}
			if r.done.After(due) {
				h.violate("lost signal late: %s: Done closed at %v, %v after its deadline %v", h.describe(r), h.at(r.done), r.done.Sub(due), h.at(r.lastDeadline()))
			}
		}
		for _, o := range r.obs {
			if drift := lock.DefaultDrift(r.ttl); o.ahead > r.ttl-drift {
				h.violate("deadline too far ahead: %s reported at %v a deadline %v ahead on its clock, more than its TTL %v less drift %v", h.describe(r), h.at(o.at), o.ahead, r.ttl, drift)
			}
		}
		if r.end().After(r.start) {
			byKey[r.key] = append(byKey[r.key], r)
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		ivs := byKey[k]
		slices.SortFunc(ivs, func(a, b *leaseRec) int { return cmp.Or(a.start.Compare(b.start), cmp.Compare(a.fence, b.fence)) })
		var last *leaseRec // the interval that ends last so far
		for i, r := range ivs {
			if last != nil && r.start.Before(last.end()) {
				h.violate("overlap on %q: %s and %s", k, h.describe(last), h.describe(r))
			}
			if i > 0 && r.fence <= ivs[i-1].fence {
				h.violate("fences out of order on %q: %s after %s", k, h.describe(r), h.describe(ivs[i-1]))
			}
			if last == nil || r.end().After(last.end()) {
				last = r
			}
		}
	}
	res.Leases = h.leasesOf(leases, res)
	h.mu.Lock()
	res.Violations = slices.Clone(h.violations)
	if h.dropped > 0 {
		res.Violations = append(res.Violations, fmt.Sprintf("(%d more violations of the kinds above)", h.dropped))
	}
	h.mu.Unlock()
}

// leasesOf describes the leases of the keys that h's violations name (a
// key is named quoted), in the order they were granted: the part of the
// history that a failing run's reader needs.
func (h *history) leasesOf(leases []*leaseRec, res *Result) []string {
	h.mu.Lock()
	named := func(key string) bool {
		for _, v := range h.violations {
			if strings.Contains(v, fmt.Sprintf("%q", key)) {
				return true
			}
		}
		return false
	}
	h.mu.Unlock()
	var out []*leaseRec
	for _, r := range leases {
		if named(r.key) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *leaseRec) int { return a.start.Compare(b.start) })
	var lines []string
	for _, r := range out {
		line := fmt.Sprintf("%q %s; release called %v, Done %v, last deadline %v", r.key, h.describe(r), h.at(r.release), h.at(r.done), h.at(r.lastDeadline()))
		if r.err != nil {
			line += fmt.Sprintf("; Err %v", r.err)
		}
		if r.relErr != nil {
			line += fmt.Sprintf("; Release: %v", r.relErr)
		}
		lines = append(lines, line)
	}
	return lines
}
