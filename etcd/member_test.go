package etcd_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/conformance/serverproc"
)

// memberEnv, set in the environment, makes the test binary run as an etcd
// member (see runMember) instead of running tests: a server process of its
// own, which a test can stop with SIGSTOP and kill with SIGKILL.
const memberEnv = "DISTLOCK_ETCD_MEMBER"

// The test servers' Raft timing: short, so that a leader change or a
// restart takes a fraction of a second and leases of 1s are allowed
// (etcd's minimum lease TTL is 1.5 election timeouts, rounded up to
// seconds).
const (
	tickMs     = 10
	electionMs = 100
)

// electionTimeout is the test servers' election timeout, which the backends
// of the tests declare (etcd.WithElectionTimeout).
const electionTimeout = electionMs * time.Millisecond

func TestMain(m *testing.M) {
	conformance.MaybeContend() // a fault run's helper process
	if os.Getenv(memberEnv) != "" {
		os.Exit(runMember(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
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
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = "data"
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	cfg.TickMs = tickMs
	cfg.ElectionMs = electionMs
	cu := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(*client)}
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

// freePort asks the kernel for a free loopback port.
func freePort(t testing.TB) int { return freePorts(t, 1)[0] }

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

// healthy reports whether the etcd member at addr has a leader and serves
// requests.
func healthy(addr string) bool {
	c := http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// startEtcd starts a one-member etcd cluster as a process of its own, killed
// at the end of the test. Restart keeps its data.
func startEtcd(t testing.TB) *serverproc.Process {
	t.Helper()
	peer := freePort(t)
	return serverproc.Start(t,
		[]string{os.Args[0], "-client", serverproc.PortPlaceholder, "-peer", strconv.Itoa(peer)},
		serverproc.Options{Env: []string{memberEnv + "=1"}, Ready: healthy})
}

// newClient returns an etcd client of addr, closed at the end of the test.
func newClient(t testing.TB, addr string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3.New: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// proxiedClient is an etcd client that reaches the server through a fault
// proxy of its own.
type proxiedClient struct {
	cli *clientv3.Client
	px  *faultproxy.Proxy
}

func (p proxiedClient) close() {
	p.cli.Close()
	p.px.Close()
}

// ctxFor returns a context for one test, ended at its cleanup.
func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
