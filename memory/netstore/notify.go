package netstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/distlock/lock/backend"
)

// notifier keeps a Backend's watches, registered on one connection of their
// own: the server pushes a watch's wake-ups on the connection it was
// registered on. When that connection dies, every watch is woken (a release
// may go unseen meanwhile) and registered again on a new connection, and
// woken again once the server confirmed it. Its fields are guarded by the
// Backend's mu.
type notifier struct {
	b         *Backend
	dialing   chan struct{} // one dial at a time
	c         *conn         // nil when none
	watches   map[uint64]*watch
	lastID    uint64
	redialing bool
}

type watch struct {
	n      *notifier
	id     uint64
	key    string
	ch     chan struct{}
	on     *conn // the connection it is registered on; nil when none
	closed bool
}

func (w *watch) C() <-chan struct{} { return w.ch }

func (w *watch) notify() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// Close implements backend.Watch: it unregisters the watch on the server,
// without waiting for the reply. The server passes a wake-up on to the next
// watcher of the key when the key is free, whatever took says: the
// unregistration may reach it after this client's release of the key, sent
// on another connection, whose wake-up then went to this watch.
func (w *watch) Close(bool) error {
	n := w.n
	n.b.mu.Lock()
	defer n.b.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	delete(n.watches, w.id)
	if w.on != nil {
		// Queued after the watch's registration on the same
		// connection, so the server sees them in that order.
		w.on.enqueue(newCall(done(putUint(frame(opUnwatch), w.id))))
	}
	return nil
}

// Watch implements backend.Notifier. It returns once the server has
// registered the watch.
func (b *Backend) Watch(ctx context.Context, key string) (backend.Watch, error) {
	if b.isClosed() {
		return nil, fmt.Errorf("netstore: watch: %w", backend.ErrClosed)
	}
	n := &b.notify
	c, err := n.conn(ctx)
	if err != nil {
		return nil, b.fail(ctx, "watch", err)
	}
	b.mu.Lock()
	n.lastID++
	w := &watch{n: n, id: n.lastID, key: key, ch: make(chan struct{}, 1)}
	cl := newCall(done(putString(putUint(frame(opWatch), w.id), key)))
	if n.c == c && c.enqueue(cl) {
		w.on = c
		n.watches[w.id] = w
	} else {
		cl.finish(nil, errNotSent) // the connection died meanwhile
	}
	b.mu.Unlock()
	select {
	case <-cl.done:
	case <-ctx.Done():
		w.Close(false) // after the registration, if it went out
		return nil, b.fail(ctx, "watch", errors.New("no reply"))
	}
	err = cl.err
	if err == nil {
		var p *parser
		if p, err = result("watch", cl.body); err == nil {
			if p.end() == nil {
				return w, nil
			}
			err = malformed("watch")
		}
	}
	w.Close(false)
	return nil, b.fail(ctx, "watch", err)
}

// conn returns the watches' connection, connecting and registering every
// open watch on it again if it died. b.mu must not be held.
func (n *notifier) conn(ctx context.Context) (*conn, error) {
	b := n.b
	b.mu.Lock()
	c := n.c
	b.mu.Unlock()
	if c != nil {
		return c, nil
	}
	select {
	case n.dialing <- struct{}{}:
		defer func() { <-n.dialing }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	b.mu.Lock()
	c = n.c
	b.mu.Unlock()
	if c != nil {
		return c, nil // another caller connected meanwhile
	}
	c, err := b.dial(ctx, n.wake, n.lost)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !c.alive() {
		return nil, errNotSent // it died before it was installed
	}
	n.c = c
	for _, w := range n.watches {
		if w.on == nil {
			w.on = c
			cl := newCall(done(putString(putUint(frame(opWatch), w.id), w.key)))
			cl.then = func(cl *call) {
				if cl.err == nil && len(cl.body) > 0 && cl.body[0] == kindOK {
					w.notify() // registered: whatever happened while it was not, try again
				}
			}
			c.enqueue(cl)
		}
	}
	return c, nil
}

// wake delivers a push.
func (n *notifier) wake(id uint64) {
	n.b.mu.Lock()
	w := n.watches[id]
	n.b.mu.Unlock()
	if w != nil {
		w.notify()
	}
}

// lost handles the death of a watches' connection.
func (n *notifier) lost(c *conn, _ error) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if n.c != c {
		return
	}
	n.c = nil
	for _, w := range n.watches {
		w.on = nil
		w.notify() // a release may go unseen until the watch is registered again
	}
	if len(n.watches) > 0 && !n.redialing && !b.closed {
		n.redialing = true
		b.wg.Go(n.redial)
	}
}

// redial connects again and registers the open watches, until it succeeds,
// no watch is left, or the Backend is closed.
func (n *notifier) redial() {
	b := n.b
	delay := 10 * time.Millisecond
	for {
		c, err := n.conn(b.ctx)
		b.mu.Lock()
		if (err == nil && n.c == c) || len(n.watches) == 0 || b.closed {
			n.redialing = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		select {
		case <-time.After(delay):
		case <-b.ctx.Done():
		}
		delay = min(2*delay, time.Second)
	}
}
