package faultproxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// pipeListener is a net.Listener of in-memory connections (net.Pipe), for
// a proxy under testing/synctest.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error { l.once.Do(func() { close(l.done) }); return nil }

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// StartOn runs a proxy over in-memory connections in a bubble, where time
// is virtual: a line's round trip through it then takes exactly twice its
// Latency, plus twice a Delay; Pass ends the Delay and keeps the Latency.
func TestStartOnLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var wg sync.WaitGroup
		defer wg.Wait()
		// The target: echoes every line on every connection.
		echo := func(context.Context) (net.Conn, error) {
			c, s := net.Pipe()
			wg.Go(func() {
				defer s.Close()
				r := bufio.NewReader(s)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := io.WriteString(s, line); err != nil {
						return
					}
				}
			})
			return c, nil
		}
		ln := newPipeListener()
		p := StartOn(t, ln, echo)
		defer p.Close()
		const latency = 50 * time.Microsecond
		p.Latency(latency)

		c, s := net.Pipe()
		defer c.Close()
		ln.conns <- s
		r := bufio.NewReader(c)
		roundTrip := func(want time.Duration) {
			t.Helper()
			start := time.Now()
			if _, err := io.WriteString(c, "ping\n"); err != nil {
				t.Fatal(err)
			}
			line, err := r.ReadString('\n')
			if err != nil || line != "ping\n" {
				t.Fatalf("read %q, %v; want the echo", line, err)
			}
			if got := time.Since(start); got != want {
				t.Errorf("round trip %v; want %v", got, want)
			}
		}
		roundTrip(2 * latency)
		p.Delay(Both, 10*time.Millisecond)
		roundTrip(2 * (latency + 10*time.Millisecond))
		p.Pass(Both)
		roundTrip(2 * latency)
		p.Latency(0)
		roundTrip(0)
	})
}
