// Package faultproxy is a loopback TCP proxy for fault tests, for backend
// authors writing a conformance harness (see package conformance) as much as
// for this module's own tests. It forwards bytes between clients and one
// server and, on request, misbehaves in one direction or both the way a
// network does to a TCP connection: it holds bytes (a partition that drops
// packets, which TCP retransmits once it heals), drops them, delays them, or
// resets connections.
//
// Each proxied connection has, per direction, a pump goroutine that reads
// from the sender as fast as it can and a delivery goroutine that writes what
// was read to the receiver when the faults allow. Reading never waits on a
// fault, so Received tells a test that a request or reply reached the proxy
// even while it is held.
package faultproxy

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// Direction is a set of the two directions bytes travel through the proxy.
type Direction uint8

const (
	ToServer Direction = 1 << iota // client -> server (requests)
	ToClient                       // server -> client (replies)
	Both     = ToServer | ToClient
)

// dirs indexes the per-direction arrays below.
var dirs = [2]Direction{ToServer, ToClient}

// Proxy forwards connections from Addr to a target address. Its methods are
// safe for concurrent use.
type Proxy struct {
	Addr string
	dial func(ctx context.Context) (net.Conn, error) // to the target
	ln   net.Listener
	wg   sync.WaitGroup // accept loop and every connection goroutine

	mu     sync.Mutex
	wake   chan struct{} // closed and replaced whenever anything below changes
	closed bool
	hold   Direction // held on every connection
	drop   Direction
	delay  [2]time.Duration
	base   time.Duration // Latency
	recv   [2]int64      // bytes read from senders
	fwd    [2]int64      // bytes written to receivers
	conns  map[*conn]struct{}
}

// conn is one proxied connection; its fields other than the two ends are
// guarded by Proxy.mu.
type conn struct {
	client, server net.Conn
	frozen         Direction
	q              [2][]chunk // read, not yet delivered
	eof            [2]bool    // the sender has stopped
	dead           bool
}

// chunk is what one read returned, and when it may be delivered.
type chunk struct {
	b   []byte
	due time.Time
}

// Start listens on a free loopback port and forwards to target. It stops at
// the end of the test.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("tcpproxy: %v", err)
	}
	var d net.Dialer
	return StartOn(t, ln, func(ctx context.Context) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", target)
	})
}

// StartOn is Start with the caller's listener, and its dial function for
// the connections to the target: for connections that are not TCP, such
// as the in-memory pairs of net.Pipe with which a harness runs under
// testing/synctest (a TCP socket's blocking is not durable there, and
// would stop the bubble's clock). The proxy closes ln when it stops.
// Reset closes a connection that is not a *net.TCPConn plainly, since only
// TCP has an RST.
func StartOn(t testing.TB, ln net.Listener, dial func(ctx context.Context) (net.Conn, error)) *Proxy {
	t.Helper()
	p := &Proxy{Addr: ln.Addr().String(), dial: dial, ln: ln,
		wake: make(chan struct{}), conns: map[*conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		sc, err := p.dial(ctx)
		cancel()
		if err != nil {
			cc.Close()
			continue
		}
		c := &conn{client: cc, server: sc}
		p.mu.Lock()
		if p.closed { // Close ran while we dialled
			p.mu.Unlock()
			cc.Close()
			sc.Close()
			return
		}
		p.conns[c] = struct{}{}
		p.wg.Add(4)
		p.mu.Unlock()
		go p.pump(c, 0, cc)
		go p.deliver(c, 0, sc)
		go p.pump(c, 1, sc)
		go p.deliver(c, 1, cc)
	}
}

// changed wakes everyone waiting on the proxy's state. p.mu must be held.
func (p *Proxy) changed() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// pump reads from src into c's queue for direction i, or discards what it
// reads while i is dropped.
func (p *Proxy) pump(c *conn, i int, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		p.recv[i] += int64(n)
		if n > 0 && p.drop&dirs[i] == 0 && !c.dead {
			c.q[i] = append(c.q[i], chunk{bytes.Clone(buf[:n]), time.Now().Add(p.base + p.delay[i])})
		}
		if err != nil {
			c.eof[i] = true
		}
		p.changed()
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// deliver writes c's queue for direction i to dst. When the sender has
// stopped and everything it sent is delivered, it closes both ends of c, as
// the proxy always has (no half-close).
func (p *Proxy) deliver(c *conn, i int, dst net.Conn) {
	defer p.wg.Done()
	for {
		b, ok := p.next(c, i)
		if !ok {
			break
		}
		if _, err := dst.Write(b); err != nil {
			break
		}
		p.mu.Lock()
		p.fwd[i] += int64(len(b))
		p.changed()
		p.mu.Unlock()
	}
	p.mu.Lock()
	p.kill(c, false)
	p.mu.Unlock()
}

// next waits until direction i of c may deliver its first queued chunk and
// dequeues it. It reports false once c is dead, or its sender has stopped and
// the queue is empty.
func (p *Proxy) next(c *conn, i int) ([]byte, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if c.dead || len(c.q[i]) == 0 && c.eof[i] {
			return nil, false
		}
		var timer <-chan time.Time
		if len(c.q[i]) > 0 && (p.hold|c.frozen)&dirs[i] == 0 {
			wait := time.Until(c.q[i][0].due)
			if wait <= 0 {
				b := c.q[i][0].b
				c.q[i][0] = chunk{}
				c.q[i] = c.q[i][1:]
				return b, true
			}
			timer = time.After(wait)
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-timer:
		}
		p.mu.Lock()
	}
}

// kill closes both ends of c and discards what it holds; rst makes the close
// abortive, so each peer gets an RST instead of a FIN. p.mu must be held.
func (p *Proxy) kill(c *conn, rst bool) {
	if c.dead {
		return
	}
	c.dead = true
	c.q = [2][]chunk{}
	delete(p.conns, c)
	for _, nc := range []net.Conn{c.client, c.server} {
		if tc, ok := nc.(*net.TCPConn); ok && rst {
			tc.SetLinger(0)
		}
		nc.Close()
	}
	p.changed()
}

// update runs f under the lock and wakes the delivery goroutines.
func (p *Proxy) update(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
	p.changed()
}

// Hold holds bytes travelling in dir, on every connection, current and
// future, without closing anything: they are read and queued but not
// delivered until Deliver. A chunk the proxy was already writing when Hold
// was called still arrives.
func (p *Proxy) Hold(dir Direction) { p.update(func() { p.hold |= dir }) }

// Deliver ends Hold in dir: what was held is delivered, in order, as TCP
// retransmission would, and forwarding resumes. Connections frozen by Freeze
// stay frozen.
func (p *Proxy) Deliver(dir Direction) { p.update(func() { p.hold &^= dir }) }

// Cut holds both directions on every connection: Hold(Both).
func (p *Proxy) Cut() { p.Hold(Both) }

// Heal delivers what Cut held and resumes: Deliver(Both).
func (p *Proxy) Heal() { p.Deliver(Both) }

// Drop discards bytes read in dir from now on, on every connection; the
// connections stay open. Bytes already read (held or delayed) are still
// delivered. Dropping starts and stops between reads, not between messages, so
// a request or reply can be cut anywhere and the connection's protocol stream
// is left garbled; that is what a test wants when it follows Drop with Reset.
// Drop lasts until Pass(dir).
func (p *Proxy) Drop(dir Direction) { p.update(func() { p.drop |= dir }) }

// Delay delivers each chunk read in dir from now on d after it was read, on
// every connection, keeping the order of the bytes; the pump keeps reading
// meanwhile. Delay(dir, 0) or Pass(dir) ends it for chunks read afterwards;
// chunks already read keep their time.
func (p *Proxy) Delay(dir Direction, d time.Duration) {
	p.update(func() {
		for i, x := range dirs {
			if dir&x != 0 {
				p.delay[i] = d
			}
		}
	})
}

// Latency delivers every chunk read from now on, both ways, at least d
// after it was read, on top of Delay and untouched by Delay, Pass and the
// other faults: the proxy's own latency, as a network's. For in-memory
// connections under testing/synctest (see StartOn), where a round trip
// would otherwise take no time at all, and a goroutine that a reply wakes
// could run before the caller of the request has gone on: over a network
// it never does. The default is 0.
func (p *Proxy) Latency(d time.Duration) { p.update(func() { p.base = d }) }

// Pass returns dir to plain forwarding: it ends Hold, Drop, Delay and Freeze
// in dir, so anything held is delivered first (delayed chunks keep their
// time).
func (p *Proxy) Pass(dir Direction) {
	p.update(func() {
		p.hold &^= dir
		p.drop &^= dir
		for i, x := range dirs {
			if dir&x != 0 {
				p.delay[i] = 0
			}
		}
		for c := range p.conns {
			c.frozen &^= dir
		}
	})
}

// Freeze holds bytes in dir only on the connections the proxy has accepted by
// now; connections accepted later forward normally. A client with two
// connections through the proxy can thus see a request sent later on a new
// connection overtake one sent earlier on a frozen one. Thaw(dir) delivers
// and resumes.
func (p *Proxy) Freeze(dir Direction) {
	p.update(func() {
		for c := range p.conns {
			c.frozen |= dir
		}
	})
}

// Thaw delivers what Freeze held in dir, in order, and resumes forwarding on
// those connections. It does not end Hold.
func (p *Proxy) Thaw(dir Direction) {
	p.update(func() {
		for c := range p.conns {
			c.frozen &^= dir
		}
	})
}

// Reset closes every current connection abruptly, with an RST to both the
// client and the server (SetLinger(0)), discarding anything held or delayed.
// New connections are still accepted, with the faults set for the proxy
// (Hold, Drop, Delay) still in force.
func (p *Proxy) Reset() {
	p.update(func() {
		for c := range p.conns {
			p.kill(c, true)
		}
	})
}

// Conns returns how many proxied connections are open.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Forwarded returns how many bytes the proxy has delivered in dir so far,
// across all connections (summed over both directions for Both). A chunk
// counts once its write to the receiver's socket has returned, so the
// receiver may react to it a moment before the count moves.
func (p *Proxy) Forwarded(dir Direction) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return sum(&p.fwd, dir)
}

// WaitForwarded blocks until more than n bytes have been delivered in dir
// (Forwarded(dir) > n), or ctx ends, and then returns ctx.Err().
func (p *Proxy) WaitForwarded(ctx context.Context, dir Direction, n int64) error {
	return p.waitFor(ctx, func() bool { return sum(&p.fwd, dir) > n })
}

// Received returns how many bytes the proxy has read from the sending side in
// dir so far, across all connections, including bytes held or dropped: it
// tells a test that a request or reply reached the proxy.
func (p *Proxy) Received(dir Direction) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return sum(&p.recv, dir)
}

// WaitReceived blocks until more than n bytes have been read in dir
// (Received(dir) > n), or ctx ends, and then returns ctx.Err().
func (p *Proxy) WaitReceived(ctx context.Context, dir Direction, n int64) error {
	return p.waitFor(ctx, func() bool { return sum(&p.recv, dir) > n })
}

func sum(v *[2]int64, dir Direction) (n int64) {
	for i, x := range dirs {
		if dir&x != 0 {
			n += v[i]
		}
	}
	return n
}

// waitFor blocks until cond, called with p.mu held, is true or ctx ends.
func (p *Proxy) waitFor(ctx context.Context, cond func() bool) error {
	p.mu.Lock()
	for !cond() {
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
		p.mu.Lock()
	}
	p.mu.Unlock()
	return nil
}

// Close ends every fault, stops listening, closes every connection
// (discarding anything still held) and waits for all the proxy's goroutines.
// Holding never blocks it. It is idempotent.
func (p *Proxy) Close() {
	p.ln.Close()
	p.update(func() {
		p.closed = true
		p.hold, p.drop, p.delay = 0, 0, [2]time.Duration{}
		for c := range p.conns {
			p.kill(c, false)
		}
	})
	p.wg.Wait()
}
