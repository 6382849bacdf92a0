package redis

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// goredisParams are the query parameters go-redis's ParseURL accepts.
var goredisParams = []string{
	"client_name", "conn_max_idle_time", "conn_max_lifetime", "conn_max_lifetime_jitter",
	"db", "dial_timeout", "idle_timeout", "max_active_conns", "max_concurrent_dials",
	"max_conn_age", "max_idle_conns", "max_retries", "max_retry_backoff", "min_idle_conns",
	"min_retry_backoff", "pipeline_pool_size", "pipeline_read_buffer_size",
	"pipeline_write_buffer_size", "pool_fifo", "pool_size", "pool_timeout", "protocol",
	"read_timeout", "skip_verify", "write_timeout",
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
// master, and context_timeout_enabled is always on.
var sentinelParams = []string{
	"addr", "client_name", "conn_max_idle_time", "conn_max_lifetime", "conn_max_lifetime_jitter",
	"db", "dial_timeout", "dialer_retries", "dialer_retry_timeout", "master_name",
	"max_active_conns", "max_concurrent_dials", "max_idle_conns", "max_retries",
	"max_retry_backoff", "min_idle_conns", "min_retry_backoff", "password",
	"pipeline_pool_size", "pipeline_read_buffer_size", "pipeline_write_buffer_size",
	"pool_fifo", "pool_size", "pool_timeout", "protocol", "read_timeout", "skip_verify",
	"username", "write_timeout",
}

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
var ownParams = []string{"durablefence", "prefix", "slotfences"}

func init() {
	single := append(append([]string(nil), goredisParams...), ownParams...)
	for _, scheme := range []string{"redis", "rediss", "unix"} {
		lock.Register(scheme, single, openSingle)
	}
	lock.Register("redlock", append([]string{"allowfewnodes", "db", "maxttl", "nodetimeout", "password", "username"}, ownParams...), openRedlock)
	for _, scheme := range []string{"redis+cluster", "rediss+cluster"} {
		lock.Register(scheme, append(slices.Clone(clusterParams), ownParams...), openCluster)
	}
	for _, scheme := range []string{"redis+sentinel", "rediss+sentinel"} {
		lock.Register(scheme, append(slices.Clone(sentinelParams), ownParams...), openSentinel)
	}
}

// goredisMultiURL turns a URL of this package's multi-host form,
// SCHEME+KIND://[user:password@]host1:port,host2:port[/db][?query], into
// go-redis's form, SCHEME://[user:password@]host1:port[/db]?addr=host2:port
// with query q; hosts without a port get defaultPort.
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
	gu.RawQuery = q.Encode()
	return gu.String(), nil
}

// openCluster opens a Redis Cluster: redis+cluster://host1:port,host2:port
// (rediss+cluster:// with TLS), any nodes to start from.
func openCluster(_ context.Context, u *url.URL) (backend.Backend, error) {
	installGoRedisLogger()
	opts, q, err := takeOwnParams(u)
	if err != nil {
		return nil, err
	}
	if strings.Trim(u.Path, "/") != "" {
		return nil, fmt.Errorf("%w: redis: a Redis Cluster has one database; remove %q from the URL", backend.ErrInvalid, u.Path)
	}
	gu, err := goredisMultiURL(u, q, "cluster", "6379", "redis+cluster://host1:port,host2:port,host3:port")
	if err != nil {
		return nil, err
	}
	o, err := goredis.ParseClusterURL(gu)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrInvalid, err)
	}
	o.ContextTimeoutEnabled = true
	if !q.Has("dialer_retries") {
		o.DialerRetries = oneDial
	}
	o.Dialer = ownedDialer(o.TLSConfig)
	o.MaintNotificationsConfig = noMaintNotifications()
	return New(goredis.NewClusterClient(o), opts...), nil
}

// openSentinel opens the master that Redis Sentinel names:
// redis+sentinel://sentinel1:26379,sentinel2:26379[/db]?master_name=NAME
// (rediss+sentinel:// with TLS); the URL's user and password are the
// Sentinels', the parameters username and password the master's.
func openSentinel(_ context.Context, u *url.URL) (backend.Backend, error) {
	installGoRedisLogger()
	opts, q, err := takeOwnParams(u)
	if err != nil {
		return nil, err
	}
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
		return nil, fmt.Errorf("%w: %v", backend.ErrInvalid, err)
	}
	o.ContextTimeoutEnabled = true
	if !q.Has("dialer_retries") {
		o.DialerRetries = oneDial
	}
	o.Dialer = ownedDialer(o.TLSConfig)
	return New(goredis.NewFailoverClient(o), opts...), nil
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
	if v, ok := q["durablefence"]; ok {
		on, err := strconv.ParseBool(v[0])
		if err != nil {
			return nil, nil, fmt.Errorf("%w: redis: durablefence=%q: want true or false", backend.ErrInvalid, v[0])
		}
		opts = append(opts, WithDurableFence(on))
		q.Del("durablefence")
	}
	if v, ok := q["slotfences"]; ok {
		on, err := strconv.ParseBool(v[0])
		if err != nil {
			return nil, nil, fmt.Errorf("%w: redis: slotfences=%q: want true or false", backend.ErrInvalid, v[0])
		}
		opts = append(opts, WithSlotFenceCounters(on))
		q.Del("slotfences")
	}
	return opts, q, nil
}

func openSingle(_ context.Context, u *url.URL) (backend.Backend, error) {
	installGoRedisLogger()
	opts, q, err := takeOwnParams(u)
	if err != nil {
		return nil, err
	}
	gu := *u
	gu.RawQuery = q.Encode()
	o, err := goredis.ParseURL(gu.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrInvalid, err)
	}
	o.ContextTimeoutEnabled = true
	o.DialerRetries = oneDial
	o.Dialer = ownedDialer(o.TLSConfig)
	o.MaintNotificationsConfig = noMaintNotifications()
	return New(goredis.NewClient(o), opts...), nil
}

func openRedlock(ctx context.Context, u *url.URL) (backend.Backend, error) {
	installGoRedisLogger()
	opts, q, err := takeOwnParams(u)
	if err != nil {
		return nil, err
	}
	hosts := strings.Split(u.Host, ",")
	if u.Host == "" || len(hosts) == 0 {
		return nil, fmt.Errorf("%w: redis: redlock URL names no nodes; want redlock://host1:port,host2:port,host3:port", backend.ErrInvalid)
	}
	base := goredis.Options{
		ContextTimeoutEnabled:    true,
		DialerRetries:            oneDial,
		Dialer:                   ownedDialer(nil),
		Username:                 q.Get("username"),
		Password:                 q.Get("password"),
		MaintNotificationsConfig: noMaintNotifications(),
	}
	if u.User != nil {
		base.Username = u.User.Username()
		base.Password, _ = u.User.Password()
	}
	if v := q.Get("db"); v != "" {
		if base.DB, err = strconv.Atoi(v); err != nil {
			return nil, fmt.Errorf("%w: redis: db=%q: want a database number", backend.ErrInvalid, v)
		}
	}
	if v := q.Get("nodetimeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%w: redis: nodetimeout=%q: want a positive Go duration such as 50ms", backend.ErrInvalid, v)
		}
		opts = append(opts, WithNodeTimeout(d))
	}
	if v := q.Get("maxttl"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < MinTTL {
			return nil, fmt.Errorf("%w: redis: maxttl=%q: want a Go duration of at least %v, such as 1m", backend.ErrInvalid, v, MinTTL)
		}
		opts = append(opts, WithMaxTTL(d))
	}
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
			return nil, fmt.Errorf("%w: redis: empty node in %q; want redlock://host1:port,host2:port,host3:port", backend.ErrInvalid, u.Host)
		}
		if addrs[i], err = withPort(h); err != nil {
			return nil, err
		}
	}
	if err := distinctServers(ctx, addrs); err != nil {
		return nil, err
	}
	nodes := make([]Client, 0, len(addrs))
	for _, a := range addrs {
		o := base
		o.Addr = a
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
