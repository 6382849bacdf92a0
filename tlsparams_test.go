package lock_test

import (
	"crypto/tls"
	"errors"
	"net/url"
	"testing"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/testca"
)

// TestTLSConfig dials a TLS listener with the configuration each set of
// parameters gives: the checks are the ones crypto/tls makes with it.
func TestTLSConfig(t *testing.T) {
	ca := testca.New(t)
	cert, err := tls.LoadX509KeyPair(ca.CertFile, ca.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.VerifyClientCertIfGiven})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	defer func() { ln.Close(); <-done }()
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	dial := func(q url.Values) error {
		cfg, err := lock.TLSConfig(q, true, "rediss")
		if err != nil {
			t.Fatalf("TLSConfig(%v): %v", q, err)
		}
		if cfg.ServerName == "" {
			cfg.ServerName = "127.0.0.1" // what a client sets from the address it dials
		}
		c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
		if err == nil {
			c.Close()
		}
		return err
	}
	for _, tc := range []struct {
		name string
		q    url.Values
		ok   bool
	}{
		{"the CA", url.Values{"ca_file": {ca.CAFile}}, true},
		{"the CA and a client certificate", url.Values{"ca_file": {ca.CAFile}, "cert_file": {ca.ClientCertFile}, "key_file": {ca.ClientKeyFile}}, true},
		{"the CA and the certificate's other name", url.Values{"ca_file": {ca.CAFile}, "server_name": {testca.ServerName}}, true},
		{"system roots only", url.Values{}, false},
		{"another CA", url.Values{"ca_file": {ca.OtherCAFile}}, false},
		{"a wrong server name", url.Values{"ca_file": {ca.CAFile}, "server_name": {"db.example.com"}}, false},
		{"skip_verify", url.Values{"skip_verify": {"true"}}, true},
	} {
		err := dial(tc.q)
		if tc.ok && err != nil {
			t.Errorf("%s: %v, want a connection", tc.name, err)
		}
		if !tc.ok && err == nil {
			t.Errorf("%s: connected, want the certificate refused", tc.name)
		}
	}
	for _, q := range []url.Values{
		{"cert_file": {ca.ClientCertFile}},
		{"key_file": {ca.ClientKeyFile}},
		{"ca_file": {ca.CAFile + ".missing"}},
		{"ca_file": {ca.ClientKeyFile}},
		{"skip_verify": {"maybe"}},
		{"skip_verify": {"true"}, "ca_file": {ca.CAFile}},
	} {
		if _, err := lock.TLSConfig(q, true, "rediss"); !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("TLSConfig(%v) = %v, want ErrInvalidOption", q, err)
		}
	}
	if cfg, err := lock.TLSConfig(url.Values{"ca_file": {ca.CAFile}}, false, "rediss"); cfg != nil || !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("TLSConfig on a scheme without TLS = %v, %v; want ErrInvalidOption", cfg, err)
	}
	if cfg, err := lock.TLSConfig(url.Values{}, false, "rediss"); cfg != nil || err != nil {
		t.Errorf("TLSConfig without TLS or parameters = %v, %v; want nil, nil", cfg, err)
	}
}
