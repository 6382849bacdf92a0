package conformance

import (
	"testing"
	"testing/synctest"
	"time"
)

// Under virtual time the recorder's readings keep their order within one
// instant, the model's TTLs are scaled alike, and the check still tells a
// takeover before the TTL from one at it.
func TestRecorderVirtualTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &suite{virtual: true}
		const ttl = 10 * time.Millisecond
		// history: a takes the key; b takes it after, with a higher
		// fence; the check passes iff b's acquire may come after a's
		// lock expired.
		history := func(after time.Duration) error {
			r := s.newRecorder()
			r.add(0, modelInput{kind: opAcquire, key: "k", owner: "a", ttl: r.dur(ttl), call: r.now()}, nil, 1)
			time.Sleep(after)
			r.add(1, modelInput{kind: opAcquire, key: "k", owner: "b", ttl: r.dur(ttl), call: r.now()}, nil, 2)
			return r.check(time.Minute)
		}
		if err := history(ttl / 2); err == nil {
			t.Error("b took the key half a TTL after a: the check passed")
		}
		if err := history(ttl); err != nil {
			t.Errorf("b took the key a TTL after a: %v", err)
		}

		r := s.newRecorder()
		a, b := r.now(), r.now()
		time.Sleep(time.Millisecond)
		c := r.now()
		if !(a < b && b < c) {
			t.Errorf("readings %d, %d, %d; want increasing", a, b, c)
		}
		if r.ns(b) != 0 || r.ns(c) != time.Millisecond {
			t.Errorf("readings %v and %v in ns; want 0 and 1ms", r.ns(b), r.ns(c))
		}
	})
}
