package redis_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/redistest"
	"github.com/distlock/lock/internal/testca"
	"github.com/distlock/lock/redis"
)

// openAndLock opens rawURL and takes and releases a lock on it: the
// first error (Open's, TryAcquire's or Release's), or nil.
func openAndLock(t *testing.T, rawURL string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	locks, err := lock.Open(ctx, rawURL)
	if err != nil {
		return err
	}
	defer locks.Close()
	l, err := locks.TryAcquire(ctx, "tls-test")
	if err != nil {
		return err
	}
	if l.Fence() == 0 {
		t.Errorf("%s: fence 0", lock.RedactURL(rawURL))
	}
	return l.Release(ctx)
}

// tlsCase is one URL and what opening it and taking a lock must give:
// success (want ""), or an error that says want.
type tlsCase struct {
	name, url, want string
}

func runTLSCases(t *testing.T, cases []tlsCase, secrets ...string) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := openAndLock(t, tc.url)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("%s: %v; want a lock taken and released", lock.RedactURL(tc.url), err)
			case tc.want != "" && err == nil:
				t.Fatalf("%s: a lock taken; want an error saying %q", lock.RedactURL(tc.url), tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("%s: %v; want an error saying %q", lock.RedactURL(tc.url), err, tc.want)
			}
			if err != nil {
				t.Logf("%s: %v", lock.RedactURL(tc.url), err)
			}
			for _, s := range secrets {
				if err != nil && strings.Contains(err.Error(), s) {
					t.Errorf("the error quotes the secret %q: %v", s, err)
				}
			}
		})
	}
}

const (
	unknownAuthority = "certificate signed by unknown authority"
	wrongName        = "certificate is valid for localhost, " + testca.ServerName + ", not wrong.example"
)

// rediss:// to a server that speaks TLS only: the CA of ca_file is
// trusted, the server's certificate checked against the host dialled or
// server_name, and a client certificate presented when the server asks
// for one.
func TestTLSSingleNode(t *testing.T) {
	ca := testca.New(t)
	srv := redistest.StartTLS(t, redistest.TLS{CertFile: ca.CertFile, KeyFile: ca.KeyFile, CAFile: ca.CAFile})
	_, port, _ := net.SplitHostPort(srv.Addr)
	caq := "ca_file=" + url.QueryEscape(ca.CAFile)
	runTLSCases(t, []tlsCase{
		{"CA", "rediss://" + srv.Addr + "?" + caq, ""},
		{"CA by localhost", "rediss://localhost:" + port + "?" + caq, ""},
		{"no CA", "rediss://" + srv.Addr, unknownAuthority},
		{"other CA", "rediss://" + srv.Addr + "?ca_file=" + url.QueryEscape(ca.OtherCAFile), unknownAuthority},
		{"wrong server name", "rediss://" + srv.Addr + "?" + caq + "&server_name=wrong.example", wrongName},
		{"server name", "rediss://" + srv.Addr + "?" + caq + "&server_name=" + testca.ServerName, ""},
		{"skip verify", "rediss://" + srv.Addr + "?skip_verify=true", ""},
		// The server speaks TLS only: a plain client gets no answer
		// it can read.
		{"plain redis", "redis://" + srv.Addr + "?max_retries=-1", "EOF"},
	})

	mtls := redistest.StartTLS(t, redistest.TLS{
		CertFile: ca.CertFile, KeyFile: ca.KeyFile, CAFile: ca.CAFile,
		AuthClients: true, ClientCertFile: ca.ClientCertFile, ClientKeyFile: ca.ClientKeyFile,
	})
	cert := "&cert_file=" + url.QueryEscape(ca.ClientCertFile) + "&key_file=" + url.QueryEscape(ca.ClientKeyFile)
	runTLSCases(t, []tlsCase{
		{"client certificate", "rediss://" + mtls.Addr + "?" + caq + cert, ""},
		{"no client certificate", "rediss://" + mtls.Addr + "?" + caq, "certificate required"},
		{"server certificate as client's", "rediss://" + mtls.Addr + "?" + caq + "&cert_file=" + url.QueryEscape(ca.CertFile) + "&key_file=" + url.QueryEscape(ca.KeyFile), ""},
	})
}

// A password or an ACL user over TLS, from the userinfo or from the
// username and password parameters; no error quotes the password.
func TestTLSAuth(t *testing.T) {
	ca := testca.New(t)
	const pass = "S3cretMarker"
	srv := redistest.StartConfig(t, redistest.Config{
		TLS: &redistest.TLS{CertFile: ca.CertFile, KeyFile: ca.KeyFile, CAFile: ca.CAFile},
		Extra: []string{
			"requirepass " + pass,
			"user alice on >" + pass + " ~* &* +@all",
		},
	})
	caq := "ca_file=" + url.QueryEscape(ca.CAFile)
	runTLSCases(t, []tlsCase{
		{"requirepass in userinfo", "rediss://:" + pass + "@" + srv.Addr + "?" + caq, ""},
		{"ACL user in userinfo", "rediss://alice:" + pass + "@" + srv.Addr + "?" + caq, ""},
		{"ACL user in parameters", "rediss://" + srv.Addr + "?" + caq + "&username=alice&password=" + pass, ""},
		// Redis refuses the script's many arguments before
		// authentication.
		{"no password", "rediss://" + srv.Addr + "?" + caq, "unauthenticated multibulk length"},
		{"wrong password", "rediss://alice:not" + pass + "@" + srv.Addr + "?" + caq, "WRONGPASS"},
		{"credentials twice", "rediss://alice:" + pass + "@" + srv.Addr + "?" + caq + "&password=" + pass, "gives credentials twice"},
	}, pass)
}

// redlocks:// speaks TLS to every node; redlock:// refuses the TLS
// parameters.
func TestTLSRedlock(t *testing.T) {
	ca := testca.New(t)
	srvs := redistest.StartTLSNodes(t, 3, redistest.TLS{CertFile: ca.CertFile, KeyFile: ca.KeyFile, CAFile: ca.CAFile})
	var clients []redis.Conn
	for _, s := range srvs {
		clients = append(clients, redistest.ClientOf(t, s))
	}
	r, err := redis.NewRedlock(clients)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.InitNewNodes(context.Background()); err != nil || n != len(srvs) {
		t.Fatalf("InitNewNodes: %d of %d, %v", n, len(srvs), err)
	}
	r.Close()
	var addrs []string
	for i, s := range srvs {
		a := s.Addr
		if i == 1 {
			// One node by name: each node is verified under its
			// own host.
			_, port, _ := net.SplitHostPort(a)
			a = "localhost:" + port
		}
		addrs = append(addrs, a)
	}
	nodes := strings.Join(addrs, ",")
	caq := "ca_file=" + url.QueryEscape(ca.CAFile)
	// Each node has a configuration of its own that names no server:
	// the TLS dialer verifies each under the host it dials (one shared
	// ServerName would check every node under one node's name).
	ctx := context.Background()
	locks, err := lock.Open(ctx, "redlocks://"+nodes+"?"+caq)
	if err != nil {
		t.Fatal(err)
	}
	cfgs := redis.NodeTLSConfigs(locks.Backend().(*redis.Redlock))
	for i, c := range cfgs {
		if c == nil || c.ServerName != "" || c.RootCAs == nil || c.InsecureSkipVerify {
			t.Errorf("node %d: TLS configuration %+v; want one with the CA and no ServerName", i, c)
		}
		for j := range i {
			if cfgs[j] == c {
				t.Errorf("nodes %d and %d share one TLS configuration", j, i)
			}
		}
	}
	locks.Close()
	runTLSCases(t, []tlsCase{
		{"CA", "redlocks://" + nodes + "?" + caq, ""},
		{"no CA", "redlocks://" + nodes, unknownAuthority},
		{"other CA", "redlocks://" + nodes + "?ca_file=" + url.QueryEscape(ca.OtherCAFile), unknownAuthority},
		{"wrong server name", "redlocks://" + nodes + "?" + caq + "&server_name=wrong.example", wrongName},
		{"server name", "redlocks://" + nodes + "?" + caq + "&server_name=" + testca.ServerName, ""},
	})
}

// Each Redis scheme without TLS refuses every TLS parameter, naming it and
// the scheme to use; the TLS schemes check the parameters' values before
// anything is sent.
func TestTLSParamsOnEveryScheme(t *testing.T) {
	ca := testca.New(t)
	ctx := context.Background()
	plain := map[string]string{
		"redis":          "redis://127.0.0.1:1",
		"unix":           "unix:///nonexistent.sock",
		"redis+cluster":  "redis+cluster://127.0.0.1:1",
		"redis+sentinel": "redis+sentinel://127.0.0.1:1?master_name=m",
		"redlock":        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
	}
	twin := map[string]string{"redis": "rediss", "unix": "rediss", "redis+cluster": "rediss+cluster", "redis+sentinel": "rediss+sentinel", "redlock": "redlocks"}
	for scheme, base := range plain {
		for _, p := range lock.TLSParams {
			sep := "?"
			if strings.Contains(base, "?") {
				sep = "&"
			}
			u := base + sep + p + "=" + url.QueryEscape(ca.CAFile)
			c, err := lock.Open(ctx, u)
			if err == nil {
				c.Close()
				t.Errorf("Open(%q) succeeded; want an error naming %s", u, p)
				continue
			}
			if want := "query parameter " + p + " configures TLS, which this scheme does not speak; use " + twin[scheme] + "://"; !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), want) {
				t.Errorf("Open(%q): %v; want ErrInvalid saying %q", u, err, want)
			}
		}
	}
	tlsBase := []string{
		"rediss://127.0.0.1:1",
		"rediss+cluster://127.0.0.1:1",
		"rediss+sentinel://127.0.0.1:1?master_name=m",
		"redlocks://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
	}
	for _, base := range tlsBase {
		sep := "?"
		if strings.Contains(base, "?") {
			sep = "&"
		}
		for _, tc := range []struct{ query, want string }{
			{"ca_file=/nonexistent/ca.pem", "ca_file: open /nonexistent/ca.pem"},
			{"ca_file=" + url.QueryEscape(ca.KeyFile), "holds no PEM certificate"},
			{"cert_file=" + url.QueryEscape(ca.ClientCertFile), "cert_file needs key_file"},
			{"key_file=" + url.QueryEscape(ca.ClientKeyFile), "key_file needs cert_file"},
			{"skip_verify=maybe", `skip_verify="maybe": want true or false`},
			{"skip_verify=true&ca_file=" + url.QueryEscape(ca.CAFile), "skip_verify=true turns off the checks"},
		} {
			u := base + sep + tc.query
			c, err := lock.Open(ctx, u)
			if err == nil {
				c.Close()
				t.Errorf("Open(%q) succeeded; want an error saying %q", u, tc.want)
				continue
			}
			if !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Open(%q): %v; want ErrInvalid saying %q", u, err, tc.want)
			}
		}
	}
}

// A Redis Cluster whose nodes speak TLS only, to clients and to each
// other: rediss+cluster:// with the CA takes a lock on keys of every
// master; without the CA it is refused.
func TestTLSCluster(t *testing.T) {
	ca := testca.New(t)
	srvs := redistest.StartClusterTLS(t, 3, redistest.TLS{CertFile: ca.CertFile, KeyFile: ca.KeyFile, CAFile: ca.CAFile})
	var addrs []string
	for _, s := range srvs {
		addrs = append(addrs, s.Addr)
	}
	nodes := strings.Join(addrs, ",")
	caq := "ca_file=" + url.QueryEscape(ca.CAFile)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	locks, err := lock.Open(ctx, "rediss+cluster://"+nodes+"?"+caq)
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	for _, k := range keysAcrossSlots(1) {
		l, err := locks.TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("key %s: %v", k, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("key %s: Release: %v", k, err)
		}
	}
	runTLSCases(t, []tlsCase{
		{"no CA", "rediss+cluster://" + nodes, unknownAuthority},
		{"wrong server name", "rediss+cluster://" + nodes + "?" + caq + "&server_name=wrong.example", wrongName},
	})
}

// Sentinel and master speak TLS only: rediss+sentinel:// reaches both
// with the CA, and is refused without it.
func TestTLSSentinel(t *testing.T) {
	ca := testca.New(t)
	master := redistest.StartTLS(t, redistest.TLS{CertFile: ca.CertFile, KeyFile: ca.KeyFile, CAFile: ca.CAFile})
	sentinel := redistest.StartSentinel(t, master, "locks")
	caq := "ca_file=" + url.QueryEscape(ca.CAFile)
	runTLSCases(t, []tlsCase{
		{"CA", "rediss+sentinel://" + sentinel.Addr + "?master_name=locks&" + caq, ""},
		{"no CA", "rediss+sentinel://" + sentinel.Addr + "?master_name=locks", unknownAuthority},
		{"wrong server name", "rediss+sentinel://" + sentinel.Addr + "?master_name=locks&" + caq + "&server_name=wrong.example", wrongName},
	})
}
