package redis

import (
	"container/list"
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock/backend"
)

// Subscriber is the part of a go-redis client that wake-ups need. Every
// go-redis client kind has it.
type Subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *goredis.PubSub
}

// unsubscribeAfter is how long a channel stays subscribed after its last
// watcher left: a hot key keeps its subscription instead of paying
// SUBSCRIBE and UNSUBSCRIBE around every wait.
const unsubscribeAfter = 2 * time.Second

// confirmTimeout bounds the wait for a subscription; without one, package
// lock backs off and retries instead of waiting for wake-ups.
const confirmTimeout = 2 * time.Second

var errNoConfirmation = errors.New("redis: no node confirmed the subscription to release notifications")

// notifier turns release messages on one or more Redis nodes into wake-ups.
// A release publishes an id unique to it on the key's channel: the released
// token on one node, a random id sent to every node with Redlock. Each
// release wakes the longest-waiting local watcher of the key, once, even
// when several nodes publish it; a woken watcher that leaves without the key
// passes the wake-up on.
type notifier struct {
	nodes []*pubsubNode
	owned bool // the clients are the backend's own (see markOwned)

	mu       sync.Mutex
	channels map[string]*channelState
	leaving  map[string]chan struct{} // channels being unsubscribed; closed when done
	closed   bool
	wg       sync.WaitGroup // dispatchers
}

type pubsubNode struct {
	sub Subscriber
	ps  *goredis.PubSub // nil until the first watch
}

type channelState struct {
	watchers  *list.List        // of *watch, in arrival order
	places    map[string]*watch // the watches of queue places, by place id
	ready     chan struct{}     // closed when every node confirmed or failed
	pending   int               // nodes that have neither confirmed nor failed
	confirmed int               // nodes that confirmed
	recent    [8]string         // ids of the last releases, to wake once per release
	next      int
	idle      *time.Timer // pending unsubscribe
}

func newNotifier(owned bool, subs ...Subscriber) *notifier {
	n := &notifier{owned: owned, channels: map[string]*channelState{}, leaving: map[string]chan struct{}{}}
	for _, s := range subs {
		n.nodes = append(n.nodes, &pubsubNode{sub: s})
	}
	return n
}

// watch subscribes to channel (if needed) and waits until at least one node
// confirmed the subscription, so that no release after watch returns is
// missed on that node.
func (n *notifier) watch(ctx context.Context, channel string) (backend.Watch, error) {
	w, err := n.watchOn(ctx, channel, nil)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// watchPlace is watch for a place in the key's queue: handover messages
// for it (see queue.go) reach it alone.
func (n *notifier) watchPlace(ctx context.Context, channel string, p *place) (*watch, error) {
	return n.watchOn(ctx, channel, p)
}

// subscribed reports whether channel is subscribed and confirmed, so that
// a watch of it costs no request.
func (n *notifier) subscribed(channel string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.channels[channel]
	if st == nil || st.confirmed == 0 {
		return false
	}
	_, leaving := n.leaving[channel]
	return !leaving
}

func (n *notifier) watchOn(ctx context.Context, channel string, p *place) (*watch, error) {
	if n.owned {
		ctx = markOwned(ctx)
	}
	n.mu.Lock()
	for {
		// An UNSUBSCRIBE still on its way would cancel a new SUBSCRIBE
		// sent before it: wait for it, outside the lock.
		left, ok := n.leaving[channel]
		if !ok {
			break
		}
		n.mu.Unlock()
		select {
		case <-left:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		n.mu.Lock()
	}
	if n.closed {
		n.mu.Unlock()
		return nil, backend.ErrClosed
	}
	st := n.channels[channel]
	if st == nil {
		st = &channelState{watchers: list.New(), places: map[string]*watch{}, ready: make(chan struct{}), pending: len(n.nodes)}
		n.channels[channel] = st
		for _, node := range n.nodes {
			if node.ps == nil {
				// No I/O yet: the connection opens with the first
				// SUBSCRIBE.
				node.ps = node.sub.Subscribe(context.WithoutCancel(ctx))
				n.wg.Add(1)
				go n.dispatch(node.ps)
			}
			// Subscribe outside the lock, every node on its own: a hung
			// node must not hold up the others or the dispatchers.
			n.wg.Add(1)
			go func(ps *goredis.PubSub) {
				defer n.wg.Done()
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), confirmTimeout)
				defer cancel()
				if err := ps.Subscribe(sctx, channel); err != nil {
					n.mu.Lock()
					st.settle(false) // a node down: its releases cannot be heard
					n.mu.Unlock()
				}
			}(node.ps)
		}
	}
	if st.idle != nil {
		st.idle.Stop()
		st.idle = nil
	}
	w := &watch{n: n, channel: channel, st: st, ch: make(chan struct{}, 1), place: p}
	w.elem = st.watchers.PushBack(w)
	if p != nil {
		st.places[p.id] = w
	}
	ready := st.ready
	n.mu.Unlock()

	// Wait for every node: a release is published on the nodes whose lock
	// a waiter marked, which may be any of them. A node that hangs delays
	// this up to confirmTimeout; then any confirmed node will do.
	t := time.NewTimer(confirmTimeout)
	defer t.Stop()
	select {
	case <-ready:
	case <-ctx.Done():
		w.Close(false)
		return nil, ctx.Err()
	case <-t.C:
	}
	n.mu.Lock()
	ok := st.confirmed > 0
	n.mu.Unlock()
	if !ok {
		w.Close(false)
		return nil, errNoConfirmation
	}
	return w, nil
}

// settle records one node's answer to a subscription; called with n.mu held.
func (st *channelState) settle(confirmed bool) {
	if confirmed {
		st.confirmed++
	}
	if st.pending > 0 {
		st.pending--
		if st.pending == 0 {
			close(st.ready)
		}
	}
}

func (n *notifier) dispatch(ps *goredis.PubSub) {
	defer n.wg.Done()
	for m := range ps.ChannelWithSubscriptions() {
		switch m := m.(type) {
		case *goredis.Subscription:
			if m.Kind == "subscribe" {
				n.confirmed(m.Channel)
			}
		case *goredis.Message:
			n.released(m.Channel, m.Payload)
		}
	}
}

func (n *notifier) confirmed(channel string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.channels[channel]
	if st == nil {
		return
	}
	if st.pending > 0 {
		st.settle(true)
		return
	}
	// A node subscribed again (a reconnect, or a node that answered after
	// the wait gave up): a release may have gone unheard meanwhile. Let the
	// first waiter check, and every place in the queue (a handover to it
	// may have gone unheard).
	st.wakeFirst()
	for _, w := range st.places {
		w.notify()
	}
}

func (n *notifier) released(channel, id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.channels[channel]
	if st == nil {
		return
	}
	if pid, fence, token, ok := parseHandover(id); ok {
		// A handover to one place in the queue: the place confirms it,
		// then wakes.
		if w := st.places[pid]; w != nil {
			w.place.confirm(token, fence)
		}
		return
	}
	if pid, ok := strings.CutPrefix(id, "w:"); ok {
		// The key is free with this place first in the queue.
		if w := st.places[pid]; w != nil {
			w.notify()
		}
		return
	}
	for _, r := range st.recent {
		if r == id {
			return // another node reported the same release
		}
	}
	st.recent[st.next] = id
	st.next = (st.next + 1) % len(st.recent)
	st.wakeFirst()
}

func (st *channelState) wakeFirst() {
	if e := st.watchers.Front(); e != nil {
		e.Value.(*watch).notify()
	}
}

func (n *notifier) leave(w *watch, took bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if w.elem == nil {
		return
	}
	st := w.st
	st.watchers.Remove(w.elem)
	w.elem = nil
	if w.place != nil && st.places[w.place.id] == w {
		delete(st.places, w.place.id)
	}
	if w.woken && !took {
		st.wakeFirst()
	}
	if st.watchers.Len() > 0 || n.closed {
		return
	}
	st.idle = time.AfterFunc(unsubscribeAfter, func() { n.unsubscribe(w.channel, st) })
}

// unsubscribe drops channel's subscription on every node. The requests go
// out without the notifier's lock, each node on its own and bounded by
// confirmTimeout: a node that hangs (a reconnect that waits for its dial
// timeout, say) must not stall the waiters of other keys.
func (n *notifier) unsubscribe(channel string, st *channelState) {
	n.mu.Lock()
	if n.channels[channel] != st || st.watchers.Len() > 0 || n.closed {
		n.mu.Unlock()
		return
	}
	delete(n.channels, channel)
	var subs []*goredis.PubSub
	for _, node := range n.nodes {
		if node.ps != nil {
			subs = append(subs, node.ps)
		}
	}
	done := make(chan struct{})
	n.leaving[channel] = done
	n.wg.Add(1)
	n.mu.Unlock()
	defer n.wg.Done()

	ctx, cancel := context.WithTimeout(context.Background(), confirmTimeout)
	defer cancel()
	if n.owned {
		ctx = markOwned(ctx)
	}
	var wg sync.WaitGroup
	for _, ps := range subs {
		wg.Go(func() { _ = ps.Unsubscribe(ctx, channel) })
	}
	wg.Wait()
	n.mu.Lock()
	delete(n.leaving, channel)
	close(done)
	n.mu.Unlock()
}

func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	for _, st := range n.channels {
		if st.idle != nil {
			st.idle.Stop()
		}
	}
	for _, node := range n.nodes {
		if node.ps != nil {
			node.ps.Close()
		}
	}
	n.mu.Unlock()
	n.wg.Wait()
}

type watch struct {
	n       *notifier
	channel string
	st      *channelState
	ch      chan struct{}
	elem    *list.Element // nil once closed; guarded by n.mu
	woken   bool          // guarded by n.mu
	place   *place        // the queue place it serves, or nil
}

func (w *watch) C() <-chan struct{} { return w.ch }

// notify is called with n.mu held. A place's wake-ups go to its queue
// place.
func (w *watch) notify() {
	w.woken = true
	if w.place != nil {
		w.place.q.Wake()
		return
	}
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

func (w *watch) Close(took bool) error {
	w.n.leave(w, took)
	return nil
}
