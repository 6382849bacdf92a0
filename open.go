package lock

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/distlock/lock/backend"
)

// Opener builds a backend from a URL. The URL's query holds only the
// parameters the backend declared in Register; Open has taken out the
// client's own (ttl, drift, maxhold, autorenew).
type Opener func(ctx context.Context, u *url.URL) (backend.Backend, error)

type registration struct {
	params []string
	open   Opener
}

var (
	registryMu sync.RWMutex
	registry   = map[string]registration{}
)

// clientParams are the query parameters every scheme accepts.
var clientParams = []string{"autorenew", "drift", "maxhold", "ttl"}

// Register makes a backend available to Open under scheme. params lists the
// query parameters the backend accepts besides the client's own. Backend
// packages call it from init. Like database/sql.Register, it panics when
// scheme is empty, already registered, or open is nil: those are mistakes in
// the program, not in its input.
func Register(scheme string, params []string, open Opener) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if scheme == "" || open == nil {
		panic("lock: Register needs a scheme and an opener")
	}
	if _, dup := registry[scheme]; dup {
		panic("lock: Register called twice for scheme " + scheme)
	}
	for _, p := range params {
		if slices.Contains(clientParams, p) {
			panic("lock: Register: parameter " + p + " is reserved for the client")
		}
	}
	registry[scheme] = registration{params: slices.Clone(params), open: open}
}

// Schemes returns the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]string, 0, len(registry))
	for s := range registry {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// Open returns a Client for the backend named by rawURL, such as
// "mem://name", "redis://host:6379/0" or "etcd://host:2379". The backend
// package must be imported (often for its side effect only) so that its
// scheme is registered. Query parameters ttl, drift and maxhold (Go durations
// such as 30s) and autorenew (true or false) set the client's defaults; opts
// given here override them. Unknown schemes and unknown parameters are errors
// that list what is valid.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Client, error) {
	if ctx == nil {
		return nil, invalid(ErrInvalid, "Open: nil context")
	}
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		if err == nil {
			err = fmt.Errorf("%q has no scheme", rawURL)
		}
		return nil, invalid(ErrInvalid, "Open: %v; want SCHEME://ADDRESS with a registered scheme (%s)", err, strings.Join(Schemes(), ", "))
	}
	registryMu.RLock()
	s, ok := registry[u.Scheme]
	registryMu.RUnlock()
	if !ok {
		known := Schemes()
		hint := "none is registered; import a backend package, such as github.com/distlock/lock/memory"
		if len(known) > 0 {
			hint = "registered: " + strings.Join(known, ", ") + " (forgotten import?)"
		}
		return nil, fmt.Errorf("%w %q in %q; %s", ErrUnknownScheme, u.Scheme, u.Redacted(), hint)
	}

	query := u.Query()
	var fromURL []Option
	for name, values := range query {
		if !slices.Contains(s.params, name) && !slices.Contains(clientParams, name) {
			valid := append(slices.Clone(clientParams), s.params...)
			sort.Strings(valid)
			return nil, invalid(ErrInvalidOption, "Open: unknown query parameter %q for scheme %s; valid: %s", name, u.Scheme, strings.Join(valid, ", "))
		}
		if !slices.Contains(clientParams, name) {
			continue
		}
		if len(values) != 1 {
			return nil, invalid(ErrInvalidOption, "Open: query parameter %q given %d times; give it once", name, len(values))
		}
		o, err := parseClientParam(name, values[0])
		if err != nil {
			return nil, err
		}
		fromURL = append(fromURL, o)
		query.Del(name)
	}
	bu := *u
	bu.RawQuery = query.Encode()
	b, err := s.open(ctx, &bu)
	if err != nil {
		return nil, &openError{url: u.Redacted(), err: err}
	}
	c, err := New(b, append(fromURL, opts...)...)
	if err != nil {
		b.Close()
		return nil, err
	}
	return c, nil
}

func parseClientParam(name, value string) (Option, error) {
	if name == "autorenew" {
		on, err := strconv.ParseBool(value)
		if err != nil {
			return nil, invalid(ErrInvalidOption, "Open: autorenew=%q: want true or false", value)
		}
		return WithAutoRenew(on), nil
	}
	d, err := time.ParseDuration(value)
	if err != nil {
		return nil, invalid(ErrInvalidOption, "Open: %s=%q: want a Go duration such as 500ms or 30s", name, value)
	}
	switch name {
	case "ttl":
		return WithTTL(d), nil
	case "drift":
		return WithDrift(d), nil
	default: // maxhold
		return WithMaxHold(d), nil
	}
}

// openError is a backend's failure to open a URL, said once with the
// package's prefix even when the backend's own error carries it too.
type openError struct {
	url string
	err error
}

func (e *openError) Error() string {
	return "lock: Open " + e.url + ": " + strings.TrimPrefix(e.err.Error(), "lock: ")
}

func (e *openError) Unwrap() error { return e.err }
