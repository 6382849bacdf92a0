// Package simredis is the Redis model of the simulation harness
// (internal/simtest): package lock's real code over the Redis backend's
// real code (package redis: its Lua scripts, batching, waiters' queue,
// notifier, Redlock), through go-redis, to in-process Redis servers
// (miniredis, which runs the scripts with a Lua interpreter), over a
// simulated network of in-memory connections (see net.go), all inside a
// testing/synctest bubble: a TTL of a second costs nothing.
//
// It is a module of its own so that its test-only dependency, miniredis,
// stays out of the modules users require.
package simredis

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock/backend"
	"github.com/distlock/lock/internal/simtest"
	lredis "github.com/distlock/lock/redis"
)

// model is a simtest.Model of a single Redis node (one server) or a
// Redlock (several).
type model struct {
	net  *simnet
	srvs []*miniredis.Miniredis
	rdbs []*goredis.Client
	opts []lredis.Option
}

// New returns the model of a Redis deployment of nodes servers: one is a
// single node (redis.New), more a Redlock (redis.NewRedlock). opts are
// the backend's options.
func New(nodes int, opts ...lredis.Option) simtest.NewModel {
	return func(env simtest.Env) simtest.Model {
		m := &model{net: &simnet{ttl: env.TTL, log: env.Log, cutUntil: map[int]time.Time{}}, opts: opts}
		if nodes > 1 {
			// A node that restarts empty waits the maximum TTL before it
			// votes again: the longest TTL the workload asks for (20
			// TTLs, see simtest's calm phase) and a little more, so that
			// runs see it come back and adopt fence counters.
			opts := append([]lredis.Option{lredis.WithMaxTTL(25 * env.TTL)}, opts...)
			m.opts = opts
		}
		for i := 0; i < nodes; i++ {
			s := miniredis.NewMiniRedis()
			// TTLs run on the clock, which in the bubble is the
			// virtual one.
			s.ClockTTL(true)
			m.srvs = append(m.srvs, s)
			m.net.nodes = append(m.net.nodes, &node{id: i, srv: s})
		}
		if nodes > 1 {
			m.initNodes()
			return redlock{m}
		}
		return m
	}
}

// initNodes marks a Redlock's new nodes ready, as a deployment does once
// (Redlock.InitNewNodes), over connections outside the simulated network.
func (m *model) initNodes() {
	var direct []lredis.Conn
	for i, s := range m.srvs {
		rdb := goredis.NewClient(&goredis.Options{
			Addr:   fmt.Sprintf("127.0.0.1:%d", 6379+i),
			Dialer: func(context.Context, string, string) (net.Conn, error) { return s.Dial() },
		})
		defer rdb.Close()
		direct = append(direct, rdb)
	}
	r, err := lredis.NewRedlock(direct, m.opts...)
	if err == nil {
		_, err = r.InitNewNodes(context.Background())
		r.Close()
	}
	if err != nil {
		panic(fmt.Sprintf("simredis: marking the Redlock's nodes ready: %v", err))
	}
}

var _ simtest.Model = (*model)(nil)

// Client implements simtest.Model: a go-redis client per node, each
// dialling through the simulated network, with the request timeout as
// its read and write timeouts and go-redis's default retries.
func (m *model) Client(i int, r *rand.Rand, timeout time.Duration) (backend.Backend, error) {
	var nodes []lredis.Conn
	for _, nd := range m.net.nodes {
		dial := m.net.dialer(i, nd, rand.New(rand.NewPCG(r.Uint64(), r.Uint64())), timeout)
		rdb := goredis.NewClient(&goredis.Options{
			Addr:         fmt.Sprintf("127.0.0.1:%d", 6379+nd.id), // an address, not a name: no lookup
			Dialer:       func(context.Context, string, string) (net.Conn, error) { return dial() },
			DialTimeout:  timeout,
			ReadTimeout:  timeout,
			WriteTimeout: timeout,
			PoolSize:     8,
		})
		m.rdbs = append(m.rdbs, rdb)
		nodes = append(nodes, rdb)
	}
	if len(nodes) == 1 {
		return lredis.New(nodes[0], m.opts...), nil
	}
	return lredis.NewRedlock(nodes, m.opts...)
}

// SetFaults implements simtest.Model.
func (m *model) SetFaults(on bool) {
	m.net.mu.Lock()
	m.net.on = on
	m.net.mu.Unlock()
}

// Nodes implements simtest.Model.
func (m *model) Nodes() int { return len(m.srvs) }

// Partition implements simtest.Model: the client's links deliver nothing
// more (they go silent) and its dials hang until d has passed.
func (m *model) Partition(client int, d time.Duration) {
	m.net.mu.Lock()
	m.net.cutUntil[client] = time.Now().Add(d)
	m.net.mu.Unlock()
}

// Pause implements simtest.Model: requests wait at the node's gate.
func (m *model) Pause(node int) { m.net.nodes[node].pause() }

// Resume implements simtest.Model.
func (m *model) Resume(node int) { m.net.nodes[node].resume() }

// Restart implements simtest.Model: every connection to the node breaks;
// the server keeps its data (as with appendfsync always).
func (m *model) Restart(node int) { m.net.nodes[node].restart() }

// redlock is the model of a Redlock: its nodes may also restart empty.
type redlock struct{ *model }

var _ simtest.EmptyRestarter = redlock{}

// RestartEmpty implements simtest.EmptyRestarter: the node forgets
// everything (locks, fence counters, its state key) and every connection
// to it breaks, as at a restart without persistence.
func (m redlock) RestartEmpty(node int) {
	m.srvs[node].FlushAll()
	m.net.nodes[node].restart()
}

// kept reports whether the Redis key k of s may outlive every lease and
// waiter: the fence counters; the tombstones of released tokens, which
// make a release or an acquire sent again after its token's release
// harmless (they expire on their own); a handover's fence reservation
// ("next"), which expires with the lock it was made on, and which a
// release leaves (any later grant raises the counter past it); with
// sessions, a session's lock table, which keeps an ended session from
// beginning again, and a lock whose session key is gone, which is free by
// the sessions' rule (see package redis) and expires on its own. None of
// them holds a lock.
func kept(s *miniredis.Miniredis, k string) bool {
	if strings.HasSuffix(k, ":fence") || strings.Contains(k, ":dead:") || strings.HasSuffix(k, ":next") ||
		k == lredis.DefaultPrefix+"redlock:node" { // a Redlock node's state: "ready"
		return true
	}
	if strings.HasPrefix(k, lredis.DefaultPrefix+"session:") && strings.HasSuffix(k, ":locks") {
		return true
	}
	v, err := s.Get(k)
	if _, session, ok := strings.Cut(strings.TrimSuffix(v, "+"), "@"); err == nil && ok {
		return !s.Exists(session)
	}
	return false
}

// held lists, per node, the keys that no lease or waiter should still
// hold, and with channels set, the channels still subscribed.
func (m *model) held(channels bool) []string {
	var out []string
	for i, s := range m.srvs {
		var ks []string
		for _, k := range s.Keys() {
			if !kept(s, k) {
				ks = append(ks, fmt.Sprintf("%q (%v left)", k, s.TTL(k)))
			}
		}
		if len(ks) > 0 {
			out = append(out, fmt.Sprintf("node %d: keys %s", i, strings.Join(ks, ", ")))
		}
		if !channels {
			continue
		}
		if chs := s.PubSubChannels(""); len(chs) > 0 {
			out = append(out, fmt.Sprintf("node %d: channels subscribed %q", i, chs))
		}
	}
	return out
}

// Settled implements simtest.Model: keys only. A subscription may
// outlive its watch on a connection gone silent: the server keeps it until
// the client closes that connection (go-redis's health check writes a
// PING, which a silent connection swallows without an error), as a real
// server keeps one until TCP keepalive ends the connection. Waiters do
// not depend on it (see package redis: they refresh and poll).
func (m *model) Settled() []string { return m.held(false) }

// Leftovers implements simtest.Model: keys and subscriptions, once every
// client is closed. keys is not needed: every key but the kept ones
// counts.
func (m *model) Leftovers([]string) []string { return m.held(true) }

// Requests implements simtest.Model: the commands sent, by name.
func (m *model) Requests() map[string]int {
	m.net.mu.Lock()
	defer m.net.mu.Unlock()
	return maps.Clone(m.net.sent)
}

// Close implements simtest.Model.
func (m *model) Close() {
	for _, rdb := range m.rdbs {
		rdb.Close()
	}
	for _, nd := range m.net.nodes {
		nd.resume()
		nd.restart()
	}
	for _, s := range m.srvs {
		s.Close()
	}
}
