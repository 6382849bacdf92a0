package etcd

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// urlParams are the query parameters of etcd:// and etcds:// URLs besides
// lock.TLSParams (which only etcds:// accepts).
var urlParams = []string{"dialtimeout", "electiontimeout", "maxttl", "prefix", "sessions"}

// DefaultDialTimeout bounds the connection to an endpoint of a client built
// from a URL.
const DefaultDialTimeout = 5 * time.Second

// The ranges of the URL's durations. A dial timeout below MinDialTimeout
// fails against anything but a loopback member; etcd refuses an
// --election-timeout above MaxElectionTimeout.
const (
	MinDialTimeout     = 10 * time.Millisecond
	MaxDialTimeout     = 10 * time.Minute
	MinElectionTimeout = time.Millisecond
	MaxElectionTimeout = 50 * time.Second
)

func init() {
	params := append(slices.Clone(urlParams), lock.TLSParams...)
	lock.RegisterScheme(lock.Scheme{Name: "etcd", Params: params, Open: open})
	lock.RegisterScheme(lock.Scheme{Name: "etcds", Params: params, Open: open})
}

// open builds a backend, and the client it owns, from an etcd:// or etcds://
// URL (see the package doc).
func open(_ context.Context, u *url.URL) (backend.Backend, error) {
	cfg, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		// Only with user:password@, which New authenticates at once.
		if o := applied(opts); o.tls != nil && o.tls.lastErr() != nil {
			return nil, fmt.Errorf("etcd: %w (the latest TLS connection failed: %w)", err, o.tls.lastErr())
		}
		return nil, fmt.Errorf("etcd: %w", err)
	}
	b, err := New(cli, append(opts, withCloseClient())...)
	if err != nil {
		cli.Close()
		return nil, err
	}
	return b, nil
}

// parseURL returns the client configuration and the backend options a URL
// names. Its errors never quote the URL (lock.Open shows it, redacted),
// only the part that is wrong.
func parseURL(u *url.URL) (clientv3.Config, []Option, error) {
	fail := func(format string, args ...any) (clientv3.Config, []Option, error) {
		return clientv3.Config{}, nil, fmt.Errorf("%w: etcd: "+format, append([]any{backend.ErrInvalid}, args...)...)
	}
	want := "want " + u.Scheme + "://[user:password@]host:port[,host:port...]"
	if u.Opaque != "" {
		return fail("no // after %s:; %s", u.Scheme, want)
	}
	if u.Host == "" {
		return fail("no endpoint; %s", want)
	}
	if u.Path != "" && u.Path != "/" {
		return fail("path %q: the key prefix is the parameter prefix; %s", u.Path, want)
	}
	cfg := clientv3.Config{DialTimeout: DefaultDialTimeout, Logger: zap.NewNop()}
	for _, ep := range strings.Split(u.Host, ",") {
		if ep == "" || !strings.Contains(ep, ":") {
			return fail("endpoint %q is not host:port; %s", ep, want)
		}
		cfg.Endpoints = append(cfg.Endpoints, ep)
	}
	q := u.Query()
	tlsCfg, err := lock.TLSConfig(q, u.Scheme == "etcds", "etcds")
	if err != nil {
		return clientv3.Config{}, nil, err // wraps lock.ErrInvalid, names the parameter
	}
	var opts []Option
	if tlsCfg != nil {
		creds := newTLSCreds(tlsCfg)
		cfg.TLS = tlsCfg
		// Given last, they replace the credentials clientv3 makes of
		// cfg.TLS (see tlsCreds for why).
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithTransportCredentials(creds))
		opts = append(opts, func(o *options) { o.tls = creds })
	}
	if u.User != nil {
		user := u.User.Username()
		pass, hasPass := u.User.Password()
		switch {
		case user == "" && pass == "":
			return fail("empty user information before '@'; give user:password@ or nothing")
		case user == "":
			return fail("a password but no user name; want user:password@ (etcd authentication)")
		case !hasPass:
			// Not quoted: a userinfo without ':' may be a secret pasted alone.
			return fail("a user name but no password; want user:password@ (etcd authentication)")
		case pass == "":
			return fail("user %q has an empty password; want user:password@ (etcd authentication)", user)
		}
		cfg.Username, cfg.Password = user, pass
	}
	if v, ok := q["prefix"]; ok {
		opts = append(opts, WithPrefix(v[0]))
	}
	duration := func(name string, lo, hi time.Duration) (time.Duration, bool, error) {
		v, ok := q[name]
		if !ok {
			return 0, false, nil
		}
		d, err := time.ParseDuration(v[0])
		if err != nil || d < lo || d > hi {
			return 0, false, fmt.Errorf("%w: etcd: %s=%q: want a Go duration from %v to %v, such as 1s or 500ms", backend.ErrInvalid, name, v[0], lo, hi)
		}
		return d, true, nil
	}
	if d, ok, err := duration("dialtimeout", MinDialTimeout, MaxDialTimeout); err != nil {
		return clientv3.Config{}, nil, err
	} else if ok {
		cfg.DialTimeout = d
	}
	if d, ok, err := duration("electiontimeout", MinElectionTimeout, MaxElectionTimeout); err != nil {
		return clientv3.Config{}, nil, err
	} else if ok {
		opts = append(opts, WithElectionTimeout(d))
	}
	if v, ok := q["sessions"]; ok {
		on, err := strconv.ParseBool(v[0])
		if err != nil {
			return fail("sessions=%q: want true or false", v[0])
		}
		opts = append(opts, WithSessions(on))
	}
	if v, ok := q["maxttl"]; ok {
		d, err := time.ParseDuration(v[0])
		if err != nil || d < MinTTL || d > lock.MaxTTL {
			return fail("maxttl=%q: want a Go duration of at least %v and at most %v (lock.MaxTTL), such as 1m", v[0], MinTTL, lock.MaxTTL)
		}
		opts = append(opts, WithMaxTTL(d))
	}
	return cfg, opts, nil
}

// applied returns the options opts set.
func applied(opts []Option) options {
	o := defaultOptions()
	for _, f := range opts {
		f(&o)
	}
	return o
}
