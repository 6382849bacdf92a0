package simredis

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/distlock/lock/internal/simtest"
)

// The simulated network between the go-redis clients and the in-process
// Redis servers. Each connection a client dials is a link: two in-memory
// pipes (net.Pipe, made inside the bubble, so that blocked reads count as
// durably blocked and virtual time moves on), joined by two pumps, one per
// direction. A pump reads what one side writes as chunks (a command, a
// pipeline, a reply, a pushed message) and delivers them in order, each
// after a latency of its own, as TCP does: a chunk held back holds back
// everything behind it on the same connection, while other connections of
// the same client overtake it. While faults are on, a chunk may also meet
// one of the faults a real network has (see link.draw).

// errCutOff is what a dial returns while the client is cut off.
var errCutOff = errors.New("simredis: no route to the server (client cut off)")

// simnet is the network of one run.
type simnet struct {
	ttl   time.Duration
	log   func(format string, args ...any)
	nodes []*node

	mu       sync.Mutex
	on       bool              // per-chunk faults are drawn
	cutUntil map[int]time.Time // client -> cut off until then
	sent     map[string]int    // commands sent, by name
}

func (n *simnet) faultsOn() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.on
}

func (n *simnet) cutOff(client int) (bool, time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	until := n.cutUntil[client]
	return time.Now().Before(until), until
}

// count counts the commands of a chunk a client sent (RESP arrays of bulk
// strings, as go-redis writes them).
func (n *simnet) count(chunk []byte) {
	names := commandNames(chunk)
	if len(names) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sent == nil {
		n.sent = map[string]int{}
	}
	for _, c := range names {
		n.sent[c]++
	}
}

// commandNames returns the name of each command in chunk, upper-cased
// ("EVALSHA", "SUBSCRIBE"); it stops at the first thing it cannot parse.
func commandNames(chunk []byte) []string {
	var out []string
	for len(chunk) > 0 && chunk[0] == '*' {
		n, rest, ok := respLen(chunk[1:])
		if !ok {
			return out
		}
		chunk = rest
		for i := 0; i < n; i++ {
			if len(chunk) == 0 || chunk[0] != '$' {
				return out
			}
			l, rest, ok := respLen(chunk[1:])
			if !ok || len(rest) < l+2 {
				return out
			}
			if i == 0 {
				out = append(out, string(bytes.ToUpper(rest[:l])))
			}
			chunk = rest[l+2:]
		}
	}
	return out
}

func respLen(b []byte) (int, []byte, bool) {
	i := bytes.Index(b, []byte("\r\n"))
	if i < 0 {
		return 0, nil, false
	}
	n, err := strconv.Atoi(string(b[:i]))
	if err != nil || n < 0 {
		return 0, nil, false
	}
	return n, b[i+2:], true
}

// node is one in-process Redis server and the gate of its pauses.
type node struct {
	id   int
	srv  server
	mu   sync.Mutex
	gate chan struct{} // not nil while paused; closed at resume
	live map[*link]struct{}
}

// server is what a node needs of an in-process Redis server.
type server interface {
	Dial() (net.Conn, error)
}

// wait waits while the node is paused, or until done is closed.
func (nd *node) wait(done <-chan struct{}) {
	nd.mu.Lock()
	g := nd.gate
	nd.mu.Unlock()
	if g != nil {
		select {
		case <-g:
		case <-done:
		}
	}
}

func (nd *node) pause() {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.gate == nil {
		nd.gate = make(chan struct{})
	}
}

func (nd *node) resume() {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.gate != nil {
		close(nd.gate)
		nd.gate = nil
	}
}

// restart breaks every connection to the node, as a restart does; the
// server keeps its data.
func (nd *node) restart() {
	nd.mu.Lock()
	links := make([]*link, 0, len(nd.live))
	for l := range nd.live {
		links = append(links, l)
	}
	nd.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// dialer returns the go-redis Dialer of client's connections to nd. Each
// link draws its fates from a stream of its own, made from r.
func (n *simnet) dialer(client int, nd *node, r *rand.Rand, timeout time.Duration) func() (net.Conn, error) {
	var mu sync.Mutex
	return func() (net.Conn, error) {
		if cut, _ := n.cutOff(client); cut {
			// At once, not after the dial timeout: see setup.
			return nil, errCutOff
		}
		sc, err := nd.srv.Dial()
		if err != nil {
			return nil, err
		}
		mu.Lock()
		lr := rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
		mu.Unlock()
		cc, pc := net.Pipe()
		l := &link{n: n, nd: nd, client: client, r: lr, cc: pc, sc: sc, done: make(chan struct{})}
		nd.mu.Lock()
		if nd.live == nil {
			nd.live = map[*link]struct{}{}
		}
		nd.live[l] = struct{}{}
		nd.mu.Unlock()
		l.start()
		return clientConn{cc}, nil
	}
}

// clientConn is the client's end of a link. A write after the network
// closed the link (a reset, a restart) fails with io.EOF, as a read of the
// TCP connection would: go-redis then sends the command again on another
// connection, as it does when its pool's health check finds a pooled TCP
// connection closed before use (net.Pipe offers no such check). The
// command never reached the server, so sending it again is exact.
type clientConn struct{ net.Conn }

// SetDeadline, SetReadDeadline and SetWriteDeadline succeed on a link the
// network closed, as they do on a TCP connection its peer closed (net.Pipe
// refuses them); the read or write that follows fails.
func (c clientConn) SetDeadline(t time.Time) error      { return opened(c.Conn.SetDeadline(t)) }
func (c clientConn) SetReadDeadline(t time.Time) error  { return opened(c.Conn.SetReadDeadline(t)) }
func (c clientConn) SetWriteDeadline(t time.Time) error { return opened(c.Conn.SetWriteDeadline(t)) }

func opened(err error) error {
	if errors.Is(err, io.ErrClosedPipe) {
		return nil
	}
	return err
}

func (c clientConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if errors.Is(err, io.ErrClosedPipe) && n == 0 {
		err = io.EOF
	}
	return n, err
}

// link is one connection of a client to a node, through the simulated
// network.
type link struct {
	n      *simnet
	nd     *node
	client int
	cc, sc net.Conn      // the network's end of the client's pipe; the client end of the server's
	done   chan struct{} // closed by close: a delivery waiting out its delay stops waiting

	mu        sync.Mutex
	r         *rand.Rand
	silent    bool          // nothing crosses any more, either way (a connection gone dead)
	dropReply int           // replies to drop before the link goes silent or resets (see draw)
	resetNext bool          // after dropping, reset rather than go silent
	delayNext time.Duration // extra delay of the next reply
	setups    int           // replies to set-up commands still to come
	closed    bool
}

type chunk struct {
	b    []byte
	at   time.Time // when it is delivered
	init bool      // part of the connection's set-up (see setup)
}

// setup reports whether every command of a chunk is one go-redis sends to
// set a new connection up (HELLO, CLIENT SETINFO, AUTH, SELECT). The set-up
// and its replies cross the network at once, without faults, pauses or
// partitions: go-redis sets a subscription's connection up while holding
// the subscription's mutex, which its receiving goroutine then waits for,
// and in a synctest bubble virtual time stands still while any goroutine
// waits for a mutex, so a set-up that took virtual time would stop the
// run. What a set-up may meet is simulated around it instead: a dial into
// a partition fails, and faults meet the connection's first command.
func setup(names []string) bool {
	if len(names) == 0 {
		return false
	}
	for _, n := range names {
		switch n {
		case "HELLO", "CLIENT", "AUTH", "SELECT":
		default:
			return false
		}
	}
	return true
}

func (l *link) start() {
	up := make(chan chunk, 256)
	down := make(chan chunk, 256)
	go l.read(l.cc, up, true)
	go l.deliver(up, l.sc, true)
	go l.read(l.sc, down, false)
	go l.deliver(down, l.cc, false)
}

// read reads chunks from src and queues them for delivery, each no
// earlier than the one before it (one connection keeps its order).
func (l *link) read(src net.Conn, q chan<- chunk, toServer bool) {
	defer close(q)
	buf := make([]byte, 64<<10)
	var last time.Time
	for {
		k, err := src.Read(buf)
		if k > 0 {
			b := bytes.Clone(buf[:k])
			if toServer {
				l.n.count(b)
			}
			d, init := l.draw(b, toServer)
			at := time.Now().Add(d)
			if at.Before(last) {
				at = last
			}
			last = at
			q <- chunk{b, at, init}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
				l.n.log("link of client %d to node %d: read: %v", l.client, l.nd.id, err)
			}
			l.close()
			return
		}
	}
}

// deliver writes the queued chunks to dst at their times, unless the link
// went silent or is cut off by then. A chunk for a paused node waits.
func (l *link) deliver(q <-chan chunk, dst net.Conn, toServer bool) {
	for c := range q {
		if !l.await(c.at) {
			continue // the link closed: drain the queue so its reader can end
		}
		if c.init {
			if _, err := dst.Write(c.b); err != nil {
				l.close()
			}
			continue
		}
		if toServer {
			l.nd.wait(l.done)
		}
		if cut, _ := l.n.cutOff(l.client); cut {
			l.goSilent()
		}
		if !toServer && !l.passReply() {
			continue
		}
		l.mu.Lock()
		silent := l.silent
		l.mu.Unlock()
		if silent {
			continue // lost; the reader drains the queue until the link closes
		}
		if _, err := dst.Write(c.b); err != nil {
			l.close()
		}
	}
}

// await waits until at, or until the link closes, and reports whether the
// link is still open. A delivery must not outlive its link: once the
// run's main goroutine has returned, a synctest bubble's clock stops, and
// a goroutine still sleeping out a chunk's delay would never end.
func (l *link) await(at time.Time) bool {
	if d := time.Until(at); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
		}
	}
	select {
	case <-l.done:
		return false
	default:
		return true
	}
}

// passReply reports whether a reply chunk is delivered; a drop marked by
// draw happens here: the reply is lost after the store acted, and the link
// then resets or goes silent.
func (l *link) passReply() bool {
	l.mu.Lock()
	if l.dropReply == 0 {
		l.mu.Unlock()
		return true
	}
	l.dropReply--
	reset := l.resetNext
	l.mu.Unlock()
	if reset {
		l.close() // the client sees the connection end, and retries
	} else {
		l.goSilent()
	}
	return false
}

func (l *link) goSilent() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.silent = true
}

// close ends the link both ways: each side sees its connection end.
func (l *link) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.done)
	l.mu.Unlock()
	l.cc.Close()
	l.sc.Close()
	l.nd.mu.Lock()
	delete(l.nd.live, l)
	l.nd.mu.Unlock()
}

// draw decides the fate of a chunk as it is sent and returns its delay.
// A chunk to the server (a command or a pipeline), while faults are on:
// lost with the connection gone silent after it (the client times out); its
// reply lost after the server acted, the connection then reset (go-redis
// retries the command: the server runs it twice) or silent; held back a
// quarter of the TTL to over two TTLs (the caller's context may end before
// the server acts); or its reply held back as long (the server acted; the
// caller may have given up). A chunk from the server that is not a reply
// marked above (a reply or a pushed message): now and then held back, or
// the connection goes silent before it.
func (l *link) draw(b []byte, toServer bool) (d time.Duration, init bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var names []string
	if toServer {
		names = commandNames(b)
		if setup(names) {
			l.setups += len(names)
			return 0, true
		}
	} else if l.setups > 0 {
		l.setups--
		return 0, true
	}
	r := l.r
	d = simtest.Latency(r)
	x := r.IntN(1000) // drawn whether or not faults are on
	if !l.n.faultsOn() {
		if !toServer && l.delayNext > 0 {
			d += l.delayNext
			l.delayNext = 0
		}
		return d, false
	}
	ttl := l.n.ttl
	long := ttl/4 + time.Duration(r.Int64N(int64(2*ttl)))
	var what string
	if toServer {
		switch {
		case x < 15:
			l.silent = true
			what = "request lost, the connection silent after it"
		case x < 30:
			l.dropReply++
			l.resetNext = r.IntN(2) == 0
			what = "reply lost after the server acted, then the connection " + map[bool]string{true: "reset (the client retries)", false: "silent"}[l.resetNext]
		case x < 45:
			d += long
			what = fmt.Sprintf("request held back %v", d)
		case x < 60:
			l.delayNext = long
			what = fmt.Sprintf("reply held back %v after the server acted", long)
		default:
			return d, false
		}
		l.n.log("client %d to node %d: %v: %s", l.client, l.nd.id, names, what)
		return d, false
	}
	if l.delayNext > 0 {
		d += l.delayNext
		l.delayNext = 0
		return d, false
	}
	switch {
	case x < 10:
		d += long
		what = fmt.Sprintf("held back %v", d)
	case x < 13:
		l.silent = true
		what = "the connection silent from here"
	default:
		return d, false
	}
	l.n.log("node %d to client %d: %.40q: %s", l.nd.id, l.client, b, what)
	return d, false
}
