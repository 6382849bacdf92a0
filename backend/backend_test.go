package backend_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
)

func TestLockedErrorMatchesErrLocked(t *testing.T) {
	err := fmt.Errorf("store: %w", backend.Locked(1500*time.Millisecond))
	if !errors.Is(err, backend.ErrLocked) {
		t.Fatal("errors.Is(Locked(...), ErrLocked) is false")
	}
	var le *backend.LockedError
	if !errors.As(err, &le) || le.Remaining != 1500*time.Millisecond {
		t.Fatalf("errors.As: %+v", le)
	}
	if errors.Is(err, backend.ErrNotHeld) {
		t.Fatal("a LockedError matches ErrNotHeld")
	}
	if got := backend.Locked(0).Error(); got != backend.ErrLocked.Error() {
		t.Fatalf("message without a remaining TTL: %q", got)
	}
}

func TestLatestExpiry(t *testing.T) {
	cases := []struct {
		caps backend.Capabilities
		ttl  time.Duration
		want time.Duration
	}{
		{backend.Capabilities{}, time.Second, time.Second},
		{backend.Capabilities{ExpiryFactor: 2}, time.Second, 2 * time.Second},
		{backend.Capabilities{ExpiryFactor: 1, ExpirySlack: 100 * time.Millisecond}, time.Second, 1100 * time.Millisecond},
		{backend.Capabilities{ExpiryFactor: 0.5}, time.Second, time.Second}, // a factor below 1 counts as 1
	}
	for _, tc := range cases {
		if got := tc.caps.LatestExpiry(tc.ttl); got != tc.want {
			t.Errorf("%+v.LatestExpiry(%v) = %v; want %v", tc.caps, tc.ttl, got, tc.want)
		}
	}
}
