package etcd_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/conformance/faultproxy"
	"github.com/distlock/lock/conformance/serverproc"
	"github.com/distlock/lock/etcd"
)

// harness is one etcd member in a process of its own; every backend reaches
// it through a fault proxy of its own.
type harness struct {
	faultproxy.Hooks
	t   *testing.T
	srv *serverproc.Process
}

var (
	_ conformance.Pauser       = (*harness)(nil)
	_ conformance.Disconnecter = (*harness)(nil)
	_ conformance.ReplyHolder  = (*harness)(nil)
	_ conformance.Restarter    = (*harness)(nil)
)

// owned is a backend that closes its etcd client and its proxy with it, as
// the exit of its process would: the suite checks that a closed client
// leaves no goroutines.
type owned struct {
	*etcd.Backend
	h *harness
	proxiedClient
}

func (o *owned) Close() error {
	err := o.Backend.Close()
	o.proxiedClient.close()
	o.h.Forget(o)
	return err
}

func (h *harness) NewBackend(context.Context) (backend.Backend, error) {
	px := faultproxy.Start(h.t, h.srv.Addr)
	cli := newClient(h.t, px.Addr)
	b, err := etcd.New(cli, etcd.WithElectionTimeout(electionTimeout))
	if err != nil {
		cli.Close()
		px.Close()
		return nil, err
	}
	o := &owned{Backend: b, h: h, proxiedClient: proxiedClient{cli, px}}
	h.Add(o, px)
	return o, nil
}

func (h *harness) Capabilities() backend.Capabilities {
	cli := newClient(h.t, h.srv.Addr)
	defer cli.Close()
	b, err := etcd.New(cli, etcd.WithElectionTimeout(electionTimeout))
	if err != nil {
		h.t.Fatalf("etcd.New: %v", err)
	}
	defer b.Close()
	return b.Capabilities()
}

// ContenderURL implements conformance.ProcessContenders: helper processes
// reach the member directly.
func (h *harness) ContenderURL(context.Context) (string, error) {
	return fmt.Sprintf("etcd://%s?electiontimeout=%v", h.srv.Addr, electionTimeout), nil
}

func (h *harness) Pause(context.Context) error  { h.srv.Stop(); return nil }
func (h *harness) Resume(context.Context) error { h.srv.Continue(); return nil }

// Restart kills the member with SIGKILL and starts it again on the same
// data directory; the clients reconnect on their own.
func (h *harness) Restart(_ context.Context, keepData bool) error {
	if !keepData {
		h.t.Fatal("harness: the suite restarts the store keeping its data only")
	}
	h.srv.Restart()
	return nil
}

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness {
		return &harness{t: t, srv: startEtcd(t)}
	}, conformance.RequireHooks())
}

// Seeded randomized fault runs (conformance.RunFaults).
func TestFaultRuns(t *testing.T) {
	conformance.RunFaults(t, func(t *testing.T) conformance.Harness {
		return &harness{t: t, srv: startEtcd(t)}
	})
}

// The negative control under faults: the same runs over a wrapper with a
// known flaw must find it (expire-early is left out: the suite's short TTL
// is etcd's minimum, which a flawed request cannot shorten).
func TestFaultRunsCatchFlaws(t *testing.T) {
	conformance.RunFlawControls(t, func(t *testing.T) conformance.Harness {
		return &harness{t: t, srv: startEtcd(t)}
	}, 10, []string{"repeat-fence", "release-ignores-token"}, conformance.FaultDuration(20*time.Second), conformance.FaultContenders(6), conformance.FaultKeys(1))
}
