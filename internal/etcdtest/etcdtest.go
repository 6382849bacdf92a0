// Package etcdtest runs real etcd servers for tests: the test binary runs
// itself again as an embedded etcd member, a process of its own, which a
// test can stop with SIGSTOP, kill with SIGKILL and restart keeping its
// data (see conformance/serverproc). A test binary that uses it calls
// MaybeRunMember first thing in its TestMain.
package etcdtest

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/distlock/lock/conformance/serverproc"
)

// memberEnv, set in the environment, makes the test binary run as an etcd
// member instead of running tests.
const memberEnv = "DISTLOCK_ETCD_MEMBER"

// The members' Raft timing: short, so that a leader change or a restart
// takes a fraction of a second and leases of 1s are allowed (etcd's
// minimum lease TTL is 1.5 election timeouts, rounded up to seconds).
const (
	tickMs     = 10
	electionMs = 100
)

// ElectionTimeout is the members' election timeout, which backends of the
// tests declare (etcd.WithElectionTimeout).
const ElectionTimeout = electionMs * time.Millisecond

// MaybeRunMember runs this process as an etcd member, and exits when it
// ends, when the test that started it asked for one; otherwise it returns.
func MaybeRunMember() {
	if os.Getenv(memberEnv) != "" {
		os.Exit(runMember(os.Args[1:]))
	}
}

// runMember runs one embedded etcd member until it is killed. Its data
// lives in ./data, in the working directory that serverproc gives it, so
// that a restart finds it again.
func runMember(args []string) int {
	fs := flag.NewFlagSet("member", flag.ContinueOnError)
	name := fs.String("name", "m0", "member name")
	client := fs.Int("client", 0, "client port")
	peer := fs.Int("peer", 0, "peer port")
	cluster := fs.String("cluster", "", "initial cluster: name=http://127.0.0.1:port,...")
	certFile := fs.String("cert-file", "", "server certificate: the client URL serves TLS")
	keyFile := fs.String("key-file", "", "server certificate's key")
	caFile := fs.String("trusted-ca-file", "", "CA of client certificates (etcd then requires one)")
	clientCertAuth := fs.Bool("client-cert-auth", false, "require a client certificate signed by -trusted-ca-file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = "data"
	cfg.UnsafeNoFsync = true
	// Elections, failed lease revokes and the like go to a file that a
	// failing test can show (MemberLog).
	cfg.LogLevel = "info"
	cfg.LogOutputs = []string{logFile}
	cfg.TickMs = tickMs
	cfg.ElectionMs = electionMs
	cu := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(*client)}
	if *certFile != "" {
		cu.Scheme = "https"
		cfg.ClientTLSInfo = transport.TLSInfo{
			CertFile:       *certFile,
			KeyFile:        *keyFile,
			TrustedCAFile:  *caFile,
			ClientCertAuth: *clientCertAuth,
		}
	}
	pu := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(*peer)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = *cluster
	if *cluster == "" {
		cfg.InitialCluster = *name + "=" + pu.String()
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd member:", err)
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd member:", err)
		return 1
	case <-stop:
		e.Close()
		return 0
	}
}

// logFile is the member's log, in its working directory.
const logFile = "member.log"

// MemberLog returns the lines of member p's log that contain any of the
// words (all lines when none are given), for a failing test to show what
// the cluster did: elections, failed lease revokes.
func MemberLog(p *serverproc.Process, words ...string) []string {
	b, err := os.ReadFile(filepath.Join(p.Dir(), logFile))
	if err != nil {
		return []string{err.Error()}
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		keep := len(words) == 0
		for _, w := range words {
			keep = keep || strings.Contains(l, w)
		}
		if keep {
			lines = append(lines, l)
		}
	}
	return lines
}

// LeaderChanges returns when a member of members became leader, by their
// logs, in time order.
func LeaderChanges(members []*serverproc.Process) []time.Time {
	var at []time.Time
	for _, m := range members {
		for _, l := range MemberLog(m, "became leader at term") {
			var e struct {
				TS string `json:"ts"`
			}
			if json.Unmarshal([]byte(l), &e) != nil {
				continue
			}
			if ts, err := time.Parse(time.RFC3339Nano, e.TS); err == nil {
				at = append(at, ts)
			}
		}
	}
	slices.SortFunc(at, time.Time.Compare)
	return at
}

// freePorts asks the kernel for n distinct free loopback ports: it holds
// them all until it has them all.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// Healthy reports whether the etcd member at addr has a leader and serves
// requests.
func Healthy(addr string) bool { return healthy(addr, nil) }

// healthy asks the member at addr for /health, over TLS with cfg when cfg
// is not nil.
func healthy(addr string, cfg *tls.Config) bool {
	c := http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: cfg}}
	scheme := "http://"
	if cfg != nil {
		scheme = "https://"
	}
	resp, err := c.Get(scheme + addr + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Start starts a one-member etcd cluster as a process of its own, killed
// at the end of the test. Restart keeps its data.
func Start(t testing.TB) *serverproc.Process {
	t.Helper()
	peer := freePorts(t, 1)[0]
	return serverproc.Start(t,
		[]string{os.Args[0], "-client", serverproc.PortPlaceholder, "-peer", strconv.Itoa(peer)},
		serverproc.Options{Env: []string{memberEnv + "=1"}, Ready: Healthy})
}

// TLS is the TLS set-up of a member's client URL, for StartTLS: PEM files,
// such as those of package testca.
type TLS struct {
	// CertFile and KeyFile are the server's certificate and key
	// (etcd's --cert-file, --key-file).
	CertFile, KeyFile string
	// CAFile is the CA that signed the server's certificate, which the
	// readiness check trusts.
	CAFile string
	// ClientCertAuth makes the member refuse clients without a
	// certificate signed by CAFile (--client-cert-auth and
	// --trusted-ca-file CAFile; etcd requires client certificates
	// whenever it is given a trusted CA file).
	ClientCertAuth bool
	// ClientCertFile and ClientKeyFile are a client certificate and key
	// signed by CAFile, which the readiness check presents when
	// ClientCertAuth is set.
	ClientCertFile, ClientKeyFile string
}

// StartTLS starts a one-member etcd cluster, like Start, whose client URL
// serves TLS only (https), with tc's certificates. It waits until the
// member answers /health over TLS, trusting tc.CAFile.
func StartTLS(t testing.TB, tc TLS) *serverproc.Process {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}
	pem, err := os.ReadFile(tc.CAFile)
	if err != nil || !cfg.RootCAs.AppendCertsFromPEM(pem) {
		t.Fatalf("etcdtest: CA file %s: %v (or no PEM certificate)", tc.CAFile, err)
	}
	args := []string{os.Args[0], "-client", serverproc.PortPlaceholder, "-peer", strconv.Itoa(freePorts(t, 1)[0]),
		"-cert-file", tc.CertFile, "-key-file", tc.KeyFile}
	if tc.ClientCertAuth {
		args = append(args, "-client-cert-auth", "-trusted-ca-file", tc.CAFile)
		cert, err := tls.LoadX509KeyPair(tc.ClientCertFile, tc.ClientKeyFile)
		if err != nil {
			t.Fatalf("etcdtest: client certificate: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return serverproc.Start(t, args, serverproc.Options{
		Env:   []string{memberEnv + "=1"},
		Ready: func(addr string) bool { return healthy(addr, cfg) },
	})
}

// StartCluster starts an etcd cluster of n members, each a process of its
// own, and waits until every member is healthy.
func StartCluster(t testing.TB, n int) []*serverproc.Process {
	t.Helper()
	peers := freePorts(t, n)
	var initial []string
	for i, p := range peers {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, p))
	}
	var members []*serverproc.Process
	for i := range n {
		// Ready when its port is open: a member alone has no quorum to
		// be healthy with.
		members = append(members, serverproc.Start(t,
			[]string{os.Args[0], "-name", "m" + strconv.Itoa(i), "-client", serverproc.PortPlaceholder,
				"-peer", strconv.Itoa(peers[i]), "-cluster", strings.Join(initial, ",")},
			serverproc.Options{Env: []string{memberEnv + "=1"}}))
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, m := range members {
		for !Healthy(m.Addr) {
			if time.Now().After(deadline) {
				t.Fatalf("member %s not healthy within 30s", m)
			}
			time.Sleep(20 * time.Millisecond) // poll until the cluster has a leader
		}
	}
	return members
}
