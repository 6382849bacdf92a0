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
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// go-redis logs through one logger for the whole process (goredis.SetLogger),
// by default to stderr; see "Logging" in the package doc. This package
// never replaces it on its own: only SetGoRedisLogger and
// SetQuietGoRedisLogger do, when the program calls them. The clients this
// package creates (backends opened from a URL) mark what go-redis may log
// about them, so that the logger those functions install can tell: a call's
// context is marked by the batcher, the notifier and adoption, and a failed
// dial, which go-redis logs on a context of its own, by its error (the
// owned clients' dialer marks it). The few messages go-redis logs on a
// background context without such an error (a pool that found no usable
// connection, a failed close, Cluster node selection when every node
// fails) cannot be told apart, and are printed.

// SetGoRedisLogger routes the messages of go-redis's logger to l, at level
// Warn with the attribute logger=go-redis, or drops them all when l is nil.
// It replaces go-redis's logger for the whole process: every go-redis
// client's messages go there, those of clients this package did not create
// too, until the next call of SetGoRedisLogger, SetQuietGoRedisLogger or
// goredis.SetLogger (the last call wins). Nothing in this package calls it:
// a program that wants it calls it, once, before it opens backends.
func SetGoRedisLogger(l *slog.Logger) {
	goredisLog.Store(&l)
	goredis.SetLogger(goredisLogger{})
}

// SetQuietGoRedisLogger replaces go-redis's logger for the whole process
// with one that drops go-redis's messages about the clients this package
// created (backends opened from a URL with lock.Open) and prints every
// other message to stderr, as go-redis's default logger does. Without it,
// go-redis prints several lines to stderr per call while a server is
// unreachable, those about backends opened from a URL too. It lasts until
// the next call of SetQuietGoRedisLogger, SetGoRedisLogger or
// goredis.SetLogger (the last call wins). Nothing in this package calls
// it: a program (not a library) that wants it calls it, once, before it
// opens backends.
func SetQuietGoRedisLogger() {
	goredisLog.Store(nil)
	goredis.SetLogger(goredisLogger{})
}

// goredisLog is where the logger of SetGoRedisLogger and
// SetQuietGoRedisLogger sends go-redis's messages: nil after
// SetQuietGoRedisLogger (quiet about owned clients, the rest to stderr),
// else the *slog.Logger of SetGoRedisLogger (nil: drop them all).
var goredisLog atomic.Pointer[*slog.Logger]

// stderrLog prints messages as go-redis's default logger does.
var stderrLog = log.New(os.Stderr, "redis: ", log.LstdFlags)

// goredisLogger is the go-redis logger that SetGoRedisLogger and
// SetQuietGoRedisLogger install.
type goredisLogger struct{}

func (goredisLogger) Printf(ctx context.Context, format string, v ...any) {
	if to := goredisLog.Load(); to != nil {
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
// known to be about such a client (see SetQuietGoRedisLogger).
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
// it are dropped when the program installed SetQuietGoRedisLogger (see
// goredisLogger).
type ownedCall struct{}

// markOwned returns ctx marked as a call of an owned client.
func markOwned(ctx context.Context) context.Context {
	return context.WithValue(ctx, ownedCall{}, true)
}
