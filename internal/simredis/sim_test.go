package simredis

import (
	"testing"

	"github.com/distlock/lock/internal/simtest"
	lredis "github.com/distlock/lock/redis"
)

// The CI budget, in seeds: each run has about 140 critical sections. The
// single node's is what the histories need (TestSimFindsHistories): X1 to
// X3 took up to 60, 100+ and 159 seeds in runs of the day, and X1 was not
// found in 200 once. Sessions (TestSimRedisSessions) have a budget of
// their own.
//
// The sweep of the code as it is (TestSimRedis) runs fewer seeds than a
// history's search may take: each CI run draws seeds of its own, so the
// sweeps add up over runs, while a history must be found within one run
// (the self-test's claim). Half the search's budget keeps the whole CI
// run within its hour.
const (
	redisBudget         = 300
	redisSweepBudget    = 150
	redisSessionsBudget = 60
	redlockBudget       = 25
)

// TestSimRedis runs package lock over the Redis backend's real code and
// scripts against one in-process Redis server, over the simulated
// network, for the seeds the flags name (see internal/simtest's flags).
func TestSimRedis(t *testing.T) {
	// A history's search passes its own budget (-simseeds).
	simtest.Sweep(t, simtest.Config{Model: New(1)}, "./internal/simredis", redisSweepBudget)
}

// TestSimRedisSessions is TestSimRedis with sessions (redis.WithSessions):
// the leases that renew themselves share a session, whose key the
// simulated faults expire, and whose walks race every other request.
func TestSimRedisSessions(t *testing.T) {
	simtest.Sweep(t, simtest.Config{Model: New(1, lredis.WithSessions(true))}, "./internal/simredis", redisSessionsBudget)
}

// TestSimRedlock is TestSimRedis over a Redlock of three servers; the
// timed faults pause and restart one node at a time.
func TestSimRedlock(t *testing.T) {
	simtest.Sweep(t, simtest.Config{Model: New(3)}, "./internal/simredis", redlockBudget)
}
