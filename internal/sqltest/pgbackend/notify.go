package pgbackend

import (
	"context"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/lock/backend"
)

// channel is the channel distlock_release notifies, with the key in hex
// as the payload (a payload is text, and a key may hold a NUL byte).
const channel = "distlock_released"

// Watch implements backend.Notifier. It returns once the backend's
// listener listens, so that every release committed from then on wakes
// the watch; it wakes it too each time the listener connects again, since
// a release may have gone unheard meanwhile.
func (b *Backend) Watch(ctx context.Context, key string) (backend.Watch, error) {
	if b.closed.Load() {
		return nil, backend.ErrClosed
	}
	return b.listener.watch(ctx, key)
}

// listener keeps one connection, taken out of the pool (Hijack), that
// LISTENs on channel, and wakes the watches of each released key. It
// starts with the first watch and runs until Close, connecting again
// after a failure.
type listener struct {
	pool *pgxpool.Pool

	mu      sync.Mutex
	watches map[string]map[*watch]struct{}
	up      chan struct{} // closed while the listener listens
	started bool
	closed  bool
	stop    context.CancelFunc
	done    chan struct{} // closed when run has returned
}

func newListener(pool *pgxpool.Pool) *listener {
	return &listener{pool: pool, watches: map[string]map[*watch]struct{}{},
		up: make(chan struct{}), done: make(chan struct{})}
}

// watch is one Watch: C receives the wake-ups (buffered one).
type watch struct {
	l   *listener
	key string
	c   chan struct{}
}

func (w *watch) C() <-chan struct{} { return w.c }

// Close implements backend.Watch. Every watch of a key is woken at each
// release (see wakeKey), so a watcher that leaves has no wake-up to pass
// on: took does not matter.
func (w *watch) Close(took bool) error {
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	if ws := w.l.watches[w.key]; ws != nil {
		delete(ws, w)
		if len(ws) == 0 {
			delete(w.l.watches, w.key)
		}
	}
	return nil
}

func (l *listener) watch(ctx context.Context, key string) (backend.Watch, error) {
	w := &watch{l: l, key: key, c: make(chan struct{}, 1)}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, backend.ErrClosed
	}
	if l.watches[key] == nil {
		l.watches[key] = map[*watch]struct{}{}
	}
	l.watches[key][w] = struct{}{}
	if !l.started {
		l.started = true
		var runCtx context.Context
		runCtx, l.stop = context.WithCancel(context.Background())
		go l.run(runCtx)
	}
	up := l.up
	l.mu.Unlock()
	select {
	case <-up:
		return w, nil
	case <-ctx.Done():
		w.Close(false)
		return nil, fmt.Errorf("pgbackend: watch: %w", ctx.Err())
	case <-l.done:
		w.Close(false)
		return nil, backend.ErrClosed
	}
}

// run listens until ctx ends, connecting again after each failure, at
// most once a second after repeated failures.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	const first, most = 10 * time.Millisecond, time.Second
	delay := first
	for {
		if l.listen(ctx) {
			delay = first
		}
		l.setUp(false)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay): // the server is down or unreachable: wait before connecting again
		}
		delay = min(2*delay, most)
	}
}

// listen takes a connection, LISTENs and wakes watches until the
// connection fails or ctx ends. It reports whether it got to listen.
func (l *listener) listen(ctx context.Context) bool {
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return false
	}
	conn := pc.Hijack() // ours alone, until we close it
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		return false
	}
	l.setUp(true)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true
		}
		if key, err := hex.DecodeString(n.Payload); err == nil {
			l.wakeKey(string(key))
		}
	}
}

// setUp records whether the listener listens, and wakes every watch: a
// release may have gone unheard while it did not.
func (l *listener) setUp(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.up:
		if !on {
			l.up = make(chan struct{})
		}
	default:
		if on {
			close(l.up)
		}
	}
	for _, ws := range l.watches {
		for w := range ws {
			wake(w)
		}
	}
}

// wakeKey wakes every watch of key: the progress rule holds trivially.
func (l *listener) wakeKey(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := range l.watches[key] {
		wake(w)
	}
}

func wake(w *watch) {
	select {
	case w.c <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// close stops the listener and waits for it.
func (l *listener) close() {
	l.mu.Lock()
	l.closed = true
	started, stop := l.started, l.stop
	l.mu.Unlock()
	if started {
		stop()
		<-l.done
	}
}
