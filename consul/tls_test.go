package consul_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/internal/consultest"
	"github.com/distlock/lock/internal/testca"
)

// consulURL is a URL of scheme and addr with the query params (name,
// value, ...) and minttl=1s, the test agents' minimum.
func consulURL(scheme, addr string, params ...string) string {
	q := url.Values{"minttl": {"1s"}}
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	return (&url.URL{Scheme: scheme, Host: addr, RawQuery: q.Encode()}).String()
}

// TestTLS connects over HTTPS to an agent whose certificate the test's CA
// signed: with the CA it works; without it, with another CA, or with a
// server name the certificate does not carry it is refused and the error
// says why; and no CONSUL_* variable changes that.
func TestTLS(t *testing.T) {
	ca := testca.New(t)
	agent := consultest.StartTLS(t, consultest.TLS{CertFile: ca.CertFile, KeyFile: ca.KeyFile, CAFile: ca.CAFile})
	works := []struct {
		name   string
		params []string
	}{
		{"CAFile", []string{"ca_file", ca.CAFile}},
		// Dials 127.0.0.1, checks the certificate for the other name.
		{"ServerName", []string{"ca_file", ca.CAFile, "server_name", testca.ServerName}},
	}
	for _, tc := range works {
		t.Run(tc.name, func(t *testing.T) {
			if err := testca.LockOnce(consulURL("consuls", agent.HTTPSAddr, tc.params...), time.Minute); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, tc := range ca.Refusals() {
		t.Run(tc.Name, func(t *testing.T) {
			err := testca.LockOnce(consulURL("consuls", agent.HTTPSAddr, tc.Params...), time.Minute)
			if err == nil || !strings.Contains(err.Error(), tc.Want) {
				t.Fatalf("%v; want a refusal saying %q", err, tc.Want)
			}
		})
	}
	t.Run("EnvironmentIgnored", func(t *testing.T) {
		// Each would make api.DefaultConfig's client trust the agent,
		// or skip the check, or go elsewhere.
		t.Setenv("CONSUL_HTTP_SSL_VERIFY", "false")
		t.Setenv("CONSUL_CACERT", ca.CAFile)
		t.Setenv("CONSUL_TLS_SERVER_NAME", testca.ServerName)
		t.Setenv("CONSUL_HTTP_ADDR", "https://"+agent.HTTPSAddr)
		t.Setenv("CONSUL_HTTP_SSL", "true")
		err := testca.LockOnce(consulURL("consuls", agent.HTTPSAddr), time.Minute)
		if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Fatalf("consuls:// without ca_file, CONSUL_HTTP_SSL_VERIFY=false and CONSUL_CACERT set: %v; want unknown authority", err)
		}
		err = testca.LockOnce(consulURL("consuls", agent.HTTPSAddr, "ca_file", ca.OtherCAFile, "server_name", "wrong.example"), time.Minute)
		if err == nil {
			t.Fatal("consuls:// with another CA and a wrong name worked: the environment's CA or name was used")
		}
		// Plain HTTP to the plain port, whatever CONSUL_HTTP_SSL and
		// CONSUL_HTTP_ADDR say.
		if err := testca.LockOnce(consulURL("consul", agent.Addr), time.Minute); err != nil {
			t.Fatalf("consul:// to the HTTP port with CONSUL_HTTP_SSL=true: %v", err)
		}
	})
	t.Run("PlainToTLS", func(t *testing.T) {
		if err := testca.LockOnce(consulURL("consul", agent.HTTPSAddr), time.Minute); err == nil {
			t.Fatal("consul:// (no TLS) to the HTTPS port worked")
		}
	})
}

// TestTLSClientCert: an agent that verifies incoming HTTPS clients accepts
// a certificate signed by its CA and refuses a client without.
func TestTLSClientCert(t *testing.T) {
	ca := testca.New(t)
	agent := consultest.StartTLS(t, consultest.TLS{CertFile: ca.CertFile, KeyFile: ca.KeyFile, CAFile: ca.CAFile,
		VerifyIncoming: true, ClientCertFile: ca.ClientCertFile, ClientKeyFile: ca.ClientKeyFile})
	with := consulURL("consuls", agent.HTTPSAddr, "ca_file", ca.CAFile, "cert_file", ca.ClientCertFile, "key_file", ca.ClientKeyFile)
	if err := testca.LockOnce(with, time.Minute); err != nil {
		t.Fatalf("with a client certificate: %v", err)
	}
	// TLS 1.3 checks the client's certificate after the handshake: the
	// agent's alert ("certificate required") reaches the client unless
	// its reset comes first, and then the client sees a reset connection
	// (or EOF) and retries until the wait ends. Either is a refusal.
	err := testca.LockOnce(consulURL("consuls", agent.HTTPSAddr, "ca_file", ca.CAFile), 10*time.Second)
	if err == nil {
		t.Fatalf("without a client certificate: connected, want a refusal")
	}
	if msg := err.Error(); !strings.Contains(msg, "certificate required") && !strings.Contains(msg, "reset") &&
		!strings.Contains(msg, "broken pipe") && !strings.Contains(msg, "EOF") {
		t.Fatalf("without a client certificate: %v; want a refusal saying certificate required (or a reset connection)", err)
	}
	t.Logf("without a client certificate: %v", err)
}

// headers is a fake Consul that records the headers of the requests it
// gets and answers each with 500.
type headers struct {
	mu  sync.Mutex
	got []http.Header
}

func (h *headers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.got = append(h.got, r.Header.Clone())
	h.mu.Unlock()
	http.Error(w, "fake consul", http.StatusInternalServerError)
}

// first returns the headers of the first request to a fake Consul that
// backend opened from u (with the fake's address for ADDR) sent.
func firstRequest(t *testing.T, u string) http.Header {
	t.Helper()
	h := &headers{}
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	locks, err := lock.Open(ctx, strings.ReplaceAll(u, "ADDR", srv.Listener.Addr().String()))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if _, err := locks.TryAcquire(ctx, "k"); err == nil {
		t.Fatal("TryAcquire on a fake that answers 500 succeeded")
	}
	locks.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.got) == 0 {
		t.Fatal("no request reached the fake Consul")
	}
	return h.got[0]
}

// TestURLCredentials: the userinfo of a URL is HTTP basic authentication,
// the token or token_file an ACL token that CONSUL_HTTP_TOKEN and
// CONSUL_HTTP_TOKEN_FILE do not replace, which stand in only for a URL
// without one; CONSUL_HTTP_ADDR does not redirect the requests.
func TestURLCredentials(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	envFile := filepath.Join(dir, "env-token")
	if err := os.WriteFile(envFile, []byte("env-file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	for _, tc := range []struct {
		name, url   string
		env         []string
		auth, token string
	}{
		{name: "BasicAuth", url: "consul://admin:S3cret@ADDR", auth: basic("admin", "S3cret")},
		{name: "BasicAuthUserOnly", url: "consul://admin@ADDR", auth: basic("admin", "")},
		{name: "Token", url: "consul://ADDR?token=url-token", token: "url-token"},
		{name: "TokenFile", url: "consul://ADDR?token_file=" + url.QueryEscape(tokenFile), token: "file-token"},
		{name: "TokenOverEnv", url: "consul://ADDR?token=url-token", token: "url-token",
			env: []string{"CONSUL_HTTP_TOKEN", "env-token", "CONSUL_HTTP_TOKEN_FILE", envFile}},
		// api.NewClient takes the file's token when the URL's equals
		// CONSUL_HTTP_TOKEN: the transport sends the URL's.
		{name: "TokenEqualToEnv", url: "consul://ADDR?token=same", token: "same",
			env: []string{"CONSUL_HTTP_TOKEN", "same", "CONSUL_HTTP_TOKEN_FILE", envFile}},
		{name: "EnvToken", url: "consul://ADDR", token: "env-token", env: []string{"CONSUL_HTTP_TOKEN", "env-token"}},
		{name: "EnvTokenFile", url: "consul://ADDR", token: "env-file-token",
			env: []string{"CONSUL_HTTP_TOKEN", "env-token", "CONSUL_HTTP_TOKEN_FILE", envFile}},
		{name: "EnvAuthIgnored", url: "consul://ADDR", env: []string{"CONSUL_HTTP_AUTH", "env:auth"}},
		{name: "EnvAddrIgnored", url: "consul://ADDR?token=t1", token: "t1",
			env: []string{"CONSUL_HTTP_ADDR", "127.0.0.1:1", "CONSUL_HTTP_SSL", "true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range []string{"CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_HTTP_AUTH", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL"} {
				t.Setenv(v, "")
			}
			for i := 0; i+1 < len(tc.env); i += 2 {
				t.Setenv(tc.env[i], tc.env[i+1])
			}
			h := firstRequest(t, tc.url)
			if got := h.Get("Authorization"); got != tc.auth {
				t.Errorf("Authorization %q; want %q", got, tc.auth)
			}
			if got := h.Get("X-Consul-Token"); got != tc.token {
				t.Errorf("X-Consul-Token %q; want %q", got, tc.token)
			}
		})
	}
}

// TestOpenBadURL: every bad part of a URL is refused before anything is
// sent, naming only that part, never a secret.
func TestOpenBadURL(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ url, want string }{
		{"consul://127.0.0.1", "is not host:port"},
		{"consul:127.0.0.1:8500", "no // after consul:"},
		{"consul://@127.0.0.1:8500", "empty user information"},
		{"consul://127.0.0.1:8500?token=", "token is empty"},
		{"consul://127.0.0.1:8500?token=S3cretToken&token_file=/x", "token and token_file both given"},
		{"consul://127.0.0.1:8500?token_file=/nonexistent/S3cretPath", "token_file: cannot read the file: no such file"},
		{"consul://127.0.0.1:8500?token_file=" + url.QueryEscape(empty), "token_file: the file is empty"},
		{"consul://127.0.0.1:8500?minttl=0s", `minttl="0s": want a Go duration from more than 0 to 24h0m0s`},
		{"consul://127.0.0.1:8500?minttl=25h", "from more than 0 to 24h0m0s"},
		{"consul://127.0.0.1:8500?lockdelay=-1s", `lockdelay="-1s": want a Go duration from 0s to 1m0s`},
		{"consul://127.0.0.1:8500?lockdelay=61s", "from 0s to 1m0s"},
		{"consul://127.0.0.1:8500?ca_file=/x", "ca_file configures TLS, which this scheme does not speak; use consuls://"},
		{"consul://127.0.0.1:8500?server_name=x", "server_name configures TLS"},
		{"consul://127.0.0.1:8500?cert_file=/x&key_file=/y", "configures TLS"},
		{"consul://127.0.0.1:8500?skip_verify=true", "skip_verify configures TLS"},
		{"consuls://127.0.0.1:8501?ca_file=/nonexistent/ca.pem", "ca_file"},
		{"consuls://127.0.0.1:8501?key_file=/x", "key_file needs cert_file"},
	} {
		c, err := lock.Open(context.Background(), tc.url)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", tc.url)
			continue
		}
		if !errors.Is(err, lock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want ErrInvalid saying %q", tc.url, err, tc.want)
		}
		for _, secret := range []string{"S3cret"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Open(%q): %v shows a secret", tc.url, err)
			}
		}
	}
}
