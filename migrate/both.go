package migrate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/distlock/lock/backend"
)

// both is the backend of phases 2 and 3: each lock is held on From and on
// To at once, with one token. The argument for why it keeps the promise
// is in the package doc ("Why the phases keep the promise"); what each
// method does about it is said beside it.
type both struct {
	from, to backend.Backend
	toFences bool // phase 3: the lease's fence is To's; phase 2: From's
	caps     backend.Capabilities
	fromN    backend.Notifier     // nil: From does not notify
	toN      backend.Notifier     // nil: To does not notify
	fromL    backend.LossNotifier // nil: From does not report losses
	toL      backend.LossNotifier // nil: To does not report losses

	mu sync.Mutex
	// other holds, from a grant until its NotifyLoss or Release, the
	// fence of the store that does not give the lease its fence, when
	// that store reports losses (its NotifyLoss needs it).
	other map[string]uint64
	// halfReleased holds, for a token whose release reached one store
	// and not (knowingly) the other, the answer of the store that
	// answered: package lock sends an unknown release again, and a
	// store asked again after it released may answer ErrNotHeld, which
	// would report a lease held to its release as lost. At most
	// maxHalfReleased are kept; past that, releases are sent again to
	// both stores (a false "lost" report at worst, never a lost lock).
	halfReleased map[string]sideAnswers
	// watching holds the open watches of each key (watch.go).
	watching map[string]map[*followWatch]struct{}
}

// sideAnswers are the answers a store gave to a release, per store.
type sideAnswers struct {
	fromDone, toDone bool
	fromErr, toErr   error
}

// maxHalfReleased bounds both.halfReleased.
const maxHalfReleased = 4096

// lossBoth is both when a store reports losses: it adds
// backend.LossNotifier (package lock checks for it by type).
type lossBoth struct{ *both }

var (
	_ backend.Notifier     = (*both)(nil)
	_ backend.Watch        = (*followWatch)(nil)
	_ backend.Describer    = (*both)(nil)
	_ backend.Inspector    = (*both)(nil)
	_ backend.LossNotifier = lossBoth{}
)

// newBoth returns the backend of phase 2 (toFences false) or 3.
func newBoth(from, to backend.Backend, toFences bool) backend.Backend {
	b := &both{from: from, to: to, toFences: toFences, other: map[string]uint64{}, halfReleased: map[string]sideAnswers{}, watching: map[string]map[*followWatch]struct{}{}}
	b.caps = weaker(capsOf(from), capsOf(to))
	b.fromN, _ = from.(backend.Notifier)
	b.toN, _ = to.(backend.Notifier)
	b.fromL, _ = from.(backend.LossNotifier)
	b.toL, _ = to.(backend.LossNotifier)
	if b.fromL != nil || b.toL != nil {
		return lossBoth{b}
	}
	return b
}

// asBoth returns b's both, or nil.
func asBoth(b backend.Backend) *both {
	switch d := b.(type) {
	case *both:
		return d
	case lossBoth:
		return d.both
	}
	return nil
}

func capsOf(b backend.Backend) backend.Capabilities {
	if d, ok := b.(backend.Describer); ok {
		return d.Capabilities()
	}
	return backend.Capabilities{}
}

// weaker returns what a lock held on both stores guarantees: the longer
// MinTTL and coarser granularity, the shorter MaxTTL, the later latest
// expiry (a lock is not free until both stores dropped it), durable
// fences only when both stores have them, a fixed TTL when either store
// keeps one, holder labels when both keep them, and no FIFO: both has no queue
// of its own (it waits through the stores' notifications, and a waiter
// that finds To held undoes its From grant and waits again, which can let
// a later arrival in first).
func weaker(a, b backend.Capabilities) backend.Capabilities {
	factor := func(f float64) float64 { return max(f, 1) }
	maxTTL := a.MaxTTL
	if maxTTL == 0 || (b.MaxTTL != 0 && b.MaxTTL < maxTTL) {
		maxTTL = b.MaxTTL
	}
	return backend.Capabilities{
		MinTTL:       max(a.MinTTL, b.MinTTL),
		MaxTTL:       maxTTL,
		Granularity:  max(a.Granularity, b.Granularity),
		ExpiryFactor: max(factor(a.ExpiryFactor), factor(b.ExpiryFactor)),
		ExpirySlack:  max(a.ExpirySlack, b.ExpirySlack),
		DurableFence: a.DurableFence && b.DurableFence,
		FixedTTL:     a.FixedTTL || b.FixedTTL,
		InProcess:    a.InProcess && b.InProcess,
		Labels:       a.Labels && b.Labels,
	}
}

func (b *both) Capabilities() backend.Capabilities { return b.caps }

// granted returns the TTL a store granted for a request of ttl.
func granted(g backend.Grant, ttl time.Duration) time.Duration {
	if g.TTL == 0 {
		return ttl
	}
	return g.TTL
}

// fenceSide returns the lease's fence and the other store's, of two grants.
func (b *both) fenceSide(gf, gt backend.Grant) (fence, other uint64) {
	if b.toFences {
		return gt.Fence, gf.Fence
	}
	return gf.Fence, gt.Fence
}

// otherLoss returns the loss reporter of the store that does not give the
// lease its fence.
func (b *both) otherLoss() backend.LossNotifier {
	if b.toFences {
		return b.fromL
	}
	return b.toL
}

// refused reports whether a store's error says that it granted nothing.
func refused(err error) bool {
	return errors.Is(err, backend.ErrLocked) || errors.Is(err, backend.ErrContended) ||
		errors.Is(err, backend.ErrInvalid) || errors.Is(err, backend.ErrClosed)
}

// Acquire takes key on From, then on To, always in that order. It never
// waits while it holds a store: when To refuses, it undoes From's grant
// and returns To's refusal, so two instances cannot deadlock, and two
// instances of phases 2 and 3 meet first on From, where one of them
// wins. When To's outcome is unknown it returns that error, and package
// lock's cleanup releases the token on both stores. The grant's TTL is
// the shorter of the two: package lock counts the lease's deadline from
// before the request to From, so both stores hold the lock at least that
// long.
func (b *both) Acquire(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	gf, err := b.from.Acquire(ctx, key, token, ttl)
	if err != nil {
		if errors.Is(err, backend.ErrLocked) {
			b.refusedBy(ctx, key, fromSide)
			if b.halfDone(ctx, key) {
				return backend.Grant{}, fmt.Errorf("%w: migrate: acquire %q: the from store holds it (%v) and the to store does not: another instance's acquire or release is half done, or a phase 1 instance holds it", backend.ErrContended, key, err)
			}
		}
		return backend.Grant{}, errStore("from", "acquire", err)
	}
	gt, err := b.to.Acquire(ctx, key, token, ttl)
	if err != nil {
		if !refused(err) {
			return backend.Grant{}, errStore("to", "acquire", err)
		}
		if errors.Is(err, backend.ErrLocked) {
			b.refusedBy(ctx, key, toSide) // before the undo wakes From's watchers
		}
		// To granted nothing: From's grant will carry no lease.
		if uerr := b.from.Release(ctx, key, token); uerr != nil && !errors.Is(uerr, backend.ErrNotHeld) {
			// Not ErrLocked: the outcome is unknown, so package lock
			// releases the token again on both stores.
			return backend.Grant{}, fmt.Errorf("migrate: acquire: the to store refused (%v), and undoing the from store's grant failed: %w", err, uerr)
		}
		return backend.Grant{}, errStore("to", "acquire", err)
	}
	fence, other := b.fenceSide(gf, gt)
	if b.otherLoss() != nil {
		b.mu.Lock()
		b.other[token] = other
		b.mu.Unlock()
	}
	return backend.Grant{Fence: fence, TTL: min(granted(gf, ttl), granted(gt, ttl))}, nil
}

// halfDone reports, after From refused key, whether To does not hold it.
//
// A lock of phases 2 and 3 is held on both stores; it is taken and freed
// in two steps, so for a moment it is held on one. A release frees both
// at once (a reply lost on one store must not keep the other held), so
// From may be free while To still holds a lock being released; an
// Acquire then takes From, finds To held, and undoes From. Whoever finds
// From held in that moment, and To already free, must not answer that
// the key is held: no lease holds it, and a TryAcquire that said so
// would be refused by nobody (the conformance case GiveUpUnderLoad saw it
// on real servers). That is Redlock's split vote, and the answer is the
// same, ErrContended: package lock tries again after a random delay. A
// phase 1 instance, which holds From only, is answered so too while
// phases 1 and 2 run side by side; its waiters then retry on a timer
// instead of a wake-up, for the length of the roll from phase 1 to 2.
// The read costs To a request on each refusal by From; a To that cannot
// be read (no Inspector, an error) leaves the refusal as it is.
func (b *both) halfDone(ctx context.Context, key string) bool {
	in, ok := b.to.(backend.Inspector)
	if !ok {
		return false
	}
	h, err := in.Inspect(ctx, key)
	return err == nil && !h.Held
}

// Renew renews key on both stores at once. The lease is lost when either
// store no longer holds it (ErrNotHeld). The store that still holds it
// keeps it until its TTL runs out or the lease's Release frees it (package
// lock releases a lost lease on Release too).
func (b *both) Renew(ctx context.Context, key, token string, ttl time.Duration) (backend.Grant, error) {
	var gt backend.Grant
	var errT error
	done := make(chan struct{})
	go func() {
		defer close(done)
		gt, errT = b.to.Renew(ctx, key, token, ttl)
	}()
	gf, errF := b.from.Renew(ctx, key, token, ttl)
	<-done
	switch {
	case errors.Is(errF, backend.ErrNotHeld):
		return backend.Grant{}, errStore("from", "renew", errF)
	case errors.Is(errT, backend.ErrNotHeld):
		return backend.Grant{}, errStore("to", "renew", errT)
	case errF != nil:
		return backend.Grant{}, errStore("from", "renew", errF)
	case errT != nil:
		return backend.Grant{}, errStore("to", "renew", errT)
	}
	fence, _ := b.fenceSide(gf, gt)
	return backend.Grant{Fence: fence, TTL: min(granted(gf, ttl), granted(gt, ttl))}, nil
}

// Release frees key on both stores at once. It returns nil when both
// released, ErrNotHeld when a store did not hold the lock for token (the
// lease was lost) and the other answered, and otherwise the unknown
// outcome, after which package lock sends it again: a store that already
// answered is not asked again (see halfReleased).
func (b *both) Release(ctx context.Context, key, token string) error {
	b.mu.Lock()
	a := b.halfReleased[token]
	delete(b.other, token)
	b.mu.Unlock()
	var wg sync.WaitGroup
	if !a.toDone {
		wg.Go(func() { a.toErr = b.to.Release(ctx, key, token) })
	}
	if !a.fromDone {
		a.fromErr = b.from.Release(ctx, key, token)
	}
	wg.Wait()
	a.fromDone = a.fromDone || known(a.fromErr)
	a.toDone = a.toDone || known(a.toErr)
	b.mu.Lock()
	defer b.mu.Unlock()
	if !a.fromDone || !a.toDone {
		if a.fromDone || a.toDone {
			if _, ok := b.halfReleased[token]; ok || len(b.halfReleased) < maxHalfReleased {
				b.halfReleased[token] = a
			}
		}
		if !a.fromDone {
			return errStore("from", "release", a.fromErr)
		}
		return errStore("to", "release", a.toErr)
	}
	delete(b.halfReleased, token)
	switch {
	case a.fromErr != nil:
		return errStore("from", "release", a.fromErr)
	case a.toErr != nil:
		return errStore("to", "release", a.toErr)
	}
	return nil
}

// known reports whether a release's answer is the store's: success,
// ErrNotHeld, or a refusal of the input.
func known(err error) bool {
	return err == nil || errors.Is(err, backend.ErrNotHeld) || errors.Is(err, backend.ErrInvalid) || errors.Is(err, backend.ErrClosed)
}

// Inspect reads key on both stores. The key is held when either store
// holds it. When both hold it for one token, the holder is that token
// with the fence of the lease's store and the shorter remaining TTL;
// otherwise it is the holder on From, or else on To. Stores shows each
// store's holder to tools.
func (b *both) Inspect(ctx context.Context, key string) (backend.Holder, error) {
	fi, ok1 := b.from.(backend.Inspector)
	ti, ok2 := b.to.(backend.Inspector)
	if !ok1 || !ok2 {
		return backend.Holder{}, fmt.Errorf("%w: migrate: Inspect needs both stores to implement backend.Inspector", backend.ErrInvalid)
	}
	var ht backend.Holder
	var errT error
	done := make(chan struct{})
	go func() {
		defer close(done)
		ht, errT = ti.Inspect(ctx, key)
	}()
	hf, errF := fi.Inspect(ctx, key)
	<-done
	if errF != nil {
		return backend.Holder{}, errStore("from", "inspect", errF)
	}
	if errT != nil {
		return backend.Holder{}, errStore("to", "inspect", errT)
	}
	switch {
	case hf.Held && ht.Held && hf.Token == ht.Token && hf.Token != "":
		h := hf
		if b.toFences {
			h.Fence = ht.Fence
		}
		h.Remaining = minKnown(hf.Remaining, ht.Remaining)
		if h.Label == "" {
			h.Label = ht.Label
		}
		return h, nil
	case hf.Held:
		return hf, nil
	}
	return ht, nil
}

// minKnown is the shorter of two remaining TTLs, 0 standing for unknown.
func minKnown(a, b time.Duration) time.Duration {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// NotifyLoss watches the lock on each store that reports losses, and
// reports the first loss: the lease is lost when either store lost it.
func (l lossBoth) NotifyLoss(key, token string, fence uint64, lost func(error)) (stop func()) {
	b := l.both
	b.mu.Lock()
	other, ok := b.other[token]
	delete(b.other, token)
	b.mu.Unlock()
	var once sync.Once
	report := func(store string) func(error) {
		return func(err error) { once.Do(func() { lost(errStore(store, "lock", err)) }) }
	}
	fenceStore, otherStore := "from", "to"
	fenceL, otherL := b.fromL, b.toL
	if b.toFences {
		fenceStore, otherStore = otherStore, fenceStore
		fenceL, otherL = otherL, fenceL
	}
	var stops []func()
	if fenceL != nil {
		stops = append(stops, fenceL.NotifyLoss(key, token, fence, report(fenceStore)))
	}
	if otherL != nil && ok {
		stops = append(stops, otherL.NotifyLoss(key, token, other, report(otherStore)))
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

// Close closes both stores.
func (b *both) Close() error {
	err := errors.Join(b.from.Close(), b.to.Close())
	b.mu.Lock()
	clear(b.other)
	clear(b.halfReleased)
	b.mu.Unlock()
	return err
}
