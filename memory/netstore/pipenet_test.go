package netstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// pipeNet is an in-memory network for the tests that run under
// testing/synctest: its connections are net.Pipe pairs, which block on
// channels, so that a goroutine waiting on one is durably blocked and the
// bubble's clock moves (a TCP Accept or Read would stop it). Make it in
// the bubble that uses it. Its listeners are net.Listeners for
// netstore.Serve and faultproxy.StartOn; Dial is a dialer for
// netstore.WithDialer.
type pipeNet struct {
	mu        sync.Mutex
	listeners map[string]*pipeListener
	n         int
}

func newPipeNet() *pipeNet { return &pipeNet{listeners: map[string]*pipeListener{}} }

// Listen returns a listener on a new address of the network.
func (pn *pipeNet) Listen() *pipeListener {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	pn.n++
	l := &pipeListener{pn: pn, addr: pipeAddr(fmt.Sprintf("pipe:%d", pn.n)), conns: make(chan net.Conn), done: make(chan struct{})}
	pn.listeners[string(l.addr)] = l
	return l
}

var errRefused = errors.New("connection refused")

// Dial connects to the listener at addr; the connection is made once the
// listener accepts it (as if it had no backlog).
func (pn *pipeNet) Dial(ctx context.Context, addr string) (net.Conn, error) {
	pn.mu.Lock()
	l := pn.listeners[addr]
	pn.mu.Unlock()
	if l == nil {
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: errRefused}
	}
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		client.Close()
		server.Close()
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: errRefused}
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: ctx.Err()}
	}
}

type pipeListener struct {
	pn    *pipeNet
	addr  pipeAddr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.pn.mu.Lock()
		delete(l.pn.listeners, string(l.addr))
		l.pn.mu.Unlock()
	})
	return nil
}

func (l *pipeListener) Addr() net.Addr { return l.addr }

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }
