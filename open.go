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
	// the RedactURL and every error of the Open of the URLMux the scheme
	// is registered in hide them. A parameter whose
	// name contains pass, token, secret, auth or credential is hidden
	// whether listed or not.
	Secrets []string
	// URLs lists the parameters of Params whose values are backend URLs
	// themselves (a scheme built over other schemes, such as package
	// migrate's): redaction applies to them, recursively, the rule it
	// applies to the outer URL, so that only their secrets are hidden.
	URLs []string
	// Open builds the backend. Give it or OpenWithOptions, not both.
	Open Opener
	// OpenWithOptions builds the backend and returns, with it, client
	// options that the URL implies (package migrate's phase implies a
	// fence epoch, lock.WithFenceEpoch). Open applies them first, then
	// the client's own URL parameters, then the caller's options.
	OpenWithOptions func(ctx context.Context, u *url.URL) (backend.Backend, []Option, error)
}

// URLMux maps URL schemes to the backends that open them, for Open. Each
// URLMux has schemes of its own: two may register the same scheme name
// with different backends. Backend packages register their schemes, from
// init, in the default URLMux (DefaultURLMux), which the package-level
// functions Register, RegisterScheme, Schemes, Open, RedactURL, RedactText
// and URLHasSecrets use. A program or a library that wants schemes of its
// own, without touching the process's, makes a URLMux (the zero value is
// an empty one, ready to use) and registers them there, possibly copying a
// backend's from the default (see URLMux.Scheme). A URLMux is safe for
// concurrent use; it must not be copied after first use.
type URLMux struct {
	mu      sync.RWMutex
	schemes map[string]Scheme
}

// defaultMux is DefaultURLMux's.
var defaultMux = new(URLMux)

// DefaultURLMux returns the URLMux of the package-level functions
// (Register, RegisterScheme, Schemes, Open, RedactURL, RedactText,
// URLHasSecrets), in which the backend packages register their schemes
// when they are imported.
func DefaultURLMux() *URLMux { return defaultMux }

// Register makes a backend available to Open under scheme: it is
// RegisterScheme(Scheme{Name: scheme, Params: params, Open: open}), in the
// default URLMux.
func Register(scheme string, params []string, open Opener) {
	RegisterScheme(Scheme{Name: scheme, Params: params, Open: open})
}

// RegisterScheme makes a backend available to Open under s.Name, in the
// default URLMux (DefaultURLMux().RegisterScheme(s)). Backend packages
// call it from init.
func RegisterScheme(s Scheme) { defaultMux.RegisterScheme(s) }

// RegisterScheme makes a backend available to m.Open under s.Name. Like
// database/sql.Register, it panics when the name is empty or already
// registered in m, Open is nil, a parameter is one of the client's, or a
// secret is not a parameter: those are mistakes in the program, not in its
// input.
func (m *URLMux) RegisterScheme(s Scheme) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.Name == "" || (s.Open == nil) == (s.OpenWithOptions == nil) {
		panic("lock: Register needs a scheme and one opener (Open or OpenWithOptions)")
	}
	if _, dup := m.schemes[s.Name]; dup {
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
	for _, p := range s.URLs {
		if !slices.Contains(s.Params, p) {
			panic("lock: Register: URL parameter " + p + " is not a parameter of scheme " + s.Name)
		}
	}
	if m.schemes == nil {
		m.schemes = map[string]Scheme{}
	}
	m.schemes[s.Name] = cloneScheme(s)
}

// Scheme returns the scheme registered in m under name, and whether there
// is one: for instance to register a backend package's scheme, taken from
// the default URLMux, in a URLMux of one's own (under its name or
// another).
func (m *URLMux) Scheme(name string) (Scheme, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s, ok := m.schemes[name]
	return cloneScheme(s), ok
}

// cloneScheme returns s with slices of its own.
func cloneScheme(s Scheme) Scheme {
	s.Params = slices.Clone(s.Params)
	s.Secrets = slices.Clone(s.Secrets)
	s.URLs = slices.Clone(s.URLs)
	return s
}

// Schemes returns the URL schemes registered in the default URLMux,
// sorted.
func Schemes() []string { return defaultMux.Schemes() }

// Schemes returns the URL schemes registered in m, sorted.
func (m *URLMux) Schemes() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.schemes))
	for s := range m.schemes {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// Open returns a Client for the backend named by rawURL, such as
// "mem://name", "redis://host:6379/0" or "etcd://host:2379", from the
// schemes of the default URLMux (DefaultURLMux().Open). The backend
// package must be imported (often for its side effect only) so that its
// scheme is registered. Query parameters ttl, drift and maxhold (Go
// durations such as 30s) and autorenew (true or false) set the client's
// defaults; opts given here override them. Unknown schemes and unknown
// parameters are errors that list what is valid.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Client, error) {
	return defaultMux.Open(ctx, rawURL, opts...)
}

// Open is the package-level Open, with the schemes registered in m. Its
// errors show rawURL as m.RedactURL does, and cut its secrets out as
// m.RedactText does.
func (m *URLMux) Open(ctx context.Context, rawURL string, opts ...Option) (*Client, error) {
	if ctx == nil {
		return nil, invalid(ErrInvalid, "Open: nil context")
	}
	c, err := m.open(ctx, rawURL, opts)
	if err != nil {
		return nil, &openError{url: m.RedactURL(rawURL), err: err, msg: m.RedactText(strings.TrimPrefix(err.Error(), "lock: "), rawURL)}
	}
	return c, nil
}

// open is Open; its errors may quote rawURL, Open redacts them.
func (m *URLMux) open(ctx context.Context, rawURL string, opts []Option) (*Client, error) {
	b, fromURL, err := m.openBackend(ctx, rawURL)
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

// OpenBackend returns the backend rawURL names, as Open would build it,
// and the client options that the URL sets (its ttl, drift, maxhold and
// autorenew parameters, and what its scheme implies), without making a
// Client: for a scheme built over others (package migrate opens its from
// and to URLs with it), or to wrap the backend before lock.New. The
// caller owns the backend. Errors are Open's, with rawURL redacted.
func (m *URLMux) OpenBackend(ctx context.Context, rawURL string) (backend.Backend, []Option, error) {
	if ctx == nil {
		return nil, nil, invalid(ErrInvalid, "OpenBackend: nil context")
	}
	b, opts, err := m.openBackend(ctx, rawURL)
	if err != nil {
		return nil, nil, &openError{url: m.RedactURL(rawURL), err: err, msg: m.RedactText(strings.TrimPrefix(err.Error(), "lock: "), rawURL)}
	}
	return b, opts, nil
}

// openBackend is OpenBackend; its errors may quote rawURL.
func (m *URLMux) openBackend(ctx context.Context, rawURL string) (backend.Backend, []Option, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error quotes the whole URL; Open shows it redacted
		}
		return nil, nil, invalid(ErrInvalid, "not a URL: %v; want SCHEME://ADDRESS with a registered scheme (%s)", err, strings.Join(m.Schemes(), ", "))
	}
	if u.Scheme == "" {
		return nil, nil, invalid(ErrInvalid, "no scheme; want SCHEME://ADDRESS with a registered scheme (%s)", strings.Join(m.Schemes(), ", "))
	}
	if u.Fragment != "" || strings.Contains(rawURL, "#") {
		return nil, nil, invalid(ErrInvalid, "the URL has a fragment (#...), which no backend reads; escape a '#' in a value as %%23")
	}
	s, ok := m.Scheme(u.Scheme)
	if !ok {
		known := m.Schemes()
		var hint string
		switch {
		case m != defaultMux && len(known) == 0:
			hint = "none is registered in this URLMux; register one with its RegisterScheme"
		case m != defaultMux:
			hint = "registered in this URLMux: " + strings.Join(known, ", ")
		case len(known) == 0:
			hint = "none is registered; import a backend package, such as github.com/distlock/lock/memory"
		default:
			hint = "registered: " + strings.Join(known, ", ") + " (forgotten import?)"
		}
		return nil, nil, fmt.Errorf("%w %q; %s", ErrUnknownScheme, u.Scheme, hint)
	}
	query, err := parseQuery(u.RawQuery, u.Scheme, s.Params)
	if err != nil {
		return nil, nil, err
	}
	var fromURL []Option
	for _, name := range clientParams {
		if v, ok := query[name]; ok {
			o, err := parseClientParam(name, v[0])
			if err != nil {
				return nil, nil, err
			}
			fromURL = append(fromURL, o)
			query.Del(name)
		}
	}
	bu := *u
	bu.RawQuery = query.Encode()
	if s.OpenWithOptions != nil {
		b, implied, err := s.OpenWithOptions(ctx, &bu)
		if err != nil {
			return nil, nil, err
		}
		return b, append(implied, fromURL...), nil
	}
	b, err := s.Open(ctx, &bu)
	if err != nil {
		return nil, nil, err
	}
	return b, fromURL, nil
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
