package etcd_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/etcdtest"
	"github.com/distlock/lock/internal/testca"
)

// tlsURL is an etcds:// URL of addr with the query params (name, value,
// ...).
func tlsURL(addr string, params ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	return (&url.URL{Scheme: "etcds", Host: addr, RawQuery: q.Encode()}).String()
}

// TestTLS connects over TLS to a member whose certificate the test's CA
// signed: with the CA it works, without it, with another CA, or with a
// server name the certificate does not carry the connection is refused and
// the error says why.
func TestTLS(t *testing.T) {
	ca := testca.New(t)
	srv := etcdtest.StartTLS(t, etcdtest.TLS{CertFile: ca.CertFile, KeyFile: ca.KeyFile, CAFile: ca.CAFile})
	t.Run("CAFile", func(t *testing.T) {
		if err := testca.LockOnce(tlsURL(srv.Addr, "ca_file", ca.CAFile), time.Minute); err != nil {
			t.Fatalf("with the CA: %v", err)
		}
	})
	t.Run("ServerName", func(t *testing.T) {
		// Dials 127.0.0.1, checks the certificate for the other name.
		if err := testca.LockOnce(tlsURL(srv.Addr, "ca_file", ca.CAFile, "server_name", testca.ServerName), time.Minute); err != nil {
			t.Fatalf("server_name=%s: %v", testca.ServerName, err)
		}
	})
	for _, tc := range ca.Refusals() {
		t.Run(tc.Name, func(t *testing.T) {
			err := testca.LockOnce(tlsURL(srv.Addr, tc.Params...), 1500*time.Millisecond)
			if err == nil || !strings.Contains(err.Error(), tc.Want) {
				t.Fatalf("%v; want a refusal saying %q", err, tc.Want)
			}
		})
	}
	t.Run("PlainToTLS", func(t *testing.T) {
		if err := testca.LockOnce("etcd://"+srv.Addr, 1500*time.Millisecond); err == nil {
			t.Fatal("etcd:// (no TLS) to a TLS member worked")
		}
	})
}

// TestTLSClientCert: a member that requires client certificates accepts
// one signed by its CA and refuses a client without.
func TestTLSClientCert(t *testing.T) {
	ca := testca.New(t)
	srv := etcdtest.StartTLS(t, etcdtest.TLS{CertFile: ca.CertFile, KeyFile: ca.KeyFile, CAFile: ca.CAFile,
		ClientCertAuth: true, ClientCertFile: ca.ClientCertFile, ClientKeyFile: ca.ClientKeyFile})
	with := tlsURL(srv.Addr, "ca_file", ca.CAFile, "cert_file", ca.ClientCertFile, "key_file", ca.ClientKeyFile)
	if err := testca.LockOnce(with, time.Minute); err != nil {
		t.Fatalf("with a client certificate: %v", err)
	}
	err := testca.LockOnce(tlsURL(srv.Addr, "ca_file", ca.CAFile), 1500*time.Millisecond)
	// The server's alert, or, when the connection's reset lost it, the
	// hint.
	if err == nil || !strings.Contains(err.Error(), "certificate required") && !strings.Contains(err.Error(), "require a client certificate") {
		t.Fatalf("without a client certificate: %v; want a refusal about the client certificate", err)
	}
}

// TestTLSParamsNeedEtcds: a TLS parameter on etcd:// is refused, naming
// the parameter and etcds://, before anything is dialled.
func TestTLSParamsNeedEtcds(t *testing.T) {
	for _, p := range lock.TLSParams {
		u := "etcd://127.0.0.1:1?" + p + "=x"
		_, err := lock.Open(context.Background(), u)
		if !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "etcds://") {
			t.Errorf("Open(%q): %v; want ErrInvalid naming %s and etcds://", u, err, p)
		}
	}
	// And etcds:// checks them: a missing file, half a key pair.
	for _, tc := range []struct{ query, want string }{
		{"ca_file=/nonexistent/ca.pem", "ca_file"},
		{"cert_file=/nonexistent/c.pem", "cert_file needs key_file"},
		{"skip_verify=maybe", "skip_verify"},
	} {
		u := "etcds://127.0.0.1:1?" + tc.query
		_, err := lock.Open(context.Background(), u)
		if !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want ErrInvalid mentioning %q", u, err, tc.want)
		}
	}
}

// TestAuthURL takes a lock as an etcd user named in the URL, on a member
// with authentication on, and is refused with a wrong password.
func TestAuthURL(t *testing.T) {
	srv := startEtcd(t)
	ctx := ctxFor(t)
	cli := newClient(t, srv.Addr)
	if _, err := cli.UserAdd(ctx, "root", "R00tPass"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	if err := testca.LockOnce("etcd://root:R00tPass@"+srv.Addr, time.Minute); err != nil {
		t.Fatalf("as root: %v", err)
	}
	// Refused by Open: clientv3 logs in when it is made.
	locks, err := lock.Open(ctx, "etcd://root:Wr0ngPass@"+srv.Addr)
	if err == nil {
		locks.Close()
		t.Fatal("Open with a wrong password succeeded")
	}
	if !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("with a wrong password: %v; want authentication failed", err)
	}
	if strings.Contains(err.Error(), "Wr0ngPass") {
		t.Errorf("the error shows the password: %v", err)
	}
	if err := testca.LockOnce("etcd://"+srv.Addr, 1500*time.Millisecond); err == nil {
		t.Fatal("without a user, on a member with authentication on: a lock")
	}
}
