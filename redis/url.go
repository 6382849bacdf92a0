package redis

import (
	"context"
	"fmt"
	"net/url"
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

// noMaintNotifications turns off go-redis's maintenance notifications
// (a Redis Enterprise feature) in the clients this package creates: their
// background goroutine outlives Client.Close in go-redis v9.23.
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// ownParams are this backend's query parameters, on every scheme.
var ownParams = []string{"durablefence", "prefix"}

func init() {
	single := append(append([]string(nil), goredisParams...), ownParams...)
	for _, scheme := range []string{"redis", "rediss", "unix"} {
		lock.Register(scheme, single, openSingle)
	}
	lock.Register("redlock", append([]string{"db", "maxttl", "nodetimeout", "password", "username"}, ownParams...), openRedlock)
}

// takeOwnParams removes this backend's parameters from u's query and returns
// the options they set.
func takeOwnParams(u *url.URL) ([]Option, url.Values, error) {
	q := u.Query()
	opts := []Option{withCloseClients()}
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
	return opts, q, nil
}

func openSingle(_ context.Context, u *url.URL) (backend.Backend, error) {
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
	o.MaintNotificationsConfig = noMaintNotifications()
	return New(goredis.NewClient(o), opts...), nil
}

func openRedlock(_ context.Context, u *url.URL) (backend.Backend, error) {
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
	nodes := make([]Client, 0, len(hosts))
	for _, h := range hosts {
		if h == "" {
			return nil, fmt.Errorf("%w: redis: empty node in %q; want redlock://host1:port,host2:port,host3:port", backend.ErrInvalid, u.Host)
		}
		o := base
		o.Addr = h
		nodes = append(nodes, goredis.NewClient(&o))
	}
	return NewRedlock(nodes, opts...)
}
