package etcd

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// urlParams are the query parameters of etcd:// and etcds:// URLs.
var urlParams = []string{"dialtimeout", "electiontimeout", "prefix"}

// DefaultDialTimeout bounds the connection to an endpoint of a client built
// from a URL.
const DefaultDialTimeout = 5 * time.Second

func init() {
	lock.Register("etcd", urlParams, open)
	lock.Register("etcds", urlParams, open)
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
// names.
func parseURL(u *url.URL) (clientv3.Config, []Option, error) {
	want := "want " + u.Scheme + "://host:port[,host:port...]"
	if u.Host == "" {
		return clientv3.Config{}, nil, fmt.Errorf("%w: etcd: %q names no endpoint; %s", backend.ErrInvalid, u.Redacted(), want)
	}
	if u.Path != "" && u.Path != "/" {
		return clientv3.Config{}, nil, fmt.Errorf("%w: etcd: path %q in %q; the key prefix is the parameter prefix; %s", backend.ErrInvalid, u.Path, u.Redacted(), want)
	}
	cfg := clientv3.Config{DialTimeout: DefaultDialTimeout, Logger: zap.NewNop()}
	for _, ep := range strings.Split(u.Host, ",") {
		if ep == "" || !strings.Contains(ep, ":") {
			return clientv3.Config{}, nil, fmt.Errorf("%w: etcd: endpoint %q in %q is not host:port; %s", backend.ErrInvalid, ep, u.Redacted(), want)
		}
		cfg.Endpoints = append(cfg.Endpoints, ep)
	}
	if u.Scheme == "etcds" {
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	var opts []Option
	q := u.Query()
	for name, values := range q {
		if len(values) != 1 {
			return clientv3.Config{}, nil, fmt.Errorf("%w: etcd: parameter %q given %d times; give it once", backend.ErrInvalid, name, len(values))
		}
	}
	if v, ok := q["prefix"]; ok {
		opts = append(opts, WithPrefix(v[0]))
	}
	duration := func(name string) (time.Duration, bool, error) {
		v, ok := q[name]
		if !ok {
			return 0, false, nil
		}
		d, err := time.ParseDuration(v[0])
		if err != nil || d <= 0 {
			return 0, false, fmt.Errorf("%w: etcd: %s=%q: want a positive Go duration such as 1s or 500ms", backend.ErrInvalid, name, v[0])
		}
		return d, true, nil
	}
	if d, ok, err := duration("dialtimeout"); err != nil {
		return clientv3.Config{}, nil, err
	} else if ok {
		cfg.DialTimeout = d
	}
	if d, ok, err := duration("electiontimeout"); err != nil {
		return clientv3.Config{}, nil, err
	} else if ok {
		opts = append(opts, WithElectionTimeout(d))
	}
	return cfg, opts, nil
}
