package consul

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

func init() {
	params := []string{"lockdelay", "minttl", "prefix", "token"}
	lock.Register("consul", params, open)
	lock.Register("consuls", params, open)
}

// open builds a backend from consul://host:port or consuls://host:port
// (HTTPS) with the parameters prefix, token, minttl and lockdelay.
func open(_ context.Context, u *url.URL) (backend.Backend, error) {
	if u.Host == "" {
		return nil, fmt.Errorf("%w: consul: %q has no host; want %s://host:port", backend.ErrInvalid, u.Redacted(), u.Scheme)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("%w: consul: %q has a path; set the key prefix with ?prefix=", backend.ErrInvalid, u.Redacted())
	}
	cfg := api.DefaultConfig()
	cfg.Address = u.Host
	cfg.Scheme = "http"
	if u.Scheme == "consuls" {
		cfg.Scheme = "https"
	}
	var opts []Option
	q := u.Query()
	if v := q.Get("token"); v != "" {
		cfg.Token = v
	}
	if v, ok := q["prefix"]; ok {
		opts = append(opts, WithPrefix(v[0]))
	}
	for _, p := range []struct {
		name string
		set  func(time.Duration) Option
	}{{"minttl", WithMinTTL}, {"lockdelay", WithLockDelay}} {
		if v, ok := q[p.name]; ok {
			d, err := time.ParseDuration(v[0])
			if err != nil {
				return nil, fmt.Errorf("%w: consul: %s=%q: want a Go duration such as 1s", backend.ErrInvalid, p.name, v[0])
			}
			opts = append(opts, p.set(d))
		}
	}
	cli, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: consul: %v", backend.ErrInvalid, err)
	}
	if t := cfg.Transport; t != nil {
		opts = append(opts, func(o *options) { o.closeCli = t.CloseIdleConnections })
	}
	return New(cli, opts...)
}
