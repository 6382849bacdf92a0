package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// goredisParams are the query parameters of go-redis's ParseURL that
// this package hands on to it (skip_verify is one of lock.TLSParams).
var goredisParams = []string{
	"client_name", "conn_max_idle_time", "conn_max_lifetime", "conn_max_lifetime_jitter",
	"db", "dial_timeout", "idle_timeout", "max_active_conns", "max_concurrent_dials",
	"max_conn_age", "max_idle_conns", "max_retries", "max_retry_backoff", "min_idle_conns",
	"min_retry_backoff", "pipeline_pool_size", "pipeline_read_buffer_size",
	"pipeline_write_buffer_size", "pool_fifo", "pool_size", "pool_timeout", "protocol",
	"read_timeout", "write_timeout",
}

// clusterParams are the query parameters go-redis's ParseClusterURL accepts
// (addr adds a node to start from).
var clusterParams = []string{
	"addr", "client_name", "conn_max_idle_time", "conn_max_lifetime", "conn_max_lifetime_jitter",
	"dial_timeout", "dialer_retries", "dialer_retry_timeout", "failing_timeout_seconds",
	"max_active_conns", "max_concurrent_dials", "max_idle_conns", "max_redirects", "max_retries",
	"max_retry_backoff", "min_idle_conns", "min_retry_backoff", "pipeline_pool_size",
	"pipeline_read_buffer_size", "pipeline_write_buffer_size", "pool_fifo", "pool_size",
	"pool_timeout", "protocol", "read_timeout", "write_timeout",
}

// sentinelParams are the query parameters of go-redis's ParseFailoverURL
// that make sense for locks: those that send commands to replicas
// (replica_only, route_by_latency, route_randomly,
// use_disconnected_replicas) are left out, since a lock is written on the
// master, and context_timeout_enabled is always on. username and password
// (the master's) are taken out before go-redis parses the URL.
var sentinelParams = []string{
	"addr", "client_name", "conn_max_idle_time", "conn_max_lifetime", "conn_max_lifetime_jitter",
	"db", "dial_timeout", "dialer_retries", "dialer_retry_timeout", "master_name",
	"max_active_conns", "max_concurrent_dials", "max_idle_conns", "max_retries",
	"max_retry_backoff", "min_idle_conns", "min_retry_backoff",
	"pipeline_pool_size", "pipeline_read_buffer_size", "pipeline_write_buffer_size",
	"pool_fifo", "pool_size", "pool_timeout", "protocol", "read_timeout", "write_timeout",
}

// redlockParams are the query parameters of redlock:// and redlocks://
// besides ownParams, credParams and lock.TLSParams.
var redlockParams = []string{"allowfewnodes", "db", "nodetimeout"}

// credParams are the parameters that give the servers' user name and
// password, as an alternative to the URL's userinfo (on a Sentinel URL:
// the master's; the userinfo and sentinelCredParams are the Sentinels').
var credParams = []string{"username", "password"}

// sentinelCredParams give the Sentinels' user name and password, as an
// alternative to a Sentinel URL's userinfo.
var sentinelCredParams = []string{"sentinel_username", "sentinel_password"}

// noMaintNotifications turns off go-redis's maintenance notifications
// (a Redis Enterprise feature) in the clients this package creates: their
// background goroutine outlives Client.Close in go-redis v9.23.
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// oneDial is the DialerRetries of the clients this package creates: one
// dial per attempt. go-redis dials five times (100ms apart) per attempt by
// default, and retries a failed attempt three times, so an unreachable
// server took 1.6s to report "connection refused" for a call without a
// deadline, and as long again for the cleanup after it; go-redis's own
// retries (max_retries) still dial again, after 8-512ms.
const oneDial = 1

// ownParams are this backend's query parameters, on every scheme.
var ownParams = []string{"durablefence", "maxttl", "prefix", "slotfences"}

// sessionParams are the parameters of the schemes of one server (or a
// Sentinel's master): sessions (WithSessions) need every key on one server.
var sessionParams = []string{"sessions"}

// params joins lists of query parameters.
func params(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

func init() {
	single := params(goredisParams, ownParams, sessionParams, credParams, lock.TLSParams)
	cluster := params(clusterParams, ownParams, credParams, lock.TLSParams)
	sentinel := params(sentinelParams, ownParams, sessionParams, credParams, sentinelCredParams, lock.TLSParams)
	redlock := params(redlockParams, ownParams, credParams, lock.TLSParams)
	for _, s := range []lock.Scheme{
		{Name: "redis", Params: single, Secrets: []string{"password"}, Open: openSingle},
		{Name: "rediss", Params: single, Secrets: []string{"password"}, Open: openSingle},
		{Name: "unix", Params: single, Secrets: []string{"password"}, Open: openSingle},
		{Name: "redis+cluster", Params: cluster, Secrets: []string{"password"}, Open: openCluster},
		{Name: "rediss+cluster", Params: cluster, Secrets: []string{"password"}, Open: openCluster},
		{Name: "redis+sentinel", Params: sentinel, Secrets: []string{"password", "sentinel_password"}, Open: openSentinel},
		{Name: "rediss+sentinel", Params: sentinel, Secrets: []string{"password", "sentinel_password"}, Open: openSentinel},
		{Name: "redlock", Params: redlock, Secrets: []string{"password"}, Open: openRedlock},
		{Name: "redlocks", Params: redlock, Secrets: []string{"password"}, Open: openRedlock},
	} {
		lock.RegisterScheme(s)
	}
}

// speaksTLS reports whether scheme is one of the TLS schemes: rediss,
// rediss+cluster, rediss+sentinel and redlocks.
func speaksTLS(scheme string) bool {
	return strings.HasPrefix(scheme, "rediss") || scheme == "redlocks"
}

// tlsTwin returns the TLS scheme to use instead of the plain scheme.
func tlsTwin(scheme string) string {
	switch scheme {
	case "redlock":
		return "redlocks"
	case "unix":
		return "rediss"
	}
	return strings.Replace(scheme, "redis", "rediss", 1)
}

// common is what every opener of this package reads from a URL first.
type common struct {
	opts       []Option    // from the backend's own parameters
	q          url.Values  // the query, without them and the TLS parameters
	tls        *tls.Config // nil on a scheme without TLS
	user, pass string      // the credentials, from the userinfo or userParam and passParam
}

// parseCommon takes the backend's own parameters, the TLS parameters and
// the credentials (the userinfo, or userParam and passParam, not both)
// out of u.
func parseCommon(u *url.URL, userParam, passParam string) (common, error) {
	opts, q, err := takeOwnParams(u)
	if err != nil {
		return common{}, err
	}
	tlsConfig, err := takeTLS(u.Scheme, q)
	if err != nil {
		return common{}, err
	}
	user, pass, err := credentials(u, q, userParam, passParam)
	if err != nil {
		return common{}, err
	}
	return common{opts: opts, q: q, tls: tlsConfig, user: user, pass: pass}, nil
}

// takeTLS removes lock.TLSParams from q and returns the TLS configuration
// they ask for on scheme: nil on a plain scheme, which refuses them
// (naming the parameter and the TLS scheme to use). The configuration's
// ServerName is empty unless server_name sets it: the TLS dialer then
// verifies the host of each address it dials, so that every node of a
// Cluster, a Sentinel set or a Redlock is checked under its own name.
func takeTLS(scheme string, q url.Values) (*tls.Config, error) {
	cfg, err := lock.TLSConfig(q, speaksTLS(scheme), tlsTwin(scheme))
	for _, p := range lock.TLSParams {
		q.Del(p)
	}
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// credentials returns the user name and password of u: from its userinfo,
// or from the query parameters userParam and passParam, which it removes
// from q. Both at once is an error.
func credentials(u *url.URL, q url.Values, userParam, passParam string) (user, pass string, err error) {
	fromQuery := q.Has(userParam) || q.Has(passParam)
	user, pass = q.Get(userParam), q.Get(passParam)
	q.Del(userParam)
	q.Del(passParam)
	if u.User == nil {
		return user, pass, nil
	}
	if fromQuery {
		return "", "", fmt.Errorf("%w: redis: the URL gives credentials twice, in its userinfo (user:password@) and as %s or %s; give them one way", backend.ErrInvalid, userParam, passParam)
	}
	pass, _ = u.User.Password()
	return u.User.Username(), pass, nil
}

// goredisURL returns u with query q and without its userinfo, for
// go-redis's parsers: the credentials are set on the options afterwards,
// so that no error of go-redis's can quote them.
func goredisURL(u *url.URL, q url.Values) string {
	gu := *u
	gu.User = nil
	gu.RawQuery = q.Encode()
	return gu.String()
}

// goredisParseError wraps an error of go-redis's URL parsers in
// backend.ErrInvalid, without url.Parse's quote of the whole URL.
func goredisParseError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("%w: %v", backend.ErrInvalid, err)
}

// goredisMultiURL turns a URL of this package's multi-host form,
// SCHEME+KIND://host1:port,host2:port[/db][?query], into go-redis's form,
// SCHEME://host1:port[/db]?addr=host2:port with query q and without
// userinfo; hosts without a port get defaultPort.
func goredisMultiURL(u *url.URL, q url.Values, kind, defaultPort, example string) (string, error) {
	if u.Host == "" {
		return "", fmt.Errorf("%w: redis: %s URL names no nodes; want %s", backend.ErrInvalid, kind, example)
	}
	var hosts []string
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return "", fmt.Errorf("%w: redis: empty node in %q; want %s", backend.ErrInvalid, u.Host, example)
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, defaultPort)
		}
		hosts = append(hosts, h)
	}
	q = maps.Clone(q)
	q["addr"] = append(hosts[1:], q["addr"]...)
	gu := *u
	gu.Scheme = strings.TrimSuffix(u.Scheme, "+"+kind)
	gu.Host = hosts[0]
	return goredisURL(&gu, q), nil
}

// openCluster opens a Redis Cluster: redis+cluster://host1:port,host2:port
// (rediss+cluster:// with TLS), any nodes to start from.
func openCluster(_ context.Context, u *url.URL) (backend.Backend, error) {
	p, err := parseCommon(u, "username", "password")
	if err != nil {
		return nil, err
	}
	opts, q, tlsConfig, user, pass := p.opts, p.q, p.tls, p.user, p.pass
	if strings.Trim(u.Path, "/") != "" {
		return nil, fmt.Errorf("%w: redis: a Redis Cluster has one database; remove %q from the URL", backend.ErrInvalid, u.Path)
	}
	gu, err := goredisMultiURL(u, q, "cluster", "6379", "redis+cluster://host1:port,host2:port,host3:port")
	if err != nil {
		return nil, err
	}
	o, err := goredis.ParseClusterURL(gu)
	if err != nil {
		return nil, goredisParseError(err)
	}
	o.Username, o.Password = user, pass
	o.TLSConfig = tlsConfig
	o.ContextTimeoutEnabled = true
	if !q.Has("dialer_retries") {
		o.DialerRetries = oneDial
	}
	o.Dialer = ownedDialer(tlsConfig)
	o.MaintNotificationsConfig = noMaintNotifications()
	return New(goredis.NewClusterClient(o), opts...), nil
}

// openSentinel opens the master that Redis Sentinel names:
// redis+sentinel://sentinel1:26379,sentinel2:26379[/db]?master_name=NAME
// (rediss+sentinel:// with TLS, to the Sentinels and the master); the
// URL's user and password (or the parameters sentinel_username and
// sentinel_password) are the Sentinels', the parameters username and
// password the master's.
func openSentinel(_ context.Context, u *url.URL) (backend.Backend, error) {
	p, err := parseCommon(u, "sentinel_username", "sentinel_password")
	if err != nil {
		return nil, err
	}
	opts, q, tlsConfig, sentinelUser, sentinelPass := p.opts, p.q, p.tls, p.user, p.pass
	masterUser, masterPass := q.Get("username"), q.Get("password")
	q.Del("username")
	q.Del("password")
	const example = "redis+sentinel://sentinel1:26379,sentinel2:26379?master_name=mymaster"
	if q.Get("master_name") == "" {
		return nil, fmt.Errorf("%w: redis: a Sentinel URL needs master_name, the name the Sentinels monitor; want %s", backend.ErrInvalid, example)
	}
	gu, err := goredisMultiURL(u, q, "sentinel", "26379", example)
	if err != nil {
		return nil, err
	}
	o, err := goredis.ParseFailoverURL(gu)
	if err != nil {
		return nil, goredisParseError(err)
	}
	o.SentinelUsername, o.SentinelPassword = sentinelUser, sentinelPass
	o.Username, o.Password = masterUser, masterPass
	o.TLSConfig = tlsConfig
	o.ContextTimeoutEnabled = true
	if !q.Has("dialer_retries") {
		o.DialerRetries = oneDial
	}
	o.Dialer = ownedDialer(tlsConfig)
	return opened(New(goredis.NewFailoverClient(o), opts...))
}

// takeOwnParams removes this backend's parameters from u's query and returns
// the options they set.
func takeOwnParams(u *url.URL) ([]Option, url.Values, error) {
	q := u.Query()
	opts := []Option{withOwnClients()}
	if v, ok := q["prefix"]; ok {
		opts = append(opts, WithPrefix(v[0]))
		q.Del("prefix")
	}
	for _, p := range []struct {
		name string
		set  func(bool) Option
	}{{"durablefence", WithDurableFence}, {"slotfences", WithSlotFenceCounters}, {"sessions", WithSessions}} {
		v, ok := q[p.name]
		if !ok {
			continue
		}
		on, err := strconv.ParseBool(v[0])
		if err != nil {
			return nil, nil, fmt.Errorf("%w: redis: %s=%q: want true or false", backend.ErrInvalid, p.name, v[0])
		}
		opts = append(opts, p.set(on))
		q.Del(p.name)
	}
	if v, ok := q["maxttl"]; ok {
		d, err := time.ParseDuration(v[0])
		if err != nil || d < MinTTL || d > lock.MaxTTL {
			return nil, nil, fmt.Errorf("%w: redis: maxttl=%q: want a Go duration of at least %v and at most %v (lock.MaxTTL), such as 1m", backend.ErrInvalid, v[0], MinTTL, lock.MaxTTL)
		}
		opts = append(opts, WithMaxTTL(d))
		q.Del("maxttl")
	}
	return opts, q, nil
}

// openSingle opens redis://, rediss:// and unix:// URLs.
func openSingle(_ context.Context, u *url.URL) (backend.Backend, error) {
	p, err := parseCommon(u, "username", "password")
	if err != nil {
		return nil, err
	}
	opts, q, tlsConfig, user, pass := p.opts, p.q, p.tls, p.user, p.pass
	o, err := goredis.ParseURL(goredisURL(u, q))
	if err != nil {
		return nil, goredisParseError(err)
	}
	o.Username, o.Password = user, pass
	o.TLSConfig = tlsConfig
	o.ContextTimeoutEnabled = true
	o.DialerRetries = oneDial
	o.Dialer = ownedDialer(tlsConfig)
	o.MaintNotificationsConfig = noMaintNotifications()
	return opened(New(goredis.NewClient(o), opts...))
}

// redlockDurations returns the option that the parameter nodetimeout of a
// Redlock URL sets, checked before anything is sent: 0 < nodetimeout <=
// maxTTL, the URL's maxttl (takeOwnParams checked it: MinTTL <= maxttl <=
// lock.MaxTTL) or DefaultMaxTTL (a node request that may outlast every
// lease bounds nothing).
func redlockDurations(q url.Values, maxTTL time.Duration) ([]Option, error) {
	var opts []Option
	if v := q.Get("nodetimeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > maxTTL {
			return nil, fmt.Errorf("%w: redis: nodetimeout=%q: want a positive Go duration of at most maxttl (%v), such as 50ms", backend.ErrInvalid, v, maxTTL)
		}
		opts = append(opts, WithNodeTimeout(d))
	}
	return opts, nil
}

// openRedlock opens redlock:// and redlocks:// (every node over TLS).
func openRedlock(ctx context.Context, u *url.URL) (backend.Backend, error) {
	example := u.Scheme + "://host1:port,host2:port,host3:port"
	p, err := parseCommon(u, "username", "password")
	if err != nil {
		return nil, err
	}
	opts, q, tlsConfig, user, pass := p.opts, p.q, p.tls, p.user, p.pass
	if strings.Trim(u.Path, "/") != "" {
		return nil, fmt.Errorf("%w: redis: a %s URL takes no path (%q); give the database as db=N", backend.ErrInvalid, u.Scheme, u.Path)
	}
	hosts := strings.Split(u.Host, ",")
	if u.Host == "" || len(hosts) == 0 {
		return nil, fmt.Errorf("%w: redis: %s URL names no nodes; want %s", backend.ErrInvalid, u.Scheme, example)
	}
	base := goredis.Options{
		ContextTimeoutEnabled:    true,
		DialerRetries:            oneDial,
		Username:                 user,
		Password:                 pass,
		MaintNotificationsConfig: noMaintNotifications(),
	}
	if v := q.Get("db"); v != "" {
		if base.DB, err = strconv.Atoi(v); err != nil || base.DB < 0 {
			return nil, fmt.Errorf("%w: redis: db=%q: want a database number (0 or more)", backend.ErrInvalid, v)
		}
	}
	durations, err := redlockDurations(q, applied(opts).maxTTL)
	if err != nil {
		return nil, err
	}
	opts = append(opts, durations...)
	if v, ok := q["allowfewnodes"]; ok {
		on, err := strconv.ParseBool(v[0])
		if err != nil {
			return nil, fmt.Errorf("%w: redis: allowfewnodes=%q: want true or false", backend.ErrInvalid, v[0])
		}
		opts = append(opts, WithAllowFewNodes(on))
	}
	addrs := make([]string, len(hosts))
	for i, h := range hosts {
		if h == "" {
			return nil, fmt.Errorf("%w: redis: empty node in %q; want %s", backend.ErrInvalid, u.Host, example)
		}
		if addrs[i], err = withPort(h); err != nil {
			return nil, err
		}
	}
	if err := distinctServers(ctx, addrs); err != nil {
		return nil, err
	}
	nodes := make([]Conn, 0, len(addrs))
	for _, a := range addrs {
		o := base
		o.Addr = a
		if tlsConfig != nil {
			// A configuration of its own per node: its ServerName
			// stays empty unless server_name set it, and the TLS
			// dialer verifies each node under its own host.
			o.TLSConfig = tlsConfig.Clone()
		}
		o.Dialer = ownedDialer(o.TLSConfig)
		nodes = append(nodes, goredis.NewClient(&o))
	}
	r, err := NewRedlock(nodes, opts...)
	if err != nil {
		for _, n := range nodes {
			n.(*goredis.Client).Close()
		}
		return nil, err
	}
	return r, nil
}

// withPort returns the node address host[:port] with Redis's port, 6379,
// when it names none.
func withPort(node string) (string, error) {
	if _, _, err := net.SplitHostPort(node); err == nil {
		return node, nil
	}
	if _, _, err := net.SplitHostPort(node + ":6379"); err != nil {
		return "", fmt.Errorf("%w: redis: redlock node %q: want host:port", backend.ErrInvalid, node)
	}
	return node + ":6379", nil
}

// distinctServers returns an error wrapping ErrInvalid when two of the
// Redlock nodes addrs (host:port) are the same server: the same address
// once host names are resolved. A majority that one server can make up
// alone (redlock://a,a,b) would grant locks with b down, on one server's
// word. Checked when the URL is opened; a name that resolves elsewhere
// later is not caught, and neither are two addresses of one server (a
// proxy, a NAT).
func distinctServers(ctx context.Context, addrs []string) error {
	seen := map[string]string{} // resolved ip:port -> node as given
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return fmt.Errorf("%w: redis: redlock node %q: %v", backend.ErrInvalid, a, err)
		}
		ips, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil {
			return fmt.Errorf("redis: redlock node %q: resolving it to check that the nodes are distinct servers: %w", a, err)
		}
		mine := map[string]bool{}
		for _, ip := range ips {
			if p := net.ParseIP(ip); p != nil {
				ip = p.String()
			}
			key := net.JoinHostPort(ip, port)
			if prev, dup := seen[key]; dup && !mine[key] {
				return fmt.Errorf("%w: redis: redlock nodes %q and %q are the same server (%s); a Redlock needs independent servers, so that no one server makes a majority", backend.ErrInvalid, prev, a, key)
			}
			seen[key], mine[key] = a, true
		}
	}
	return nil
}

// applied returns the options opts set.
func applied(opts []Option) options {
	o := defaultOptions()
	for _, f := range opts {
		f(&o)
	}
	return o
}

// opened returns a backend opened from a URL, or why its parameters do not
// go together (sessions with slot fences, say), closing it.
func opened(b *Backend) (backend.Backend, error) {
	if b.refused != nil {
		b.Close()
		return nil, b.refused
	}
	return b, nil
}
