package simtest

import (
	"math/rand/v2"
	"time"

	"github.com/distlock/lock/backend"
)

// A Model is what a run drives: a store, with the real code of a backend
// in each client, and a simulated network between them, all on the
// bubble's virtual clock. The memory model (NewMemory, the default) is
// the memory store behind a command-level network (Conn); package
// simredis is the Redis backend's real code and Lua scripts over a
// byte-level network to in-process Redis servers.
//
// The harness calls a model's methods from one goroutine at a time, except
// the backends' own calls, which are concurrent.
type Model interface {
	// Client returns client i's backend. Its requests cross the
	// simulated network with fates drawn from r; timeout is the
	// simulated client library's request timeout.
	Client(i int, r *rand.Rand, timeout time.Duration) (backend.Backend, error)
	// SetFaults turns the per-request faults (losses, duplicates,
	// delays) on or off; latency stays.
	SetFaults(on bool)
	// Nodes is the number of store nodes (more than one for Redlock).
	Nodes() int
	// Partition cuts client off from every node for d from now.
	Partition(client int, d time.Duration)
	// Pause stops node from serving requests until Resume; requests
	// wait, as at a stopped process.
	Pause(node int)
	Resume(node int)
	// Restart restarts node, keeping its data: every connection to it
	// breaks.
	Restart(node int)
	// Settled lists what the store still holds once the faults have
	// stopped, no acquire runs and every lock's TTL has passed: locks,
	// waiters' records, open watches. It should be empty.
	Settled() []string
	// Leftovers lists what the store holds of keys, and watches left
	// open, once every client is closed. It should be empty.
	Leftovers(keys []string) []string
	// Requests counts the requests sent, by operation.
	Requests() map[string]int
	// Close frees the model.
	Close()
}

// EmptyRestarter is a Model whose nodes can restart with their data lost,
// without breaking what the store promises (a Redlock's: a node that comes
// back empty does not vote until every lock it may have granted has
// expired).
type EmptyRestarter interface {
	RestartEmpty(node int)
}

// Env is what a model is made with.
type Env struct {
	TTL time.Duration
	// Log records a fault of the run with its virtual time.
	Log func(format string, args ...any)
}

// NewModel makes a model for one run.
type NewModel func(Env) Model
