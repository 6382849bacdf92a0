package lock

import (
	"context"
	"errors"
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
	params  []string
	secrets []string
	open    Opener
}

var (
	registryMu sync.RWMutex
	registry   = map[string]registration{}
)

// clientParams are the query parameters every scheme accepts.
var clientParams = []string{"autorenew", "drift", "maxhold", "ttl"}

// Scheme describes a URL scheme for RegisterScheme.
type Scheme struct {
	// Name is the scheme, such as "redis".
	Name string
	// Params lists the query parameters the backend accepts besides the
	// client's own (ttl, drift, maxhold, autorenew).
	Params []string
	// Secrets lists the parameters of Params whose values are secrets:
	// RedactURL and every error of Open hide them. A parameter whose
	// name contains pass, token, secret, auth or credential is hidden
	// whether listed or not.
	Secrets []string
	// Open builds the backend.
	Open Opener
}

// Register makes a backend available to Open under scheme: it is
// RegisterScheme(Scheme{Name: scheme, Params: params, Open: open}).
func Register(scheme string, params []string, open Opener) {
	RegisterScheme(Scheme{Name: scheme, Params: params, Open: open})
}

// RegisterScheme makes a backend available to Open under s.Name. Backend
// packages call it from init. Like database/sql.Register, it panics when
// the name is empty or already registered, Open is nil, a parameter is one
// of the client's, or a secret is not a parameter: those are mistakes in
// the program, not in its input.
func RegisterScheme(s Scheme) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if s.Name == "" || s.Open == nil {
		panic("lock: Register needs a scheme and an opener")
	}
	if _, dup := registry[s.Name]; dup {
		panic("lock: Register called twice for scheme " + s.Name)
	}
	for _, p := range s.Params {
		if slices.Contains(clientParams, p) {
			panic("lock: Register: parameter " + p + " is reserved for the client")
		}
	}
	for _, p := range s.Secrets {
		if !slices.Contains(s.Params, p) {
			panic("lock: Register: secret " + p + " is not a parameter of scheme " + s.Name)
		}
	}
	registry[s.Name] = registration{params: slices.Clone(s.Params), secrets: slices.Clone(s.Secrets), open: s.Open}
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
	c, err := open(ctx, rawURL, opts)
	if err != nil {
		return nil, &openError{url: RedactURL(rawURL), err: err, msg: RedactText(strings.TrimPrefix(err.Error(), "lock: "), rawURL)}
	}
	return c, nil
}

// open is Open; its errors may quote rawURL, Open redacts them.
func open(ctx context.Context, rawURL string, opts []Option) (*Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error quotes the whole URL; Open shows it redacted
		}
		return nil, invalid(ErrInvalid, "not a URL: %v; want SCHEME://ADDRESS with a registered scheme (%s)", err, strings.Join(Schemes(), ", "))
	}
	if u.Scheme == "" {
		return nil, invalid(ErrInvalid, "no scheme; want SCHEME://ADDRESS with a registered scheme (%s)", strings.Join(Schemes(), ", "))
	}
	if u.Fragment != "" || strings.Contains(rawURL, "#") {
		return nil, invalid(ErrInvalid, "the URL has a fragment (#...), which no backend reads; escape a '#' in a value as %%23")
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
		return nil, fmt.Errorf("%w %q; %s", ErrUnknownScheme, u.Scheme, hint)
	}
	query, err := parseQuery(u.RawQuery, u.Scheme, s.params)
	if err != nil {
		return nil, err
	}
	var fromURL []Option
	for _, name := range clientParams {
		if v, ok := query[name]; ok {
			o, err := parseClientParam(name, v[0])
			if err != nil {
				return nil, err
			}
			fromURL = append(fromURL, o)
			query.Del(name)
		}
	}
	bu := *u
	bu.RawQuery = query.Encode()
	b, err := s.open(ctx, &bu)
	if err != nil {
		return nil, err
	}
	c, err := New(b, append(fromURL, opts...)...)
	if err != nil {
		b.Close()
		return nil, err
	}
	return c, nil
}

// parseQuery parses a URL's query strictly: each parameter is name=value
// separated by '&', with valid escapes, given once, and one of the
// client's or the scheme's params. The values of secret parameters are
// never quoted.
func parseQuery(raw, scheme string, params []string) (url.Values, error) {
	q := url.Values{}
	if raw == "" {
		return q, nil
	}
	valid := func() string {
		v := append(slices.Clone(clientParams), params...)
		sort.Strings(v)
		return strings.Join(v, ", ")
	}
	for i, part := range strings.Split(raw, "&") {
		rawName, rawValue, hasValue := strings.Cut(part, "=")
		name, err := url.QueryUnescape(rawName)
		switch {
		case part == "":
			return nil, invalid(ErrInvalidOption, "malformed query: parameter %d is empty (an extra '&'?); want name=value pairs separated by '&'", i+1)
		case err != nil:
			return nil, invalid(ErrInvalidOption, "malformed query: parameter %d has a bad escape in its name; escape '%%' as %%25", i+1)
		case !slices.Contains(params, name) && !slices.Contains(clientParams, name):
			return nil, invalid(ErrInvalidOption, "unknown query parameter %q for scheme %s; valid: %s", name, scheme, valid())
		case !hasValue:
			return nil, invalid(ErrInvalidOption, "query parameter %q has no value; want %s=VALUE", name, name)
		case strings.Contains(rawValue, ";"):
			return nil, invalid(ErrInvalidOption, "query parameter %q: its value has a ';'; separate parameters with '&' (escape a ';' in a value as %%3B)", name)
		case q.Has(name):
			return nil, invalid(ErrInvalidOption, "query parameter %q given more than once; give it once", name)
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			return nil, invalid(ErrInvalidOption, "query parameter %q: its value has a bad escape; escape '%%' as %%25", name)
		}
		q.Set(name, value)
	}
	return q, nil
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

// openError is a failure to open a URL, said once with the package's
// prefix even when the backend's own error carries it too, with the URL
// redacted and every secret of it scrubbed from the message (msg).
type openError struct {
	url string
	msg string
	err error
}

func (e *openError) Error() string { return "lock: Open " + e.url + ": " + e.msg }

func (e *openError) Unwrap() error { return e.err }
