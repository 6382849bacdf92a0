package etcd_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/conformance/serverproc"
	"github.com/distlock/lock/internal/etcdtest"
)

// electionTimeout is the test servers' election timeout, which the backends
// of the tests declare (etcd.WithElectionTimeout).
const electionTimeout = etcdtest.ElectionTimeout

func TestMain(m *testing.M) {
	conformance.MaybeContend() // a fault run's helper process
	etcdtest.MaybeRunMember()
	goleak.VerifyTestMain(m)
}

// startEtcd starts a one-member etcd cluster as a process of its own, killed
// at the end of the test. Restart keeps its data.
func startEtcd(t testing.TB) *serverproc.Process { return etcdtest.Start(t) }

// newClient returns an etcd client of the members at addrs, closed at the end of the test.
func newClient(t testing.TB, addrs ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: addrs, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
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
