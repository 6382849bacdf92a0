package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// tlsCreds are the gRPC transport credentials of a client opened from an
// etcds:// URL. They do two things gRPC's own TLS credentials do not:
//
//   - They verify the server's certificate against server_name when the
//     URL gives one. gRPC replaces the configuration's ServerName with the
//     host of the endpoint dialled (clientv3's resolver names each
//     address's host), so a tls.Config's ServerName alone is ignored.
//   - They remember why the latest TLS connection failed (the handshake,
//     or the server's alert right after it, such as "certificate
//     required"), until a connection carries data. clientv3 waits for a
//     connection until the request's context ends and then reports only
//     the context's error; Backend.storeErr adds this one.
type tlsCreds struct {
	credentials.TransportCredentials
	serverName string
	rec        *connErrs
}

// connErrs is the latest connection failure, shared by the clones of a
// tlsCreds.
type connErrs struct {
	mu     sync.Mutex
	err    error
	hungUp bool // err is only that the server hung up
}

// set records err, or clears the record when err is nil.
func (r *connErrs) set(err error) {
	r.mu.Lock()
	r.err, r.hungUp = err, false
	r.mu.Unlock()
}

// setHungUp records that the server hung up after the handshake, unless a
// more telling failure is on record: the server's alert, read before it
// hung up on an earlier connection, is often lost on this one (a write
// that meets the reset discards it).
func (r *connErrs) setHungUp(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil || r.hungUp {
		r.err = fmt.Errorf("the server hung up right after the TLS handshake; does it require a client certificate (cert_file, key_file)? %w", err)
		r.hungUp = true
	}
}

// newTLSCreds returns credentials that speak TLS with cfg.
func newTLSCreds(cfg *tls.Config) *tlsCreds {
	return &tlsCreds{
		TransportCredentials: credentials.NewTLS(cfg),
		serverName:           cfg.ServerName,
		rec:                  &connErrs{},
	}
}

// lastErr returns why the latest TLS connection failed, or nil when none
// did since a connection last carried data.
func (c *tlsCreds) lastErr() error {
	c.rec.mu.Lock()
	defer c.rec.mu.Unlock()
	return c.rec.err
}

// ClientHandshake runs the TLS handshake on raw, checking the server's
// certificate for server_name (else the endpoint's host), and records a
// failure.
func (c *tlsCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if c.serverName != "" {
		authority = c.serverName
	}
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		if ctx.Err() == nil {
			c.rec.set(err)
		}
		return nil, nil, err
	}
	return &watchedConn{Conn: conn, rec: c.rec}, info, nil
}

// Clone returns a copy that shares the record of failures.
func (c *tlsCreds) Clone() credentials.TransportCredentials {
	return &tlsCreds{TransportCredentials: c.TransportCredentials.Clone(), serverName: c.serverName, rec: c.rec}
}

// OverrideServerName is deprecated in gRPC and unused by clientv3; it
// changes the name checked, like server_name.
func (c *tlsCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}

// watchedConn is a TLS connection that records why it failed when the
// server refuses it after the handshake (TLS 1.3 checks the client's
// certificate then), and clears the record once the server sent data.
type watchedConn struct {
	net.Conn
	rec    *connErrs
	mu     sync.Mutex
	worked bool
}

func (w *watchedConn) Read(p []byte) (int, error) {
	n, err := w.Conn.Read(p)
	w.mu.Lock()
	defer w.mu.Unlock()
	var oe *net.OpError
	switch {
	case w.worked:
	case n > 0:
		w.worked = true
		w.rec.set(nil)
	case err != nil && errors.As(err, &oe) && oe.Op == "remote error":
		// The server's alert, such as "tls: certificate required".
		w.rec.set(err)
	case err != nil && !errors.Is(err, net.ErrClosed):
		w.rec.setHungUp(err)
	}
	return n, err
}

func (w *watchedConn) Write(p []byte) (int, error) {
	n, err := w.Conn.Write(p)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		w.mu.Lock()
		if !w.worked {
			w.rec.setHungUp(err)
		}
		w.mu.Unlock()
	}
	return n, err
}
