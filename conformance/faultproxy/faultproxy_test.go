package faultproxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// lineServer echoes every line it reads and reports it on got.
type lineServer struct {
	ln    net.Listener
	got   chan string
	done  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	once  sync.Once
}

func startServer(t *testing.T) *lineServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &lineServer{ln: ln, got: make(chan string, 100), done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Add(1)
			go s.serve(c)
		}
	}()
	t.Cleanup(s.Close)
	return s
}

func (s *lineServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		select {
		case s.got <- strings.TrimSuffix(line, "\n"):
		case <-s.done:
			return
		}
		if _, err := io.WriteString(c, line); err != nil {
			return
		}
	}
}

func (s *lineServer) Close() {
	s.once.Do(func() {
		close(s.done)
		s.ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
}

// expectGot fails unless the server's next line is want.
func (s *lineServer) expectGot(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-s.got:
		if got != want {
			t.Fatalf("server got %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("server never got %q", want)
	}
}

// expectNothing fails if the server has received a line it has not been
// asked about.
func (s *lineServer) expectNothing(t *testing.T) {
	t.Helper()
	select {
	case got := <-s.got:
		t.Fatalf("server got %q, want nothing", got)
	default:
	}
}

type client struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// A deadline only turns a hang into a failure; nothing waits on it.
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &client{c, bufio.NewReader(c)}
}

func (c *client) send(t *testing.T, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if _, err := io.WriteString(c, l+"\n"); err != nil {
			t.Fatal(err)
		}
	}
}

func (c *client) expect(t *testing.T, lines ...string) {
	t.Helper()
	for _, want := range lines {
		got, err := c.r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading %q: %v", want, err)
		}
		if got != want+"\n" {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
}

// roundTrip sends line and expects it back, proving the connection is up
// and registered with the proxy.
func (c *client) roundTrip(t *testing.T, s *lineServer, line string) {
	t.Helper()
	c.send(t, line)
	s.expectGot(t, line)
	c.expect(t, line)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// waitReceived waits until the proxy has read at least n bytes in dir.
func waitReceived(t *testing.T, p *Proxy, dir Direction, n int64) {
	t.Helper()
	if err := p.WaitReceived(ctx(t), dir, n-1); err != nil {
		t.Fatalf("proxy read %d bytes, want %d: %v", p.Received(dir), n, err)
	}
}

// wantForwarded checks that exactly n bytes were delivered in dir. It first
// waits for n, since the count moves only after the write returns, which may
// be after the receiver has already seen the bytes.
func wantForwarded(t *testing.T, p *Proxy, dir Direction, n int64) {
	t.Helper()
	p.WaitForwarded(ctx(t), dir, n-1)
	if got := p.Forwarded(dir); got != n {
		t.Fatalf("Forwarded(%d) = %d, want %d", dir, got, n)
	}
}

func TestHoldDeliver(t *testing.T) {
	s := startServer(t)
	p := Start(t, s.ln.Addr().String())
	c := dial(t, p.Addr)
	c.roundTrip(t, s, "x") // 2 bytes each way

	p.Hold(ToServer)
	c.send(t, "a", "b", "c")
	waitReceived(t, p, ToServer, 2+6)
	wantForwarded(t, p, ToServer, 2)
	s.expectNothing(t)

	p.Deliver(ToServer)
	for _, l := range []string{"a", "b", "c"} {
		s.expectGot(t, l)
	}
	c.expect(t, "a", "b", "c")
}

func TestDrop(t *testing.T) {
	s := startServer(t)
	p := Start(t, s.ln.Addr().String())
	c := dial(t, p.Addr)
	c.roundTrip(t, s, "x")

	p.Drop(ToServer)
	c.send(t, "lost")
	waitReceived(t, p, ToServer, 2+5)
	p.Pass(ToServer)
	c.roundTrip(t, s, "kept") // the server's next line is not "lost"
	wantForwarded(t, p, ToServer, 2+5)
	if p.Conns() != 1 {
		t.Fatalf("Conns() = %d after Drop, want 1", p.Conns())
	}
}

func TestDelay(t *testing.T) {
	const d = 200 * time.Millisecond
	s := startServer(t)
	p := Start(t, s.ln.Addr().String())
	c := dial(t, p.Addr)
	c.roundTrip(t, s, "x")

	wantForwarded(t, p, ToServer, 2)

	p.Delay(ToServer, d)
	start := time.Now()
	c.send(t, "a", "b", "c")
	// The pump keeps reading while chunks wait out their delay. Nothing read
	// after start can be delivered before start+d, so the check holds
	// however slow the machine is.
	waitReceived(t, p, ToServer, 2+6)
	if n := p.Forwarded(ToServer); time.Since(start) < d && n != 2 {
		t.Fatalf("Forwarded = %d within the delay, want 2", n)
	}
	c.expect(t, "a", "b", "c")
	if el := time.Since(start); el < d {
		t.Fatalf("replies after %v, want at least %v", el, d)
	}

	for _, l := range []string{"a", "b", "c"} {
		s.expectGot(t, l)
	}
	p.Pass(ToServer)
	c.roundTrip(t, s, "y")
}

func TestFreezeOnlyOldConnections(t *testing.T) {
	s := startServer(t)
	p := Start(t, s.ln.Addr().String())
	old := dial(t, p.Addr)
	old.roundTrip(t, s, "x")

	p.Freeze(ToServer)
	old.send(t, "first")
	waitReceived(t, p, ToServer, 2+6)

	young := dial(t, p.Addr)
	young.roundTrip(t, s, "second") // overtakes "first"
	s.expectNothing(t)

	p.Thaw(ToServer)
	s.expectGot(t, "first")
	old.expect(t, "first")
}

func TestReset(t *testing.T) {
	s := startServer(t)
	p := Start(t, s.ln.Addr().String())
	c := dial(t, p.Addr)
	c.roundTrip(t, s, "x")

	p.Hold(ToServer)
	c.send(t, "held")
	waitReceived(t, p, ToServer, 2+5)
	p.Reset()
	if _, err := c.r.ReadByte(); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("read after Reset: %v, want a connection reset", err)
	}
	if p.Conns() != 0 {
		t.Fatalf("Conns() = %d after Reset, want 0", p.Conns())
	}

	p.Pass(ToServer)
	c2 := dial(t, p.Addr)
	c2.roundTrip(t, s, "new") // the server's next line is not "held"
}

func TestDirectionsIndependent(t *testing.T) {
	s := startServer(t)
	p := Start(t, s.ln.Addr().String())
	c := dial(t, p.Addr)
	c.roundTrip(t, s, "x")

	p.Hold(ToClient)
	c.send(t, "req")
	s.expectGot(t, "req")             // the request got through...
	waitReceived(t, p, ToClient, 2+4) // ...and the reply reached the proxy...
	wantForwarded(t, p, ToClient, 2)  // ...but not the client
	wantForwarded(t, p, ToServer, 2+4)

	p.Deliver(ToClient)
	c.expect(t, "req")
}

func TestCutHeal(t *testing.T) {
	s := startServer(t)
	p := Start(t, s.ln.Addr().String())
	c := dial(t, p.Addr)
	c.roundTrip(t, s, "x")

	p.Cut()
	c.send(t, "a")
	waitReceived(t, p, ToServer, 2+2)
	wantForwarded(t, p, Both, 4)
	s.expectNothing(t)

	p.Heal()
	s.expectGot(t, "a")
	c.expect(t, "a")
}

func TestWaitForwardedContext(t *testing.T) {
	s := startServer(t)
	p := Start(t, s.ln.Addr().String())
	c, cancel := context.WithCancel(t.Context())
	cancel()
	if err := p.WaitForwarded(c, Both, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitForwarded = %v, want context.Canceled", err)
	}
}

func TestCloseWhileHolding(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := startServer(t)
	p := Start(t, s.ln.Addr().String())
	c := dial(t, p.Addr)
	c.roundTrip(t, s, "x")

	p.Hold(Both)
	c.send(t, "a")
	waitReceived(t, p, ToServer, 2+2)

	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close blocked while holding")
	}
	if _, err := c.r.ReadByte(); err == nil {
		t.Fatal("read after Close succeeded")
	}
	p.Close() // idempotent
	c.Close()
	s.Close()
}
