package netstore

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/memory"
)

// Server serves a memory.Store over TCP.
type Server struct {
	ln     net.Listener
	store  *memory.Backend // the server's one client of the store
	ctx    context.Context
	cancel context.CancelFunc // unblocks calls waiting on a paused store

	mu     sync.Mutex
	conns  map[*serverConn]struct{}
	closed bool
	wg     sync.WaitGroup // accept loop and connections
}

// Serve serves s on ln until Close, on goroutines of its own. It makes s
// keep released tokens dead for memory.DeadTokenTTL, since the requests of
// one client may reach it out of order.
func Serve(ln net.Listener, s *memory.Store) *Server {
	s.KeepDeadTokens(memory.DeadTokenTTL)
	ctx, cancel := context.WithCancel(context.Background())
	srv := &Server{ln: ln, store: s.NewBackend(), ctx: ctx, cancel: cancel, conns: map[*serverConn]struct{}{}}
	srv.wg.Add(1)
	go srv.accept()
	return srv
}

// Addr returns the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops listening, closes every connection (their watches end; their
// requests not yet answered may or may not have taken effect) and waits for
// the server's goroutines. The store keeps its locks: a new Server over it
// carries on. Close is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.cancel()
	for _, c := range conns {
		c.nc.Close()
	}
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	delay := time.Millisecond
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			var ne net.Error
			if closed || !errors.As(err, &ne) || !ne.Timeout() {
				return
			}
			time.Sleep(delay) // out of file descriptors, say: back off
			delay = min(2*delay, time.Second)
			continue
		}
		delay = time.Millisecond
		c := &serverConn{srv: s, nc: nc, watches: map[uint64]*serverWatch{}}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// serverConn is one client connection. Its goroutine reads a request,
// runs it on the store and writes the reply, one at a time: replies go out
// in request order. Watches push wake-ups from goroutines of their own.
type serverConn struct {
	srv *Server
	nc  net.Conn

	wmu sync.Mutex // bw
	bw  *bufio.Writer

	mu      sync.Mutex
	watches map[uint64]*serverWatch
	wg      sync.WaitGroup // watch goroutines
}

type serverWatch struct {
	w    backend.Watch
	stop chan struct{}
}

func (c *serverConn) serve() {
	defer c.srv.wg.Done()
	defer c.close()
	c.bw = bufio.NewWriter(c.nc)
	br := bufio.NewReader(c.nc)
	for {
		body, err := readFrame(br)
		if err != nil {
			return
		}
		reply, ok := c.handle(body)
		c.wmu.Lock()
		c.bw.Write(reply)
		if !ok || !frameReady(br) { // answer the rest of a pipeline first
			err = c.bw.Flush()
		}
		c.wmu.Unlock()
		if err != nil || !ok {
			return // a malformed request: the stream cannot be trusted
		}
	}
}

// close ends the connection and its watches: a watch that ends without
// the key passes its wake-up on to the next watcher of the key.
func (c *serverConn) close() {
	c.nc.Close()
	c.mu.Lock()
	for id, sw := range c.watches {
		delete(c.watches, id)
		sw.end()
	}
	c.mu.Unlock()
	c.wg.Wait()
	c.srv.mu.Lock()
	delete(c.srv.conns, c)
	c.srv.mu.Unlock()
}

// end closes the watch as one that did not take the key: the store passes
// the wake-up on if the key is free. The client's word that it took the key
// could be stale: its release may have overtaken its unwatch.
func (sw *serverWatch) end() {
	close(sw.stop)
	sw.w.Close(false)
}

// handle runs one request and returns its reply; ok is false when the
// request was malformed.
func (c *serverConn) handle(body []byte) (reply []byte, ok bool) {
	ctx, st := c.srv.ctx, c.srv.store
	p := parser{b: body[1:]}
	switch body[0] {
	case opAcquire, opRenew:
		key, token, ttl := p.string(), p.string(), p.duration()
		if p.end() != nil {
			break
		}
		var g backend.Grant
		var err error
		if body[0] == opAcquire {
			g, err = st.Acquire(ctx, key, token, ttl)
		} else {
			g, err = st.Renew(ctx, key, token, ttl)
		}
		if err != nil {
			return errorReply(err), true
		}
		return done(putDuration(putUint(frame(kindOK), g.Fence), g.TTL)), true
	case opRelease:
		key, token := p.string(), p.string()
		if p.end() != nil {
			break
		}
		if err := st.Release(ctx, key, token); err != nil {
			return errorReply(err), true
		}
		return done(frame(kindOK)), true
	case opTransfer:
		key, from, to, ttl := p.string(), p.string(), p.string(), p.duration()
		opt := backend.TransferOptions{Fence: p.uint(), Reserve: p.bool()}
		if p.end() != nil {
			break
		}
		t, err := st.Transfer(ctx, key, from, to, ttl, opt)
		if err != nil {
			return errorReply(err), true
		}
		return done(putUint(putDuration(putUint(frame(kindOK), t.Fence), t.TTL), t.Next)), true
	case opInspect:
		key := p.string()
		if p.end() != nil {
			break
		}
		h, err := st.Inspect(ctx, key)
		if err != nil {
			return errorReply(err), true
		}
		f := putString(putBool(frame(kindOK), h.Held), h.Token)
		return done(putDuration(putUint(f, h.Fence), h.Remaining)), true
	case opWatch:
		id, key := p.uint(), p.string()
		if p.end() != nil {
			break
		}
		w, err := st.Watch(ctx, key)
		if err != nil {
			return errorReply(err), true
		}
		c.watch(id, w)
		return done(frame(kindOK)), true
	case opUnwatch:
		id := p.uint()
		if p.end() != nil {
			break
		}
		c.mu.Lock()
		sw := c.watches[id]
		delete(c.watches, id)
		c.mu.Unlock()
		if sw != nil {
			sw.end()
		}
		return done(frame(kindOK)), true
	}
	return done(putString(frame(kindError), "netstore: malformed request")), false
}

// watch registers w as the connection's watch id and pushes its wake-ups.
func (c *serverConn) watch(id uint64, w backend.Watch) {
	sw := &serverWatch{w: w, stop: make(chan struct{})}
	c.mu.Lock()
	old := c.watches[id]
	c.watches[id] = sw
	c.mu.Unlock()
	if old != nil {
		old.end() // the client reused an id: keep one watch per id
	}
	push := done(putUint(frame(kindWake), id))
	c.wg.Go(func() {
		for {
			select {
			case <-w.C():
				c.wmu.Lock()
				c.bw.Write(push)
				err := c.bw.Flush()
				c.wmu.Unlock()
				if err != nil {
					return
				}
			case <-sw.stop:
				return
			}
		}
	})
}

// errorReply encodes a store's error as the contract's sentinel it wraps.
func errorReply(err error) []byte {
	var locked *backend.LockedError
	switch {
	case errors.As(err, &locked):
		return done(putDuration(frame(kindLocked), locked.Remaining))
	case errors.Is(err, backend.ErrLocked):
		return done(putDuration(frame(kindLocked), 0))
	case errors.Is(err, backend.ErrNotHeld):
		return done(frame(kindNotHeld))
	case errors.Is(err, backend.ErrTransferRefused):
		return done(frame(kindRefused))
	case errors.Is(err, backend.ErrInvalid):
		return done(putString(frame(kindInvalid), err.Error()))
	}
	return done(putString(frame(kindError), err.Error()))
}
