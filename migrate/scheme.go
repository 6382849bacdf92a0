package migrate

import (
	"context"
	"fmt"
	"net/url"
	"strconv"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// SchemeName is the URL scheme of a move between stores:
//
//	migrate://?from=redis://r1:6379&to=etcd://e1:2379&phase=2&epoch=0
//
// from and to are backend URLs of schemes registered in the same URLMux
// (escape a '&' or '#' in them as %26 and %23); phase is 1 to 4; epoch,
// From's fence epoch, is 0 unless given. Only the stores the phase uses
// are opened, but both URLs must be given in every phase, so that one
// configuration goes from phase 1 to 4 by its phase alone. The client's
// own parameters (ttl, drift, maxhold, autorenew) go on the migrate URL,
// not inside from or to.
const SchemeName = "migrate"

func init() { lock.RegisterScheme(Scheme(lock.DefaultURLMux())) }

// Scheme returns the migrate scheme, opening its from and to URLs with
// mux: the package registers Scheme(lock.DefaultURLMux()) there; a
// program with a URLMux of its own registers Scheme(itsMux) in it.
func Scheme(mux *lock.URLMux) lock.Scheme {
	return lock.Scheme{
		Name:   SchemeName,
		Params: []string{"epoch", "from", "phase", "to"},
		URLs:   []string{"from", "to"},
		OpenWithOptions: func(ctx context.Context, u *url.URL) (backend.Backend, []lock.Option, error) {
			return open(ctx, mux, u)
		},
	}
}

// open builds a phase's backend from a migrate URL.
func open(ctx context.Context, mux *lock.URLMux, u *url.URL) (backend.Backend, []lock.Option, error) {
	if u.Host != "" || (u.Path != "" && u.Path != "/") || u.User != nil {
		return nil, nil, fmt.Errorf("%w: a migrate URL has no host, path or user (migrate://?from=URL&to=URL&phase=N)", ErrInvalidConfig)
	}
	q := u.Query()
	var c Config
	p, err := strconv.Atoi(q.Get("phase"))
	if err != nil || !Phase(p).valid() {
		return nil, nil, fmt.Errorf("%w: phase=%q; want phase=1 (from only), 2 (both stores, from's fences), 3 (both stores, to's fences at epoch+1) or 4 (to only, epoch+1)", ErrInvalidConfig, q.Get("phase"))
	}
	c.Phase = Phase(p)
	if q.Has("epoch") {
		e, err := strconv.ParseUint(q.Get("epoch"), 10, 64)
		if err != nil || e > MaxEpoch {
			return nil, nil, fmt.Errorf("%w: epoch=%q; want 0 to %d", ErrInvalidConfig, q.Get("epoch"), MaxEpoch)
		}
		c.Epoch = e
	}
	fromURL, toURL := q.Get("from"), q.Get("to")
	switch {
	case fromURL == "" || toURL == "":
		return nil, nil, fmt.Errorf("%w: want both from=URL and to=URL, in every phase", ErrInvalidConfig)
	case fromURL == toURL:
		return nil, nil, fmt.Errorf("%w: from and to are the same URL; a move needs two stores", ErrInvalidConfig)
	}
	var from, to backend.Backend
	closeAll := func() {
		for _, b := range []backend.Backend{from, to} {
			if b != nil {
				b.Close()
			}
		}
	}
	if c.Phase.usesFrom() {
		if from, err = openStore(ctx, mux, "from", fromURL); err != nil {
			return nil, nil, err
		}
	}
	if c.Phase.usesTo() {
		if to, err = openStore(ctx, mux, "to", toURL); err != nil {
			closeAll()
			return nil, nil, err
		}
	}
	c.From, c.To = from, to
	b, epoch, err := c.Backend()
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return b, []lock.Option{epoch}, nil
}

// openStore opens one of the two stores' URLs.
func openStore(ctx context.Context, mux *lock.URLMux, name, raw string) (backend.Backend, error) {
	if u, err := url.Parse(raw); err == nil && u.Scheme == SchemeName {
		return nil, fmt.Errorf("%w: %s is a migrate URL; want a store's URL", ErrInvalidConfig, name)
	}
	b, opts, err := mux.OpenBackend(ctx, raw)
	if err != nil {
		return nil, fmt.Errorf("migrate: %s: %w", name, err)
	}
	if len(opts) > 0 {
		b.Close()
		return nil, fmt.Errorf("%w: %s has client parameters (ttl, drift, maxhold, autorenew); give them on the migrate URL", ErrInvalidConfig, name)
	}
	return b, nil
}
