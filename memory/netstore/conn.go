package netstore

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// errNotSent: the call never left this process (its connection died first):
// it can go out on another connection.
var errNotSent = errors.New("connection closed before the request was sent")

// call is one request and, once done is closed, its reply.
type call struct {
	frame []byte
	state atomic.Int32 // queued, sent or abandoned
	done  chan struct{}
	body  []byte
	err   error
	then  func(*call) // if set, run when done, by whoever finished the call
}

const (
	queued int32 = iota
	sent
	abandoned // its caller left before it was sent: it never goes out
)

func newCall(frame []byte) *call { return &call{frame: frame, done: make(chan struct{})} }

func (cl *call) finish(body []byte, err error) {
	cl.body, cl.err = body, err
	close(cl.done)
	if cl.then != nil {
		cl.then(cl)
	}
}

// abandon gives up on a call not yet sent, and reports whether it was not.
func (cl *call) abandon() bool { return cl.state.CompareAndSwap(queued, abandoned) }

// conn is one TCP connection to the server. A writer goroutine sends the
// queued calls in order, those queued together in one write; a reader
// goroutine matches the replies to them in the same order (the server
// answers a connection's requests in order), and hands pushes to onPush.
// Queueing never blocks, so it can be done under other locks.
type conn struct {
	nc     net.Conn
	onPush func(id uint64)    // nil: pushes are not expected
	onDead func(*conn, error) // called once, when the connection dies

	mu      sync.Mutex
	out     []*call // queued
	pending []*call // sent, unanswered, in order
	err     error   // why it died; nil while alive
	kick    chan struct{}
	dead    chan struct{}
}

func newConn(nc net.Conn, onPush func(uint64), onDead func(*conn, error)) *conn {
	return &conn{nc: nc, onPush: onPush, onDead: onDead, kick: make(chan struct{}, 1), dead: make(chan struct{})}
}

func (c *conn) alive() bool {
	select {
	case <-c.dead:
		return false
	default:
		return true
	}
}

// enqueue queues cl to be sent; false when the connection is dead.
func (c *conn) enqueue(cl *call) bool {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return false
	}
	c.out = append(c.out, cl)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return true
}

func (c *conn) writeLoop() {
	bw := bufio.NewWriter(c.nc)
	var batch []*call
	for {
		select {
		case <-c.kick:
		case <-c.dead:
			return
		}
		c.mu.Lock()
		if c.err != nil {
			c.mu.Unlock()
			return
		}
		batch = batch[:0]
		for _, cl := range c.out {
			if cl.state.CompareAndSwap(queued, sent) {
				batch = append(batch, cl)
			}
		}
		clear(c.out)
		c.out = c.out[:0]
		// Pending before written: the reply cannot come earlier.
		c.pending = append(c.pending, batch...)
		c.mu.Unlock()
		for _, cl := range batch {
			bw.Write(cl.frame)
		}
		if err := bw.Flush(); err != nil {
			c.kill(err)
			return
		}
	}
}

func (c *conn) readLoop() {
	br := bufio.NewReader(c.nc)
	for {
		body, err := readFrame(br)
		if err != nil {
			c.kill(err)
			return
		}
		if body[0] == kindWake {
			p := parser{b: body[1:]}
			id := p.uint()
			if p.end() != nil || c.onPush == nil {
				c.kill(fmt.Errorf("%w: unexpected push", errFrame))
				return
			}
			c.onPush(id)
			continue
		}
		c.mu.Lock()
		if len(c.pending) == 0 {
			c.mu.Unlock()
			c.kill(fmt.Errorf("%w: a reply to no request", errFrame))
			return
		}
		cl := c.pending[0]
		c.pending[0] = nil
		c.pending = c.pending[1:]
		c.mu.Unlock()
		cl.finish(body, nil)
	}
}

// kill closes the connection: calls sent on it fail (their outcome is
// unknown), calls still queued fail with errNotSent.
func (c *conn) kill(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	pending, out := c.pending, c.out
	c.pending, c.out = nil, nil
	c.mu.Unlock()
	close(c.dead)
	c.nc.Close()
	for _, cl := range pending {
		cl.finish(nil, fmt.Errorf("connection lost: %w", err))
	}
	for _, cl := range out {
		if cl.abandon() {
			cl.finish(nil, errNotSent)
		}
	}
	if c.onDead != nil {
		c.onDead(c, err)
	}
}
