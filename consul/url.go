package consul

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// urlParams are the query parameters of consul:// and consuls:// URLs
// besides lock.TLSParams (which only consuls:// accepts).
var urlParams = []string{"lockdelay", "maxttl", "minttl", "prefix", "sessions", "token", "token_file"}

func init() {
	params := append(slices.Clone(urlParams), lock.TLSParams...)
	for _, name := range []string{"consul", "consuls"} {
		lock.RegisterScheme(lock.Scheme{Name: name, Params: params, Secrets: []string{"token"}, Open: open})
	}
}

// open builds a backend, and the client it owns, from a consul:// or
// consuls:// URL (see URLs in the package doc).
func open(_ context.Context, u *url.URL) (backend.Backend, error) {
	cfg, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	cli, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: consul: %v", backend.ErrInvalid, err)
	}
	return New(cli, opts...)
}

// parseURL returns the client configuration and the backend options a URL
// names, having checked all of it. Its errors never quote the URL
// (lock.Open shows it, redacted), only the part that is wrong, and never a
// secret.
func parseURL(u *url.URL) (*api.Config, []Option, error) {
	fail := func(format string, args ...any) (*api.Config, []Option, error) {
		return nil, nil, fmt.Errorf("%w: consul: "+format, append([]any{backend.ErrInvalid}, args...)...)
	}
	want := "want " + u.Scheme + "://[user:password@]host:port"
	switch {
	case u.Opaque != "":
		return fail("no // after %s:; %s", u.Scheme, want)
	case u.Host == "":
		return fail("no host; %s", want)
	case u.Path != "" && u.Path != "/":
		return fail("path %q; set the key prefix with ?prefix=; %s", u.Path, want)
	}
	if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" {
		return fail("host %q is not host:port; %s", u.Host, want)
	}
	q := u.Query()
	tlsCfg, err := lock.TLSConfig(q, u.Scheme == "consuls", "consuls")
	if err != nil {
		return nil, nil, err // wraps lock.ErrInvalid, names the parameter
	}
	tr := newTransport()
	tr.TLSClientConfig = tlsCfg
	cfg := &api.Config{
		// Address, Scheme and HttpClient given here leave api.NewClient
		// nothing to take from CONSUL_HTTP_ADDR, CONSUL_HTTP_SSL,
		// CONSUL_HTTP_SSL_VERIFY, CONSUL_CACERT, CONSUL_CAPATH,
		// CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY or
		// CONSUL_TLS_SERVER_NAME: it builds no HTTP client of its own.
		Address:    u.Host,
		Scheme:     "http",
		Transport:  tr,
		HttpClient: &http.Client{Transport: tr},
	}
	if u.Scheme == "consuls" {
		cfg.Scheme = "https"
	}
	if u.User != nil {
		user := u.User.Username()
		pass, _ := u.User.Password()
		if user == "" && pass == "" {
			return fail("empty user information before '@'; give user:password@ (HTTP basic authentication) or nothing")
		}
		cfg.HttpAuth = &api.HttpBasicAuth{Username: user, Password: pass}
	}
	token, tokenFile := q.Get("token"), q.Get("token_file")
	switch {
	case q.Has("token") && q.Has("token_file"):
		return fail("token and token_file both given; give one")
	case q.Has("token") && token == "":
		return fail("token is empty; give an ACL token, or leave the parameter out")
	case q.Has("token_file"):
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			// Not quoted: the path may say more than it should.
			return fail("token_file: cannot read the file: %v", unwrapPath(err))
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return fail("token_file: the file is empty; want a file holding an ACL token")
		}
	}
	if token != "" {
		// api.NewClient may still replace cfg.Token by CONSUL_HTTP_TOKEN_FILE's
		// (when CONSUL_HTTP_TOKEN equals it): the transport sets the URL's.
		cfg.Token = token
		cfg.HttpClient.Transport = tokenTransport{base: tr, token: token}
	}
	opts := []Option{func(o *options) { o.closeCli = tr.CloseIdleConnections }}
	if v, ok := q["prefix"]; ok {
		opts = append(opts, WithPrefix(v[0]))
	}
	for _, p := range []struct {
		name   string
		lo, hi time.Duration
		set    func(time.Duration) Option
	}{
		{"minttl", time.Nanosecond, MaxTTL, WithMinTTL},
		{"lockdelay", 0, MaxLockDelay, WithLockDelay},
	} {
		if v, ok := q[p.name]; ok {
			d, err := time.ParseDuration(v[0])
			if err != nil || d < p.lo || d > p.hi {
				lo := p.lo.String()
				if p.lo == time.Nanosecond {
					lo = "more than 0"
				}
				return fail("%s=%q: want a Go duration from %s to %v, such as 1s", p.name, v[0], lo, p.hi)
			}
			opts = append(opts, p.set(d))
		}
	}
	if v, ok := q["sessions"]; ok {
		on, err := strconv.ParseBool(v[0])
		if err != nil {
			return fail("sessions=%q: want true or false", v[0])
		}
		opts = append(opts, WithSessions(on))
	}
	if v, ok := q["maxttl"]; ok {
		lo := DefaultMinTTL
		if m, ok := q["minttl"]; ok {
			lo, _ = time.ParseDuration(m[0]) // checked above
		}
		d, err := time.ParseDuration(v[0])
		if err != nil || d < lo || d > MaxTTL {
			return fail("maxttl=%q: want a Go duration of at least %v (minttl) and at most %v (Consul's longest session TTL), such as 1m", v[0], lo, MaxTTL)
		}
		opts = append(opts, WithMaxTTL(d))
	}
	return cfg, opts, nil
}

// unwrapPath returns the reason of a *os.PathError without its path.
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// newTransport returns a transport like the Consul API client's default
// (go-cleanhttp's pooled transport: connections kept for reuse, proxies
// from HTTP_PROXY, HTTPS_PROXY and NO_PROXY), but HTTP/1.1 over TLS too:
// consuls:// then uses connections as consul:// does (one per blocking
// query, which the backend bounds; see maxLossWatches), and a refused
// handshake reaches the error (HTTP/2 reports only "client conn could
// not be established").
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   30 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     false,
		MaxIdleConnsPerHost:   runtime.GOMAXPROCS(0) + 1,
	}
}

// tokenTransport sends the URL's ACL token with every request, whatever
// token api.NewClient settled on.
type tokenTransport struct {
	base  http.RoundTripper
	token string
}

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Consul-Token", t.token)
	return t.base.RoundTrip(r)
}
