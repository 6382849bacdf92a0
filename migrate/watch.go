package migrate

import (
	"context"
	"errors"
	"sync"

	"github.com/distlock/lock/backend"
)

// A waiter in phases 2 and 3 watches the store that refused it last, and
// only that one: its wake-ups come from the store whose release it waits
// for. Watching both would make it wake itself: when To refuses, Acquire
// undoes its From grant, and that release wakes From's watchers, this
// waiter first; it would try again at once, be refused by To again, and
// spin without waiting while To is held (a phase 4 instance's lock, or a
// lock lost on From only). A From watch kept while To refuses would also
// keep the front of From's queue of watchers (stores wake the
// longest-waiting one) for a waiter that does not want From, and a
// phase 1 instance waiting there would not be woken.
//
// So a refusal by a store moves each watch of the key to that store: it
// opens a watch on it and closes the other's with took false (which
// passes on a wake-up that it consumed), before Acquire undoes a From
// grant. The move may miss a release between the refusal and the new
// watch: the watch wakes its waiter once when it moves, and the waiter
// tries again (as package lock does after it starts a watch). A new watch
// watches both stores until the waiter's next refusal says which.
//
// The progress rule holds: a release of a lock held on both stores frees
// it on the store the waiter watches; a lock held on one store is
// released there, and a waiter refused by that store watches it.

// side names one of the two stores.
type side int

const (
	fromSide side = iota
	toSide
)

func (s side) String() string {
	if s == toSide {
		return "to"
	}
	return "from"
}

// followWatch is the backend.Watch of phases 2 and 3 (see above).
type followWatch struct {
	b   *both
	key string
	c   chan struct{}

	mu     sync.Mutex
	ws     [2]backend.Watch // the open watch of each store; nil: none
	stop   [2]chan struct{} // ends the forwarder of ws[i]
	fwd    sync.WaitGroup
	closed bool
}

// notifier returns the store's Notifier, or nil.
func (b *both) notifier(s side) backend.Notifier {
	if s == toSide {
		return b.toN
	}
	return b.fromN
}

// Watch watches key on every store that notifies, until the waiter's next
// refusal says which store it waits for. When neither store notifies,
// Watch fails and package lock polls.
func (b *both) Watch(ctx context.Context, key string) (backend.Watch, error) {
	if b.fromN == nil && b.toN == nil {
		return nil, errors.New("migrate: neither store notifies waiters; package lock polls")
	}
	w := &followWatch{b: b, key: key, c: make(chan struct{}, 1)}
	for _, s := range []side{fromSide, toSide} {
		if err := w.open(ctx, s); err != nil {
			w.Close(false)
			return nil, err
		}
	}
	b.mu.Lock()
	if b.watching[key] == nil {
		b.watching[key] = map[*followWatch]struct{}{}
	}
	b.watching[key][w] = struct{}{}
	b.mu.Unlock()
	return w, nil
}

// refusedBy moves every watch of key to store s, which refused an
// Acquire: see above.
func (b *both) refusedBy(ctx context.Context, key string, s side) {
	b.mu.Lock()
	ws := make([]*followWatch, 0, len(b.watching[key]))
	for w := range b.watching[key] {
		ws = append(ws, w)
	}
	b.mu.Unlock()
	for _, w := range ws {
		w.follow(ctx, s)
	}
}

// follow makes w watch store s only.
func (w *followWatch) follow(ctx context.Context, s side) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	other := fromSide
	if s == fromSide {
		other = toSide
	}
	w.closeLocked(other, false)
	if w.ws[s] != nil || w.b.notifier(s) == nil {
		return
	}
	if w.openLocked(ctx, s) == nil {
		w.wake() // a release before the watch began would be missed
	}
}

// open opens a watch on store s, when it notifies.
func (w *followWatch) open(ctx context.Context, s side) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.openLocked(ctx, s)
}

func (w *followWatch) openLocked(ctx context.Context, s side) error {
	n := w.b.notifier(s)
	if n == nil {
		return nil
	}
	sw, err := n.Watch(ctx, w.key)
	if err != nil {
		return errStore(s.String(), "watch", err)
	}
	stop := make(chan struct{})
	w.ws[s], w.stop[s] = sw, stop
	w.fwd.Go(func() {
		for {
			select {
			case <-sw.C():
				w.wake()
			case <-stop:
				return
			}
		}
	})
	return nil
}

// closeLocked closes the watch of store s, if open.
func (w *followWatch) closeLocked(s side, took bool) error {
	if w.ws[s] == nil {
		return nil
	}
	close(w.stop[s])
	err := w.ws[s].Close(took)
	w.ws[s], w.stop[s] = nil, nil
	return err
}

func (w *followWatch) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

func (w *followWatch) C() <-chan struct{} { return w.c }

// Close ends the watches with took: a waiter that leaves without the key
// passes on each store's wake-up.
func (w *followWatch) Close(took bool) error {
	w.b.mu.Lock()
	if m := w.b.watching[w.key]; m != nil {
		delete(m, w)
		if len(m) == 0 {
			delete(w.b.watching, w.key)
		}
	}
	w.b.mu.Unlock()
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	err := errors.Join(w.closeLocked(fromSide, took), w.closeLocked(toSide, took))
	w.mu.Unlock()
	w.fwd.Wait()
	return err
}
