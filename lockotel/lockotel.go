// Package lockotel reports what a lock.Client does to OpenTelemetry:
// metrics of acquires, waits, holds, renewals, losses, handovers and
// cleanup releases, and a span for each acquire, renewal and release. It
// is a module of its own, so that package lock stays free of the
// OpenTelemetry dependencies.
//
//	obs, err := lockotel.New(lockotel.WithBackend("redis"))
//	locks, err := lock.Open(ctx, url, lock.WithObserver(obs))
//
// # Metrics
//
//	lock.acquire.duration  histogram (s)  an acquisition, the wait included;
//	                                      attributes lock.outcome, lock.wait
//	lock.hold.duration     histogram (s)  how long a lease was held, to its
//	                                      release or loss; lock.end
//	lock.acquires          counter        acquisitions; lock.outcome
//	lock.renewals          counter        renewals; lock.outcome, lock.auto
//	lock.renewal.failures  counter        renewals that failed
//	lock.losses            counter        leases lost; lock.cause
//	lock.handovers         counter        releases that handed the lock to a
//	                                      goroutine of the same client
//	lock.cleanups          counter        background releases after an
//	                                      unknown outcome; lock.outcome
//	lock.leases.held       up-down        leases held now
//	lock.waiters           up-down        acquisitions waiting now
//
// lock.outcome is "ok", "locked" (the key was held), "canceled" (a
// context's end or deadline), "lost" (a renewal or release of a lease
// already lost, or that found it lost), "not-held", "invalid", "closed"
// or "error"; lock.cause is "deadline" (the deadline passed without a
// renewal), "not-held" (the store no longer held the lock) or "max-hold"
// (WithMaxHold). Every metric and span carries lock.backend when
// WithBackend names it.
//
// # Spans
//
// lock.acquire, lock.renew and lock.release, children of the span in the
// caller's context, from the operation's start to its end, with
// lock.key (hashed with WithHashedKeys), lock.backend, lock.outcome and
// lock.fence; a span whose outcome is an error other than "locked" has
// the status Error.
package lockotel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/distlock/lock"
)

// scope is the instrumentation scope of the meter and the tracer.
const scope = "github.com/distlock/lock/lockotel"

// Option configures New.
type Option func(*options)

type options struct {
	mp      metric.MeterProvider
	tp      trace.TracerProvider
	backend string
	hash    bool
}

// WithMeterProvider sets the meter provider (default: otel's global one).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) { o.mp = mp }
}

// WithTracerProvider sets the tracer provider (default: otel's global one).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tp = tp }
}

// WithBackend names the backend in the attribute lock.backend of every
// metric and span, such as "redis" or "etcd".
func WithBackend(name string) Option { return func(o *options) { o.backend = name } }

// WithHashedKeys puts a hash of each key in spans instead of the key (the
// first 16 hexadecimal digits of its SHA-256): keys may carry application
// data, such as a user or an order id. Metrics never carry keys.
func WithHashedKeys(on bool) Option { return func(o *options) { o.hash = on } }

// Observer is a lock.Observer that records metrics and spans. Give it to
// lock.New or lock.Open with lock.WithObserver. It is safe for concurrent
// use.
type Observer struct {
	o      options
	tracer trace.Tracer
	base   attribute.Set // lock.backend, when named

	acquireDur metric.Float64Histogram
	holdDur    metric.Float64Histogram
	acquires   metric.Int64Counter
	renewals   metric.Int64Counter
	renewFails metric.Int64Counter
	losses     metric.Int64Counter
	handovers  metric.Int64Counter
	cleanups   metric.Int64Counter
	held       metric.Int64UpDownCounter
	waiters    metric.Int64UpDownCounter
}

var _ lock.Observer = (*Observer)(nil)

// New returns an Observer; it fails only when the meter provider refuses
// an instrument.
func New(opts ...Option) (*Observer, error) {
	var o options
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.mp == nil {
		o.mp = otel.GetMeterProvider()
	}
	if o.tp == nil {
		o.tp = otel.GetTracerProvider()
	}
	m := o.mp.Meter(scope)
	ob := &Observer{o: o, tracer: o.tp.Tracer(scope)}
	if o.backend != "" {
		ob.base = attribute.NewSet(attribute.String("lock.backend", o.backend))
	}
	var errs []error
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"))
		errs = append(errs, err)
		return h
	}
	count := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, desc string) metric.Int64UpDownCounter {
		c, err := m.Int64UpDownCounter(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	ob.acquireDur = hist("lock.acquire.duration", "How long an acquisition took, the wait for the key included.")
	ob.holdDur = hist("lock.hold.duration", "How long a lease was held, to its release or its loss.")
	ob.acquires = count("lock.acquires", "Acquisitions, by outcome.")
	ob.renewals = count("lock.renewals", "Renewals, by outcome.")
	ob.renewFails = count("lock.renewal.failures", "Renewals that failed.")
	ob.losses = count("lock.losses", "Leases lost, by cause.")
	ob.handovers = count("lock.handovers", "Releases that handed the lock to a waiting goroutine of the same client.")
	ob.cleanups = count("lock.cleanups", "Background releases after an acquire, release or handover of unknown outcome.")
	ob.held = gauge("lock.leases.held", "Leases held now.")
	ob.waiters = gauge("lock.waiters", "Acquisitions waiting for a key now.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return ob, nil
}

// Observe implements lock.Observer.
func (ob *Observer) Observe(ctx context.Context, e lock.Event) {
	now := time.Now()
	outcome := outcomeOf(e.Err)
	switch e.Kind {
	case lock.EventAcquireStart:
		ob.waiters.Add(ctx, 1, ob.attrs())
	case lock.EventAcquire:
		if e.Wait {
			ob.waiters.Add(ctx, -1, ob.attrs())
		}
		attrs := ob.attrs(attribute.String("lock.outcome", outcome), attribute.Bool("lock.wait", e.Wait))
		ob.acquires.Add(ctx, 1, attrs)
		ob.acquireDur.Record(ctx, now.Sub(e.Start).Seconds(), attrs)
		if e.Err == nil {
			ob.held.Add(ctx, 1, ob.attrs())
		}
		ob.span(ctx, "lock.acquire", e, outcome, now)
	case lock.EventRenew:
		ob.renewals.Add(ctx, 1, ob.attrs(attribute.String("lock.outcome", outcome), attribute.Bool("lock.auto", e.Auto)))
		if e.Err != nil {
			ob.renewFails.Add(ctx, 1, ob.attrs())
		}
		ob.span(ctx, "lock.renew", e, outcome, now)
	case lock.EventRelease:
		if !errors.Is(e.Err, lock.ErrLost) {
			// A lease lost before its release left the count with
			// its EventLost.
			ob.held.Add(ctx, -1, ob.attrs())
			ob.holdDur.Record(ctx, e.Held.Seconds(), ob.attrs(attribute.String("lock.end", "release")))
		}
		ob.span(ctx, "lock.release", e, outcome, now)
	case lock.EventLost:
		ob.held.Add(ctx, -1, ob.attrs())
		ob.holdDur.Record(ctx, e.Held.Seconds(), ob.attrs(attribute.String("lock.end", "lost")))
		ob.losses.Add(ctx, 1, ob.attrs(attribute.String("lock.cause", causeOf(e.Err))))
	case lock.EventHandover:
		ob.handovers.Add(ctx, 1, ob.attrs())
	case lock.EventCleanup:
		ob.cleanups.Add(ctx, 1, ob.attrs(attribute.String("lock.outcome", outcome)))
	}
}

// attrs is the metric option of the backend's attribute and extra.
func (ob *Observer) attrs(extra ...attribute.KeyValue) metric.MeasurementOption {
	if len(extra) == 0 {
		return metric.WithAttributeSet(ob.base)
	}
	return metric.WithAttributes(append(ob.base.ToSlice(), extra...)...)
}

// span records a span of e from its start to now.
func (ob *Observer) span(ctx context.Context, name string, e lock.Event, outcome string, now time.Time) {
	key := e.Key
	if ob.o.hash {
		sum := sha256.Sum256([]byte(key))
		key = hex.EncodeToString(sum[:8])
	}
	attrs := append(ob.base.ToSlice(), attribute.String("lock.key", key), attribute.String("lock.outcome", outcome))
	if e.Fence != 0 {
		attrs = append(attrs, attribute.Int64("lock.fence", int64(e.Fence))) // below 2^63 (lock.WithFenceEpoch)
	}
	_, s := ob.tracer.Start(ctx, name, trace.WithTimestamp(e.Start), trace.WithAttributes(attrs...), trace.WithSpanKind(trace.SpanKindClient))
	if e.Err != nil && outcome != "locked" {
		s.SetStatus(codes.Error, e.Err.Error())
	}
	s.End(trace.WithTimestamp(now))
}

// outcomeOf names an operation's outcome.
func outcomeOf(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, lock.ErrLocked):
		return "locked"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	case errors.Is(err, lock.ErrLost):
		return "lost"
	case errors.Is(err, lock.ErrNotHeld):
		return "not-held"
	case errors.Is(err, lock.ErrInvalid):
		return "invalid"
	case errors.Is(err, lock.ErrClosed):
		return "closed"
	}
	return "error"
}

// causeOf names why a lease was lost.
func causeOf(err error) string {
	switch {
	case errors.Is(err, lock.ErrNotHeld):
		return "not-held"
	case err != nil && strings.Contains(err.Error(), "maximum hold time"):
		return "max-hold"
	}
	return "deadline"
}
