// Package redistest starts real redis-server processes for tests: one per
// Server, on a free loopback port, with its own data directory, killed and
// reaped at the end of the test.
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Persistence modes of a test server.
const (
	NoPersistence  = ""         // save "" and appendonly no
	AOFEverySecond = "everysec" // appendonly yes, appendfsync everysec
	AOFAlways      = "always"   // appendonly yes, appendfsync always
)

// T is the part of testing.TB the helpers use, so that the benchmark
// program can start servers too.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
	Skip(args ...any)
	TempDir() string
	Cleanup(func())
}

// Server is one redis-server process.
type Server struct {
	Addr string
	dir  string
	port int
	mode string
	// extra config lines: a cluster node's, or a Sentinel's (then
	// sentinel is true: it runs with --sentinel, from a config file it
	// may rewrite)
	extra    []string
	sentinel bool
	// tls, when set, makes the server listen with TLS only (port 0,
	// tls-port port); ping and the clients of the helpers speak TLS to it
	tls  *TLS
	cmd  *exec.Cmd
	exit chan error
	t    T
}

// Binary returns the path of redis-server, or fails the test with how to get
// it. With -short it skips instead, saying so.
func Binary(t T) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err == nil {
		return path
	}
	if testing.Testing() && testing.Short() {
		t.Skip("redis-server not installed; skipped with -short (scripts/test installs it)")
	}
	t.Fatalf("redis-server not installed: run scripts/test, which installs it, or apt-get install -y redis-server")
	return ""
}

// Start starts a redis-server with the given persistence mode.
func Start(t T, mode string) *Server {
	t.Helper()
	return StartConfig(t, Config{Mode: mode})
}

// TLS is the TLS setup of a test server: it listens with TLS only, with
// the certificate CertFile and its key KeyFile (such as testca's), and
// trusts the CAs of CAFile for client certificates.
type TLS struct {
	CertFile, KeyFile, CAFile string
	// AuthClients makes the server require a client certificate signed
	// by CAFile (tls-auth-clients yes); else it asks for none.
	AuthClients bool
	// ClientCertFile and ClientKeyFile are the certificate the helpers
	// (ping, Client, redis-cli) present when AuthClients is set.
	ClientCertFile, ClientKeyFile string
}

// Config is a test server's configuration for StartConfig.
type Config struct {
	// Mode is the persistence mode (NoPersistence, AOFEverySecond,
	// AOFAlways).
	Mode string
	// TLS, when set, makes the server speak TLS only.
	TLS *TLS
	// Extra are more redis.conf lines, such as "requirepass SECRET" or
	// "user alice on >SECRET ~* &* +@all".
	Extra []string
}

// StartConfig starts a redis-server configured by c. It is ready when it
// answers PING (with PONG, or NOAUTH when it requires a password).
func StartConfig(t T, c Config) *Server {
	t.Helper()
	Binary(t)
	s := &Server{dir: t.TempDir(), mode: c.Mode, t: t, port: freePort(t), tls: c.TLS, extra: c.Extra}
	s.Addr = fmt.Sprintf("127.0.0.1:%d", s.port)
	s.start()
	t.Cleanup(s.kill)
	return s
}

// StartTLS starts a redis-server without persistence that speaks TLS only,
// set up by c.
func StartTLS(t T, c TLS) *Server {
	t.Helper()
	return StartConfig(t, Config{TLS: &c})
}

// StartTLSNodes starts n independent TLS servers (no persistence), the
// nodes of a Redlock over TLS.
func StartTLSNodes(t T, n int, c TLS) []*Server {
	t.Helper()
	srvs := make([]*Server, n)
	for i := range srvs {
		srvs[i] = StartTLS(t, c)
	}
	return srvs
}

// tlsLines are the redis.conf lines of c: TLS only, on port.
func (c *TLS) lines(port int) []string {
	auth := "no"
	if c.AuthClients {
		auth = "yes"
	}
	return []string{
		"port 0",
		fmt.Sprintf("tls-port %d", port),
		"tls-cert-file " + c.CertFile,
		"tls-key-file " + c.KeyFile,
		"tls-ca-cert-file " + c.CAFile,
		"tls-auth-clients " + auth,
	}
}

// ClientTLS returns the TLS configuration with which the helpers reach a
// server set up by c: trusting CAFile, presenting the client certificate
// when AuthClients is set. Nil for a nil c.
func (c *TLS) ClientTLS() (*tls.Config, error) {
	if c == nil {
		return nil, nil
	}
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}
	if !cfg.RootCAs.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("redistest: %s holds no PEM certificate", c.CAFile)
	}
	if c.AuthClients {
		cert, err := tls.LoadX509KeyPair(c.ClientCertFile, c.ClientKeyFile)
		if err != nil {
			return nil, fmt.Errorf("redistest: the client certificate for tls-auth-clients: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// cliArgs are redis-cli's arguments to reach a server set up by c.
func (c *TLS) cliArgs() []string {
	if c == nil {
		return nil
	}
	args := []string{"--tls", "--cacert", c.CAFile}
	if c.AuthClients {
		args = append(args, "--cert", c.ClientCertFile, "--key", c.ClientKeyFile)
	}
	return args
}

func freePort(t T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: no free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) config() string {
	port := []string{fmt.Sprintf("port %d", s.port)}
	if s.tls != nil {
		port = s.tls.lines(s.port)
	}
	if s.sentinel {
		return strings.Join(append(append(port,
			"bind 127.0.0.1",
			"protected-mode no",
			"daemonize no",
			"dir "+s.dir,
			`logfile ""`,
			"loglevel warning",
		), s.extra...), "\n") + "\n"
	}
	lines := append(port,
		"bind 127.0.0.1",
		"protected-mode no",
		"daemonize no",
		`save ""`,
		"dir "+s.dir,
		`logfile ""`,
		"loglevel warning",
	)
	if s.mode == NoPersistence {
		lines = append(lines, "appendonly no")
	} else {
		lines = append(lines, "appendonly yes", "appendfsync "+s.mode)
	}
	lines = append(lines, s.extra...)
	return strings.Join(lines, "\n") + "\n"
}

func (s *Server) start() {
	t := s.t
	t.Helper()
	cmd := exec.Command(Binary(t), "-")
	cmd.Stdin = strings.NewReader(s.config())
	if s.sentinel {
		conf := s.dir + "/sentinel.conf"
		if err := os.WriteFile(conf, []byte(s.config()), 0o644); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		cmd = exec.Command(Binary(t), conf, "--sentinel")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	log, err := os.OpenFile(s.dir+"/redis.log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatalf("redistest: starting redis-server: %v", err)
	}
	log.Close()
	s.cmd = cmd
	exit := make(chan error, 1)
	s.exit = exit
	go func() { exit <- cmd.Wait() }()
	tlsConfig, err := s.tls.ClientTLS()
	if err != nil {
		s.kill()
		t.Fatalf("redistest: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(s.Addr, tlsConfig); err == nil {
			return
		} else if time.Now().After(deadline) {
			s.kill()
			out, _ := os.ReadFile(s.dir + "/redis.log")
			t.Fatalf("redistest: redis-server on %s not ready after 10s: %v\n%s", s.Addr, err, out)
		}
		select {
		case err := <-exit:
			out, _ := os.ReadFile(s.dir + "/redis.log")
			t.Fatalf("redistest: redis-server exited: %v\n%s", err, out)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// ping sends PING and expects PONG, in RESP, without a client library,
// over TLS when tlsConfig is set. A NOAUTH error (the server requires a
// password) is an answer too: the server is up.
func ping(addr string, tlsConfig *tls.Config) error {
	d := &net.Dialer{Timeout: time.Second}
	var c net.Conn
	var err error
	if tlsConfig != nil {
		c, err = tls.DialWithDialer(d, "tcp", addr, tlsConfig)
	} else {
		c, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") && !strings.HasPrefix(line, "-NOAUTH") {
		return errors.New("unexpected reply " + strings.TrimSpace(line))
	}
	return nil
}

// Kill kills the server with SIGKILL (no chance to save) and reaps it.
func (s *Server) Kill() { s.kill() }

func (s *Server) kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGCONT) // a stopped process must run to die cleanly
	s.cmd.Process.Kill()
	<-s.exit
	s.cmd = nil
}

// Restart kills the server and starts it again on the same port. With
// keepData it reuses the data directory (what persistence saved survives);
// without, it starts empty.
func (s *Server) Restart(keepData bool) {
	s.t.Helper()
	s.kill()
	if !keepData {
		os.RemoveAll(s.dir)
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			s.t.Fatalf("redistest: %v", err)
		}
	}
	s.start()
}

// Stop pauses the server with SIGSTOP: it accepts connections but answers
// nothing until Continue.
func (s *Server) Stop() {
	if s.cmd != nil {
		s.cmd.Process.Signal(syscall.SIGSTOP)
	}
}

// Continue resumes a stopped server.
func (s *Server) Continue() {
	if s.cmd != nil {
		s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Running reports whether the server process is up.
func (s *Server) Running() bool { return s.cmd != nil }

// StartCluster starts a Redis Cluster of masters redis-server processes
// (no replicas, no persistence) on loopback, joined with redis-cli --cluster
// create, and returns them once every node reports the cluster ok.
func StartCluster(t T, masters int) []*Server {
	t.Helper()
	return startCluster(t, masters, nil)
}

// StartClusterTLS is StartCluster with nodes that speak TLS only, set up
// by c, to clients and to each other (tls-cluster yes).
func StartClusterTLS(t T, masters int, c TLS) []*Server {
	t.Helper()
	return startCluster(t, masters, &c)
}

func startCluster(t T, masters int, c *TLS) []*Server {
	t.Helper()
	Binary(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli not installed: apt-get install -y redis-tools (or redis-server, which pulls it in)")
	}
	var srvs []*Server
	var addrs []string
	for range masters {
		s := &Server{dir: t.TempDir(), t: t, port: freePort(t), tls: c, extra: []string{
			"cluster-enabled yes",
			"cluster-config-file nodes.conf",
			"cluster-node-timeout 5000",
		}}
		if c != nil {
			s.extra = append(s.extra, "tls-cluster yes")
		}
		s.Addr = fmt.Sprintf("127.0.0.1:%d", s.port)
		s.start()
		t.Cleanup(s.kill)
		srvs = append(srvs, s)
		addrs = append(addrs, s.Addr)
	}
	args := append(append(c.cliArgs(), "--cluster", "create"), addrs...)
	out, err := exec.Command(cli, append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range srvs {
		c := ClientOf(t, s)
		for {
			info, _ := c.ClusterInfo(ctx).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("redistest: cluster node %s not ok after 30s: %q", s.Addr, info)
			}
			time.Sleep(20 * time.Millisecond) // poll the node until the cluster is up
		}
	}
	return srvs
}

// StartSentinel starts a Redis Sentinel process that monitors master under
// name (quorum 1), and returns it once it names the master. The Sentinel
// speaks TLS, to its clients and to the master, when the master does.
func StartSentinel(t T, master *Server, name string) *Server {
	t.Helper()
	Binary(t)
	s := &Server{dir: t.TempDir(), t: t, port: freePort(t), sentinel: true, tls: master.tls, extra: []string{
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1", name, master.port),
		fmt.Sprintf("sentinel down-after-milliseconds %s 5000", name),
	}}
	if master.tls != nil {
		s.extra = append(s.extra, "tls-replication yes")
	}
	s.Addr = fmt.Sprintf("127.0.0.1:%d", s.port)
	s.start()
	t.Cleanup(s.kill)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := ClientOf(t, s)
	for {
		addr, err := c.Do(ctx, "SENTINEL", "get-master-addr-by-name", name).StringSlice()
		if err == nil && len(addr) == 2 && addr[1] == fmt.Sprint(master.port) {
			return s
		}
		if ctx.Err() != nil {
			t.Fatalf("redistest: sentinel %s does not name master %s: %v %v", s.Addr, name, addr, err)
		}
		time.Sleep(20 * time.Millisecond) // poll the sentinel until it is up
	}
}

// ClientOf is Client for server s: over TLS when s speaks it.
func ClientOf(t T, s *Server) *goredis.Client {
	t.Helper()
	cfg, err := s.tls.ClientTLS()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return client(t, s.Addr, cfg)
}

// Client returns a go-redis client of addr for tests, closed at cleanup.
// Context deadlines bound its socket reads, so a hung server cannot hold a
// call past its context, and go-redis's maintenance notifications are off:
// in v9.23 they can start a goroutine that outlives Client.Close.
func Client(t T, addr string) *goredis.Client {
	return client(t, addr, nil)
}

func client(t T, addr string, tlsConfig *tls.Config) *goredis.Client {
	rdb := goredis.NewClient(&goredis.Options{
		Addr:                     addr,
		TLSConfig:                tlsConfig,
		ContextTimeoutEnabled:    true,
		MaxRetries:               -1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// WaitForDialers waits until go-redis's background dialers of closed
// clients are gone: after a failed dial one sleeps a second before it sees
// that its pool was closed, and a test's leak check would count it.
func WaitForDialers(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<22)
	for {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte("internal/pool.(*ConnPool).tryDial")) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("go-redis dialers still run 10s after their clients were closed")
			return
		}
		time.Sleep(50 * time.Millisecond) // poll: the dialers end on their own
	}
}
