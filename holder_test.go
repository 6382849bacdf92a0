package lock_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
)

func TestCheckHolder(t *testing.T) {
	for _, ok := range []string{"", "host 42 prog", "büro-7 ✓", strings.Repeat("é", lock.MaxHolderLen/2)} {
		if err := lock.CheckHolder(ok); err != nil {
			t.Errorf("CheckHolder(%q): %v; want nil", ok, err)
		}
	}
	for bad, why := range map[string]string{
		"a\nb":                                   "control character U+000A at byte 1",
		"\x1b[2J":                                "control character U+001B",
		"tab\t":                                  "control character U+0009",
		"\xff":                                   "not valid UTF-8",
		strings.Repeat("x", lock.MaxHolderLen+1): "257 bytes long; at most 256",
	} {
		if err := lock.CheckHolder(bad); !errors.Is(err, lock.ErrInvalidOption) || !strings.Contains(err.Error(), why) {
			t.Errorf("CheckHolder(%.20q): %v; want ErrInvalidOption saying %q", bad, err, why)
		}
		if _, err := lock.New(memory.New(), lock.WithHolder(bad)); !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("New with WithHolder(%.20q): %v; want ErrInvalidOption", bad, err)
		}
	}
}

func TestDefaultAndSanitizedHolder(t *testing.T) {
	host, _ := os.Hostname()
	want := host + " " + strconv.Itoa(os.Getpid()) + " "
	if d := lock.DefaultHolder(); !strings.HasPrefix(d, want) || lock.CheckHolder(d) != nil {
		t.Fatalf("DefaultHolder() = %q; want %q followed by the program name, and valid", d, want)
	}
	long := strings.Repeat("é", lock.MaxHolderLen) // 2 bytes each
	for in, want := range map[string]string{
		"a\nb\x00c": "a?b?c",
		"ok\xffok":  "ok?ok",
		long:        long[:lock.MaxHolderLen],
		"x" + long:  "x" + long[:lock.MaxHolderLen-2],
	} {
		got := lock.SanitizeHolder(in)
		if got != want || lock.CheckHolder(got) != nil || !utf8.ValidString(got) {
			t.Errorf("SanitizeHolder(%.20q) = %.20q (%d bytes); want %.20q (%d bytes), valid", in, got, len(got), want, len(want))
		}
	}
}

// Client.Inspect: the description a Client or an acquisition set, the
// lease's fence (under the epoch), nothing for a free key; bad keys and
// backends that cannot be read are refused.
func TestClientInspect(t *testing.T) {
	ctx := context.Background()
	store := memory.NewStore()
	c := mustClient(t, store.NewBackend(), lock.WithHolder("client"), lock.WithFenceEpoch(3))
	l := mustTry(t, c, "k")
	if h, err := c.Inspect(ctx, "k"); err != nil || !h.Held || h.Description != "client" || h.Fence != l.Fence() || h.Remaining <= 0 {
		t.Fatalf("Inspect: %+v, %v; want held by \"client\" with fence %d and time left", h, err, l.Fence())
	}
	l2, err := c.TryAcquire(ctx, "k2", lock.WithHolder("call"))
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := c.Inspect(ctx, "k2"); h.Description != "call" {
		t.Fatalf("Inspect of a lock taken WithHolder(\"call\"): %q", h.Description)
	}
	l.Release(ctx)
	l2.Release(ctx)
	if h, err := c.Inspect(ctx, "k"); err != nil || h != (lock.Holder{}) {
		t.Fatalf("Inspect of a free key: %+v, %v; want the zero Holder", h, err)
	}
	if _, err := c.Inspect(ctx, ""); !errors.Is(err, lock.ErrInvalidKey) {
		t.Fatalf("Inspect(\"\"): %v; want ErrInvalidKey", err)
	}
	blind := mustClient(t, noInspect{memory.New()})
	if _, err := blind.Inspect(ctx, "k"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Inspect on a backend without Inspector: %v; want errors.ErrUnsupported", err)
	}
}

// noInspect hides every optional interface of a backend.
type noInspect struct{ backend.Backend }

// A backend that does not declare Labels gets no label with its grants;
// one that does gets the acquisition's.
func TestLabelReachesOnlyLabellingBackends(t *testing.T) {
	ctx := context.Background()
	for _, labels := range []bool{false, true} {
		rec := &labelRecorder{Backend: memory.New(), labels: labels}
		c := mustClient(t, rec, lock.WithHolder("h1"))
		mustTry(t, c, "k").Release(ctx)
		if want := map[bool]string{false: "", true: "h1"}[labels]; rec.got != want {
			t.Errorf("Labels %v: the backend's Acquire got label %q; want %q", labels, rec.got, want)
		}
	}
}

type labelRecorder struct {
	backend.Backend
	labels bool
	got    string
}

func (r *labelRecorder) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	r.got = backend.Label(ctx)
	return r.Backend.Acquire(ctx, key, token, ttl)
}

func (r *labelRecorder) Capabilities() backend.Capabilities {
	return backend.Capabilities{Labels: r.labels, InProcess: true}
}
