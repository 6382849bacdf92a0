package lock

import (
	"context"
	"errors"
	"log/slog"
)

// WithLogger makes a Client log its own events to l (a Client option
// only; nil, the default, logs nothing): at Warn, renewals that failed,
// leases lost, acquires that failed at the store (not a held key, a
// context's end or bad input), releases whose outcome is unknown (a lost
// reply, a context that ended while the request was out) and cleanup
// releases that did not settle; at Info, cleanup releases; at Debug,
// handovers. Each record carries the key (which may hold application
// data), never the token. It does not change slog's default logger.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger, c.observerID = l, c.observerID+1 }
}

// logObserver is the observer of WithLogger: it logs the events that
// WithLogger says.
type logObserver struct{ l *slog.Logger }

func (o logObserver) Observe(ctx context.Context, e Event) {
	l := o.l
	level, msg := slog.LevelDebug, ""
	switch e.Kind {
	case EventRenew:
		if e.Err != nil {
			level, msg = slog.LevelWarn, "lock: renewal failed"
		}
	case EventLost:
		level, msg = slog.LevelWarn, "lock: lease lost"
	case EventAcquire:
		if unknownOutcome(e.Err) && !errors.Is(e.Err, ErrLocked) && !errors.Is(e.Err, context.Canceled) && !errors.Is(e.Err, context.DeadlineExceeded) {
			level, msg = slog.LevelWarn, "lock: acquire failed at the store"
		}
	case EventRelease:
		if unknownOutcome(e.Err) && !errors.Is(e.Err, ErrLost) {
			level, msg = slog.LevelWarn, "lock: release failed; its outcome is unknown, and it is sent again in the background"
		}
	case EventCleanup:
		level, msg = slog.LevelInfo, "lock: cleanup release"
		if e.Err != nil {
			level, msg = slog.LevelWarn, "lock: cleanup release did not settle; the lock expires after its TTL"
		}
	case EventHandover:
		msg = "lock: handed over to a waiting goroutine"
	}
	if msg == "" || !l.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("key", e.Key)}
	if e.Fence != 0 {
		attrs = append(attrs, slog.Uint64("fence", e.Fence))
	}
	if e.Held != 0 {
		attrs = append(attrs, slog.Duration("held", e.Held))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	l.LogAttrs(ctx, level, msg, attrs...)
}
