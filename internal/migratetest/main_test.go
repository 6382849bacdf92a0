// Package migratetest tests package migrate on real servers: phases 2
// and 3 over redis-server and an etcd member through the conformance
// suite and its fault runs, and a rolling cutover through all four
// phases with a fenced resource on PostgreSQL. It is a module of its own,
// so that the root module (and package migrate) requires no store's
// client.
package migratetest

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/distlock/lock/conformance"
	"github.com/distlock/lock/internal/etcdtest"
)

func TestMain(m *testing.M) {
	conformance.MaybeContend() // a fault run's helper process
	etcdtest.MaybeRunMember()
	goleak.VerifyTestMain(m)
}
