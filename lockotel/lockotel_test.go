package lockotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/distlock/lock"
	"github.com/distlock/lock/lockotel"
	"github.com/distlock/lock/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// signal passes events on to an observer, then tells the test of each
// loss: a lease reports its loss just after Done closes.
type signal struct {
	next lock.Observer
	lost chan struct{}
}

func (s signal) Observe(ctx context.Context, e lock.Event) {
	s.next.Observe(ctx, e)
	if e.Kind == lock.EventLost {
		s.lost <- struct{}{}
	}
}

// An acquire, a contended acquire, a renewal that fails and a loss, with
// the SDK's in-memory exporters: the spans and metrics each one leaves.
func TestObserver(t *testing.T) {
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(ctx)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	ob, err := lockotel.New(lockotel.WithMeterProvider(mp), lockotel.WithTracerProvider(tp), lockotel.WithBackend("memory"), lockotel.WithHashedKeys(true))
	if err != nil {
		t.Fatal(err)
	}
	obs := signal{next: ob, lost: make(chan struct{}, 1)}
	store := memory.NewStore()
	mc := store.NewBackend()
	holder, err := lock.New(mc, lock.WithObserver(obs), lock.WithTTL(100*time.Millisecond), lock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	other, err := lock.New(store.NewBackend(), lock.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	l, err := holder.TryAcquire(ctx, "user:42")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, "user:42"); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("contended TryAcquire: %v; want ErrLocked", err)
	}
	mc.Disconnect()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	if err := l.Renew(rctx); err == nil {
		t.Fatal("Renew while disconnected: nil")
	}
	cancel()
	<-obs.lost // waiting out the TTL
	mc.Reconnect()

	// Spans.
	var acquires, renews []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		switch s.Name() {
		case "lock.acquire":
			acquires = append(acquires, s)
		case "lock.renew":
			renews = append(renews, s)
		}
	}
	if len(acquires) != 2 || len(renews) != 1 {
		t.Fatalf("spans: %d lock.acquire and %d lock.renew; want 2 and 1", len(acquires), len(renews))
	}
	for i, want := range []string{"ok", "locked"} {
		s := acquires[i]
		if got := attr(s.Attributes(), "lock.outcome"); got != want {
			t.Errorf("acquire span %d: outcome %q; want %q", i, got, want)
		}
		if s.Status().Code == codes.Error {
			t.Errorf("acquire span %d (%s) has the status Error; a held key is not an error", i, want)
		}
		if key := attr(s.Attributes(), "lock.key"); key == "user:42" || len(key) != 16 {
			t.Errorf("acquire span %d: key %q; want its hash", i, key)
		}
		if attr(s.Attributes(), "lock.backend") != "memory" || !s.EndTime().After(s.StartTime()) {
			t.Errorf("acquire span %d: %v from %v to %v; want lock.backend and a duration", i, s.Attributes(), s.StartTime(), s.EndTime())
		}
	}
	if fence := attr(acquires[0].Attributes(), "lock.fence"); fence != "1" {
		t.Errorf("acquire span: fence %q; want 1", fence)
	}
	if s := renews[0]; s.Status().Code != codes.Error || attr(s.Attributes(), "lock.outcome") != "canceled" {
		t.Errorf("failed renewal span: status %v, outcome %q; want Error and canceled", s.Status(), attr(s.Attributes(), "lock.outcome"))
	}

	// Metrics.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]map[string]int64{}
	hists := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if sums[m.Name] == nil {
						sums[m.Name] = map[string]int64{}
					}
					label := ""
					for _, k := range []attribute.Key{"lock.outcome", "lock.cause"} {
						if v, ok := p.Attributes.Value(k); ok {
							label = v.AsString()
						}
					}
					sums[m.Name][label] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					hists[m.Name] += p.Count
				}
			}
		}
	}
	for _, c := range []struct {
		metric, label string
		want          int64
	}{
		{"lock.acquires", "ok", 1},
		{"lock.acquires", "locked", 1},
		{"lock.renewals", "canceled", 1},
		{"lock.renewal.failures", "", 1},
		{"lock.losses", "deadline", 1},
		{"lock.leases.held", "", 0},
	} {
		if got := sums[c.metric][c.label]; got != c.want {
			t.Errorf("%s{%s} = %d; want %d (all: %v)", c.metric, c.label, got, c.want, sums)
		}
	}
	if hists["lock.acquire.duration"] != 2 || hists["lock.hold.duration"] != 1 {
		t.Errorf("histograms: %v; want 2 acquire durations and 1 hold duration", hists)
	}
	l.Release(ctx)
}

func attr(kvs []attribute.KeyValue, key attribute.Key) string {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value.Emit()
		}
	}
	return ""
}
