// Package consultest runs real Consul agents for tests: a single server
// with a data dir on free loopback ports, with the minimum session TTL
// lowered to 1s so that expiry tests stay short.
package consultest

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distlock/lock/conformance/serverproc"
)

// MinTTL is the agents' session_ttl_min.
const MinTTL = time.Second

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary returns the path of the consul binary: $LOCK_CONSUL_BIN, or the
// one scripts/build-consul builds (once; it caches it outside the repo).
func Binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if p := os.Getenv("LOCK_CONSUL_BIN"); p != "" {
			binPath = p
			return
		}
		root, err := repoRoot()
		if err != nil {
			binErr = err
			return
		}
		out, err := exec.Command(filepath.Join(root, "scripts", "build-consul")).Output()
		if err != nil {
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			binErr = fmt.Errorf("scripts/build-consul: %v\n%s", err, stderr)
			return
		}
		binPath = strings.TrimSpace(string(out))
	})
	if binErr != nil {
		t.Fatalf("consultest: no consul binary: %v", binErr)
	}
	return binPath
}

// repoRoot returns the repository's root: the nearest directory above the
// working directory (a test's package directory, in any module of the
// workspace) that holds go.work.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.work above the working directory")
		}
		dir = parent
	}
}

// Agent is a Consul server agent started by Start or StartTLS.
type Agent struct {
	*serverproc.Process
	// HTTPSAddr is host:port of the agent's HTTPS API (StartTLS only).
	HTTPSAddr string
	data      string
}

// TLS is the TLS set-up of an agent's HTTPS API, for StartTLS: PEM files,
// such as those of package testca.
type TLS struct {
	// CertFile and KeyFile are the agent's certificate and key.
	CertFile, KeyFile string
	// CAFile is the CA that signed the agent's certificate and the
	// client certificates it accepts.
	CAFile string
	// VerifyIncoming makes the HTTPS API refuse clients without a
	// certificate signed by CAFile.
	VerifyIncoming bool
	// ClientCertFile and ClientKeyFile are a client certificate and key
	// signed by CAFile, which the readiness check presents when
	// VerifyIncoming is set.
	ClientCertFile, ClientKeyFile string
}

// StartTLS starts a single-server agent, like Start, that also serves its
// HTTP API over TLS on HTTPSAddr (Consul's ports.https and tls.https
// settings). The plain HTTP API stays on Addr. It waits until the agent
// has a leader and answers over HTTPS, trusting tc.CAFile.
func StartTLS(t testing.TB, tc TLS) *Agent {
	t.Helper()
	bin := Binary(t)
	dir, data := dataDir(t)
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}
	pem, err := os.ReadFile(tc.CAFile)
	if err != nil || !cfg.RootCAs.AppendCertsFromPEM(pem) {
		t.Fatalf("consultest: CA file %s: %v (or no PEM certificate)", tc.CAFile, err)
	}
	if tc.VerifyIncoming {
		cert, err := tls.LoadX509KeyPair(tc.ClientCertFile, tc.ClientKeyFile)
		if err != nil {
			t.Fatalf("consultest: client certificate: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	ports := freePorts(t, 4)
	httpsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[3]))
	argv := append(AgentArgs(bin, data, serverproc.PortPlaceholder, [3]int{ports[0], ports[1], ports[2]}),
		"-hcl", fmt.Sprintf(`ports { https = %d }`, ports[3]),
		"-hcl", fmt.Sprintf(`tls { https { ca_file = %q cert_file = %q key_file = %q verify_incoming = %t } }`,
			tc.CAFile, tc.CertFile, tc.KeyFile, tc.VerifyIncoming))
	ready := func(addr string) bool {
		c := http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
		resp, err := c.Get("https://" + httpsAddr + "/v1/status/leader")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && Ready(addr)
	}
	p := serverproc.Start(t, argv, serverproc.Options{Dir: dir, Ready: ready, ReadyTimeout: time.Minute})
	return &Agent{Process: p, HTTPSAddr: httpsAddr, data: data}
}

// Start starts a single-server agent that keeps its state in a data dir,
// and waits until it has elected itself leader.
func Start(t testing.TB) *Agent {
	t.Helper()
	bin := Binary(t)
	dir, data := dataDir(t)
	ports := freePorts(t, 3)
	argv := AgentArgs(bin, data, serverproc.PortPlaceholder, [3]int{ports[0], ports[1], ports[2]})
	p := serverproc.Start(t, argv, serverproc.Options{Dir: dir, Ready: Ready, ReadyTimeout: time.Minute})
	return &Agent{Process: p, data: data}
}

// Restart kills the agent (kill -9) and starts it again, with its data or
// without, and waits for a leader.
func (a *Agent) Restart(keepData bool) {
	a.Kill()
	if !keepData {
		os.RemoveAll(a.data)
		os.Mkdir(a.data, 0o755)
	}
	a.Process.Restart()
}

// AgentArgs is the command line of a single-server agent of bin keeping its
// state in dataDir, serving HTTP on httpPort and using serf LAN, serf WAN
// and server RPC ports: loopback only, no DNS or gRPC, session_ttl_min 1s.
func AgentArgs(bin, dataDir, httpPort string, ports [3]int) []string {
	return []string{bin, "agent", "-server", "-bootstrap-expect=1",
		"-node=lock-test", "-data-dir=" + dataDir,
		"-bind=127.0.0.1", "-advertise=127.0.0.1", "-client=127.0.0.1",
		"-http-port=" + httpPort, "-dns-port=-1", "-grpc-port=-1",
		"-serf-lan-port=" + strconv.Itoa(ports[0]), "-serf-wan-port=" + strconv.Itoa(ports[1]),
		"-server-port=" + strconv.Itoa(ports[2]),
		"-log-level=error",
		"-hcl", `session_ttl_min = "1s"`,
		"-hcl", `disable_update_check = true`,
		"-hcl", `ports { grpc_tls = -1 }`, // its default, 8503, is fixed: two agents would collide
		"-hcl", `performance { raft_multiplier = 1 }`,
	}
}

// Ready reports whether the agent on addr has a leader and has registered
// its node (sessions need it).
func Ready(addr string) bool {
	leader := get(addr, "/v1/status/leader")
	node := get(addr, "/v1/catalog/node/lock-test")
	return strings.Trim(leader, `"`) != "" && node != "" && node != "null"
}

// get returns the body of a 200 answer to GET path, or "".
func get(addr, path string) string {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var out []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

// dataDir returns a temporary directory for an agent and the data
// directory inside it.
func dataDir(t testing.TB) (dir, data string) {
	t.Helper()
	dir = t.TempDir()
	data = filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, data
}
