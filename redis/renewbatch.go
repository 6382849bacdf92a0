package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock/backend"
)

// Batched renewals. When renewals queue in the batcher (the wire is busy:
// many leases renew at once), the ones that can share a script go to the
// server as one renewBatchScript of up to maxRenewBatch renewals instead of
// one renewScript each. A script call costs the server several times what
// its commands do (its arguments, its Lua state, one reply), and a renewal
// needs only a GET and a PEXPIRE or two: sharing the call is what lets one
// redis-server keep hundreds of thousands of leases.
//
// Why it keeps the promise: each renewal in the batch is the renewScript
// it replaces, run for its own key and token, with its own TTL, and its
// caller gets its own answer (renewed, or not held): one lost key is
// reported lost and the others renewed. The batch runs atomically, as a
// pipeline's scripts run one after another, so no other request sees a
// renewal half done; the server runs it when it would have run the first
// of them, and every caller counts its lease's deadline from its own send
// time, which is before the batch's. A batch whose reply is lost fails
// every renewal in it with the same error, as a pipeline does: each
// caller's outcome is unknown, and a renewal, sent again or not, never
// takes a free key. Keys of different hash slots never share a script on
// Cluster (the server would refuse it), and a Ring (which shards by key)
// sends renewals one by one. Package lock hands renewals that fall due
// together to RenewBatch (backend.BatchRenewer), which queues them at once;
// Redlock's sends each node the whole batch and decides each renewal by
// its own majority.

// coalescing says which queued renewals may share a script.
type coalescing int

const (
	coalesceNone   coalescing = iota // each renewal its own script
	coalesceAll                      // one server: any renewals
	coalesceBySlot                   // Cluster: renewals of one hash slot
)

// maxRenewBatch bounds the renewals of one script: its work on the server
// (about 2µs a renewal) stays far below a millisecond.
const maxRenewBatch = 256

// renewBatchScript: KEYS = each renewal's keys (renewScript's: the lock
// first), one after another; ARGV = for each renewal: token, ttl ms, how
// many keys. Returns a list with each renewal's answer, as renewScript's.
var renewBatchScript = goredis.NewScript(`
local out = {}
local k = 1
for i = 1, #ARGV, 3 do
  local t = ARGV[i]
  local n = tonumber(ARGV[i + 2])
  local v = redis.call('GET', KEYS[k])
  if v == t or v == t .. '+' then
    for j = k + 1, k + n - 1 do
      redis.call('PEXPIRE', KEYS[j], ARGV[i + 1])
    end
    out[#out + 1] = redis.call('PEXPIRE', KEYS[k], ARGV[i + 1])
  else
    out[#out + 1] = 0
  end
  k = k + n
end
return out`)

// renewGroup is queued renewals sent as one renewBatchScript.
type renewGroup struct {
	calls []*call
	cmd   *goredis.Cmd
}

// groupRenewals takes the renewals that can share a script out of batch:
// groups of two to maxRenewBatch, by hash slot on Cluster. It returns the
// calls left to send one by one, and the groups.
func (b *batcher) groupRenewals(batch []*call) ([]*call, []*renewGroup) {
	if b.renewals == coalesceNone {
		return batch, nil
	}
	bySlot := map[int][]*call{}
	var rest []*call
	for _, c := range batch {
		if c.script != renewScript {
			rest = append(rest, c)
			continue
		}
		slot := 0
		if b.renewals == coalesceBySlot {
			slot = hashSlot(c.keys[0])
		}
		bySlot[slot] = append(bySlot[slot], c)
	}
	var groups []*renewGroup
	for _, cs := range bySlot {
		for len(cs) > 0 {
			n := min(len(cs), maxRenewBatch)
			if n == 1 {
				rest = append(rest, cs[0])
			} else {
				groups = append(groups, &renewGroup{calls: cs[:n:n]})
			}
			cs = cs[n:]
		}
	}
	return rest, groups
}

// args returns the group's keys and arguments.
func (g *renewGroup) args() ([]string, []any) {
	var keys []string
	args := make([]any, 0, 3*len(g.calls))
	for _, c := range g.calls {
		keys = append(keys, c.keys...)
		args = append(args, c.args[0], c.args[1], len(c.keys))
	}
	return keys, args
}

// send puts the group's script in the pipeline.
func (g *renewGroup) send(ctx context.Context, p goredis.Pipeliner) {
	keys, args := g.args()
	g.cmd = renewBatchScript.EvalSha(ctx, p, keys, args...)
}

// deliver gives each call of the group its own answer, or the group's
// error, and ends it.
func (g *renewGroup) deliver(ctx context.Context, b *batcher) {
	if goredis.HasErrorPrefix(g.cmd.Err(), "NOSCRIPT") {
		keys, args := g.args()
		g.cmd = renewBatchScript.Run(ctx, b.rdb, keys, args...)
	}
	res, err := g.cmd.Int64Slice()
	if err == nil && len(res) != len(g.calls) {
		err = fmt.Errorf("redis: batched renewal: %d answers for %d renewals", len(res), len(g.calls))
	}
	for i, c := range g.calls {
		c.cmd = goredis.NewCmd(c.ctx)
		if err != nil {
			c.cmd.SetErr(err)
		} else {
			c.cmd.SetVal(res[i])
		}
		close(c.done)
	}
}

// RenewBatch implements backend.BatchRenewer: the renewals go to the
// batcher's queue at once, and so to the server as renewBatchScripts of up
// to maxRenewBatch (one per hash slot on Cluster), in one pipeline; each
// caller's answer is its own (see above). On a Ring they go one by one,
// concurrently.
func (b *Backend) RenewBatch(ctx context.Context, rs []backend.Renewal) []backend.RenewResult {
	if err := b.check(); err != nil {
		return backend.FailedRenewals(len(rs), err)
	}
	out := make([]backend.RenewResult, len(rs))
	var bySession []bool
	if b.sessions != nil {
		bySession = b.sessions.renew(ctx, rs, out)
	}
	calls := make([]*call, 0, len(rs))
	idx := make([]int, 0, len(rs))
	for i, r := range rs {
		if bySession != nil && bySession[i] {
			continue
		}
		if err := b.checkTTL(r.TTL); err != nil {
			out[i].Err = err
			continue
		}
		calls = append(calls, b.batch.newCall(ctx, b.sc.renew, b.opts.renewKeys(r.Key), b.stored(r.Token), ms(r.TTL)))
		idx = append(idx, i)
	}
	for j, cmd := range b.batch.runAll(ctx, calls) {
		i := idx[j]
		ok, err := cmd.Int64()
		switch {
		case err != nil:
			out[i].Err = storeErr("renew", err)
		case ok == 0:
			out[i].Err = backend.ErrNotHeld
		default:
			out[i].Grant = backend.Grant{TTL: granted(rs[i].TTL)}
		}
	}
	return out
}

var _ backend.BatchRenewer = (*Backend)(nil)

// RenewBatch implements backend.BatchRenewer: every node gets the whole
// batch as one request (its batcher's runAll: renewBatchScripts in one
// pipeline), and each renewal is decided as Renew decides it, from its own
// answers of every node: renewed on a majority, not held on more nodes
// than a majority leaves out, otherwise of unknown outcome. The call
// returns once every renewal is decided, like Renew once its own is; a
// node's late answers go on in the background.
func (r *Redlock) RenewBatch(ctx context.Context, rs []backend.Renewal) []backend.RenewResult {
	if err := r.check(); err != nil {
		return backend.FailedRenewals(len(rs), err)
	}
	out := make([]backend.RenewResult, len(rs))
	var idx []int
	var shortest time.Duration
	for i, x := range rs {
		if x.TTL > r.opts.maxTTL {
			out[i].Err = r.tooLong(x.TTL)
			continue
		}
		idx = append(idx, i)
		if shortest == 0 || x.TTL < shortest {
			shortest = x.TTL
		}
	}
	if len(idx) == 0 {
		return out
	}
	// answers[node][j]: the node's answer to renewal idx[j]; read only
	// for nodes gather reports answered (it wrote them before).
	answers := make([][]error, len(r.nodes))
	perRenewal := func(nodeErrs []error, j int) []error {
		errs := make([]error, len(nodeErrs))
		for i, err := range nodeErrs {
			errs[i] = err
			if err == nil {
				errs[i] = answers[i][j]
			}
		}
		return errs
	}
	decided := r.majorityDecided(backend.ErrNotHeld)
	timeout := r.batchTimeout(shortest, len(idx))
	nodeErrs, _ := r.gatherWithin(ctx, timeout, func(nctx context.Context, i int, n *batcher) error {
		calls := make([]*call, len(idx))
		for j, k := range idx {
			calls[j] = n.newCall(nctx, renewScript, r.opts.renewKeys(rs[k].Key), rs[k].Token, ms(rs[k].TTL))
		}
		a := make([]error, len(idx))
		for j, cmd := range n.runAll(nctx, calls) {
			ok, err := cmd.Int64()
			switch {
			case err == nil && ok == 0:
				err = backend.ErrNotHeld
			case err != nil && nctx.Err() != nil && errors.Is(err, context.DeadlineExceeded):
				err = fmt.Errorf("%w (%v)", errNodeTimeout, timeout)
			}
			a[j] = err
		}
		answers[i] = a
		return nil
	}, func(nodeErrs []error) bool {
		for j := range idx {
			if !decided(perRenewal(nodeErrs, j)) {
				return false
			}
		}
		return true
	}, nil)
	for j, k := range idx {
		errs := perRenewal(nodeErrs, j)
		ok, notHeld, _ := count(errs, backend.ErrNotHeld)
		switch {
		case ok >= r.quorum:
			out[k].Grant = backend.Grant{TTL: granted(rs[k].TTL)}
		case notHeld > len(r.nodes)-r.quorum:
			out[k].Err = backend.ErrNotHeld
		default:
			out[k].Err = r.quorumErr("renew", ok, errs, ctx)
		}
	}
	return out
}

var _ backend.BatchRenewer = (*Redlock)(nil)

// perRenewalTime is what one renewal of a batch adds to a node's timeout
// for the batch: a node takes longer to run, and a client under load to
// read, 256 renewals than one.
const perRenewalTime = 200 * time.Microsecond

// batchTimeout is the node timeout of a batch of n renewals whose shortest
// TTL is ttl: the node timeout of one renewal (WithNodeTimeout, or derived
// from ttl), plus perRenewalTime for each renewal, at most a third of ttl
// (the renewal period: an answer later than that is no use). A renewal
// shares its batch's fate at each node, so a timeout fit for one renewal
// would fail whole batches on a loaded machine. Safety does not rest on
// it: each lease counts its deadline from the batch's send, whenever the
// answers come.
func (r *Redlock) batchTimeout(ttl time.Duration, n int) time.Duration {
	one := r.nodeTimeout(ttl)
	return max(one, min(one+time.Duration(n)*perRenewalTime, ttl/3))
}
