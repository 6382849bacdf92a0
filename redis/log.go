package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// go-redis logs through one logger for the whole process (goredis.SetLogger),
// by default to stderr; see "Logging" in the package doc for what this
// package does about it. A message is known to be about a client this
// package created by the call's context (marked by the batcher, the
// notifier and adoption) or, for failed dials, which go-redis logs on a
// context of its own, by the error (the owned clients' dialer marks it).
// The few messages go-redis logs on a background context without such an
// error (a pool that found no usable connection, a failed close, Cluster
// node selection when every node fails) cannot be told apart, and are
// printed unless SetGoRedisLogger routes them.

// SetGoRedisLogger routes the messages of go-redis's logger to l, at level
// Warn with the attribute logger=go-redis, or drops them all when l is nil.
// It replaces go-redis's logger for the whole process: every go-redis
// client's messages go there, those of clients this package did not create
// too, until someone calls goredis.SetLogger (the last call wins).
func SetGoRedisLogger(l *slog.Logger) {
	goredisLog.to.Store(&l)
	installGoRedisLogger()
}

// goredisLog is the state of the logger this package installs.
var goredisLog struct {
	once sync.Once
	to   atomic.Pointer[*slog.Logger] // nil: SetGoRedisLogger not called
}

// installGoRedisLogger installs goredisLogger as go-redis's logger, once.
func installGoRedisLogger() {
	goredisLog.once.Do(func() { goredis.SetLogger(goredisLogger{}) })
}

// stderrLog prints messages as go-redis's default logger does.
var stderrLog = log.New(os.Stderr, "redis: ", log.LstdFlags)

// goredisLogger is go-redis's logger once this package installed it.
type goredisLogger struct{}

func (goredisLogger) Printf(ctx context.Context, format string, v ...any) {
	if to := goredisLog.to.Load(); to != nil {
		if l := *to; l != nil {
			if ctx == nil {
				ctx = context.Background()
			}
			l.Log(ctx, slog.LevelWarn, strings.TrimSpace(fmt.Sprintf(format, v...)), slog.String("logger", "go-redis"))
		}
		return
	}
	if ctx != nil && ctx.Value(ownedCall{}) != nil {
		return // a backend opened from a URL: quiet
	}
	for _, arg := range v {
		var dialErr interface{ ownedDial() }
		if err, ok := arg.(error); ok && errors.As(err, &dialErr) {
			return // a failed dial of such a backend's client
		}
	}
	stderrLog.Print(fmt.Sprintf(format, v...))
}

// ownedDialer returns the dialer of the go-redis clients this package
// creates. It dials as go-redis's default dialer does (TCP keep-alive, TLS
// when tlsConfig is set), except that the TLS handshake, too, ends with
// ctx, and that it marks its errors (ownedDialError), so that go-redis's
// message about a failed dial, logged on a context of go-redis's own, is
// known to be about such a client.
func ownedDialer(tlsConfig *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	nd := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}}
	var td *tls.Dialer
	if tlsConfig != nil {
		td = &tls.Dialer{NetDialer: nd, Config: tlsConfig}
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		var err error
		if td != nil {
			c, err = td.DialContext(ctx, network, addr)
		} else {
			c, err = nd.DialContext(ctx, network, addr)
		}
		if err != nil {
			return nil, markOwnedDial(err)
		}
		return c, nil
	}
}

// ownedDialError is a failed dial of a client this package created. It
// reads and unwraps as the error it wraps. It is not a net.Error: a dial
// error that is one is an ownedNetDialError. go-redis retries a command
// whose dial failed with a net.Error, and a certificate that does not
// verify is no reason to dial again (when the ownedDialError was a
// net.Error whatever it wrapped, each rediss:// call with a wrong CA
// dialled four times, and the clients' pools started go-redis's dial
// prober, which outlives Close by up to a second).
type ownedDialError struct{ err error }

func (e *ownedDialError) Error() string { return e.err.Error() }
func (e *ownedDialError) Unwrap() error { return e.err }
func (e *ownedDialError) ownedDial()    {}

// ownedNetDialError is an ownedDialError that wraps a net.Error, and is
// one (Timeout and Temporary): go-redis classifies it as the error it
// wraps.
type ownedNetDialError struct{ ownedDialError }

func (e *ownedNetDialError) Timeout() bool {
	var ne net.Error
	return errors.As(e.err, &ne) && ne.Timeout()
}

func (e *ownedNetDialError) Temporary() bool {
	var ne interface{ Temporary() bool }
	return errors.As(e.err, &ne) && ne.Temporary()
}

// markOwnedDial wraps err, a failed dial of a client this package
// created, as an ownedDialError or, when it is a net.Error, an
// ownedNetDialError.
func markOwnedDial(err error) error {
	var ne net.Error
	if errors.As(err, &ne) {
		return &ownedNetDialError{ownedDialError{err}}
	}
	return &ownedDialError{err}
}

// ownedCall marks the context of a go-redis call made by a backend that
// owns its clients (opened from a URL), so that go-redis's messages about
// it are dropped (see goredisLogger).
type ownedCall struct{}

// markOwned returns ctx marked as a call of an owned client.
func markOwned(ctx context.Context) context.Context {
	return context.WithValue(ctx, ownedCall{}, true)
}
