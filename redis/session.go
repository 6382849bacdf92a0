package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/lock/backend"
)

// Sessions (WithSessions): one renewal for all the leases of a client.
//
// Without sessions every lease keeps its own lock key alive: a renewal
// every third of its TTL is a GET and three PEXPIREs on the server (the
// lock, its next key and its holder key), about 12 commands per lease per
// TTL however the renewals are batched (9 before holder keys). With
// sessions, the leases of one TTL that a backend granted share a session,
// and renewing a batch of them is one PEXPIRE of the session's key and one
// MGET of their locks.
//
// # The keys
//
//   - The session key "PREFIX session:SID" (value "1") expires a TTL after
//     the session's latest renewal. SID is 7 random characters, new for
//     every session.
//   - Its lock table, the hash "PREFIX session:SID:locks", maps each lock
//     key the session holds to the holder's token. It is made with the
//     session (with a field "" that is no lock), and it expires
//     sessionSpan TTLs after the latest refresh pass (below) plus a TTL.
//     While it exists, the SID is in use or was: a session is made only
//     where its table does not exist, so a session whose key expired never
//     lives again, whatever request arrives late.
//   - A lock of the session has the value TOKEN "@" SESSIONKEY (and the
//     waiters' mark "+"), where TOKEN starts with "S" and SID
//     (backend.TokenPrefixer): the backend finds a lease's session from
//     its token, with no state per lease, and a script finds a lock's
//     session from the lock's value. The lock key expires sessionSpan
//     TTLs after it was granted or last refreshed, and so do its next
//     key and its holder key (label.go): the walks below extend all
//     three, and live() deletes all three.
//
// # The rule: a lock whose session key is gone is free
//
// Every script that reads a lock reads it through live (sessionLua): a
// lock that names a session whose key does not exist is deleted, with its
// next key, before the script goes on, exactly as if it had expired at
// that moment. Expiry is the only way a lock ends without a request of
// its holder, and every script of this package already copes with a lock
// that expired at any moment before it ran: so the rules of the queue,
// the handover and the fences hold unchanged. A waiter learns a held
// lock's remaining time as the smaller of the lock key's and its session
// key's (pttl).
//
// # The lease's deadline
//
// A lease's lock lives while its session key and its lock key both do, and
// holds its token. A renewal (sessionRenewScript) makes the session key
// live a TTL from its arrival (the caller counts its deadline from its
// own send, earlier), and reads each lock of the batch in the same script:
// a lock released or deleted from outside is reported at the lease's next
// renewal, as without sessions. The lock keys of a session are refreshed
// by walks: every sessionPass TTLs, the backend walks the session's lock
// table with HSCAN, sessionWalkStep fields a script, extending each lock
// the session still holds to sessionSpan TTLs and dropping the others
// from the table. HSCAN returns every field that was in the table for the whole
// walk, so once a walk that began at time s completes, every lock of the
// session expires no earlier than s + sessionSpan TTLs: a lock in the
// table all along was extended after s, and a lock added during the walk
// was granted with that span after s. This bound is the session's
// horizon, and a renewal grants the TTL only when the horizon lies
// sessionMargin TTLs or more after its send (one for the lease, one for
// the clocks' drift over the span); otherwise it fails with an error of
// unknown outcome (the lease is lost at its deadline if the walks do not
// catch up), never with a deadline the lock key may not reach. Before its
// first walk completes, the horizon is the session's creation plus the
// span. A walk that fails (its reply lost, the server slow) leaves the
// horizon where it was; a walk runs every sessionPass TTLs, so a renewal
// is refused only after walks have failed for about 3.5 TTLs.
//
// A lease whose renewals stop while its session lives on (the lease was
// lost at its deadline because its own renewal came too late, or it
// reached WithMaxHold) would keep its lock for as long as the session's
// walks go on: package lock releases such a lease in the background
// (backend.TokenPrefixer), and a lease that does not renew itself gets no
// session at all.
//
// # Faults
//
//   - A session's renewal whose reply is lost is an unknown outcome for
//     each of its leases; the next one, or the session's expiry, decides.
//   - A process stopped for longer than a TTL (SIGSTOP, a long GC pause)
//     loses its session: every other client treats its locks as free from
//     then on, and its renewals answer ErrNotHeld for every lease of the
//     session. New leases join a new session.
//   - A request sent again after a lost reply (go-redis's retry) or
//     delayed on the wire: a grant checks its session key in the same
//     script, so a late grant for a session that has ended takes nothing;
//     a late grant for a session that has not yet begun, arriving after
//     its table expired, can begin it and take a free lock, which expires
//     a TTL later with nobody renewing it (as a late acquire does without
//     sessions once its token's tombstone is gone). A grant for a live
//     session delayed longer than a tombstone lives (15s) arrives after
//     the cleanup release of its unknown outcome had its answer: the
//     release buried its token in the session's table, and the grant is
//     refused (see doubt); else it would take a free lock into the
//     session, which would keep it as long as the session lives.
//   - A release of unknown outcome (its reply lost, its context ended)
//     may not have reached the server, and the session's walks would
//     extend its lock for as long as the session lives: the session sends
//     it again after each walk until its outcome is known (see released).
//   - A server restarted empty forgets the session keys with the locks.
//
// # The cost
//
// Per lease and TTL: the walks, 3 PEXPIREs a lock (the lock, its next key
// and its holder key) every sessionPass TTLs, 1.2 per TTL, and one MGET and
// one PEXPIRE per batch of up to maxRenewBatch renewals, every third of
// the TTL. The bench's leases scenario measured 0.70 commands per lease
// per TTL at 100,000 leases, against 9.0 without sessions, before holder
// keys added a PEXPIRE to each (walked or renewed) lock. The price: a lock's key
// lives up to sessionSpan TTLs after its session ended (it is free at
// once, and the next request that looks at it deletes it), a grant writes
// the session's table too, and a client that uses many TTLs has a session
// (and a goroutine for its walks) per TTL.
//
// Sessions need every script's keys on one server: New over a
// *goredis.Client (standalone or Sentinel) only. Every client of a prefix
// should use the same mode: a client without sessions sees a lock of a
// dead session as held until its key expires.
const (
	// sessionSpan is how many TTLs a session's lock key lives after its
	// grant or its last refresh.
	sessionSpan = 8
	// sessionPass is how many TTLs lie between the starts of two walks of
	// a session's lock table.
	sessionPass = 2.5
	// sessionMargin is how many TTLs the session's horizon must lie
	// beyond a renewal's send for the renewal to grant the TTL.
	sessionMargin = 2
	// sessionWalkStep is how many fields one step of a walk asks HSCAN
	// for: the work of one script on the server stays well under a
	// millisecond.
	sessionWalkStep = 256
)

// WithSessions makes the leases of one TTL share a session, renewed with
// one request however many leases it holds (see Sessions in session.go).
// For a process holding many leases: it costs the server about a fifth of
// the commands of a renewal per lease. New over a *goredis.Client only;
// the URL parameter sessions=true sets it.
func WithSessions(on bool) Option { return func(o *options) { o.sessions = on } }

// sessions are a backend's sessions: the one that new leases of each TTL
// join, and every session whose leases may still renew.
type sessions struct {
	b *Backend

	mu    sync.Mutex
	byTTL map[time.Duration]*session
	bySID map[string]*session

	ctx  context.Context // ends at close: bounds the walks
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// session is one session (see Sessions).
type session struct {
	sid, key, table string
	ttl             time.Duration

	mu      sync.Mutex
	horizon time.Time // every lock of the session expires no earlier
	ended   bool      // its key expired: every lease of it is lost
	touched time.Time // send of the latest grant or renewal the store confirmed
	// pending are the session's locks (by lock key) whose release had
	// an unknown outcome; each walk sends their releases again (see
	// resend).
	pending backend.PendingReleases
	// doubtful are the tokens of grants of unknown outcome: their
	// releases bury them too (see doubt).
	doubtful map[string]struct{}
}

func newSessions(b *Backend) *sessions {
	ctx, stop := context.WithCancel(context.Background())
	return &sessions{b: b, byTTL: map[time.Duration]*session{}, bySID: map[string]*session{}, ctx: ctx, stop: stop}
}

// current returns the session that a new lease of ttl joins: the latest
// one of ttl, unless it ended or may have (nothing touched it in the last
// half TTL: then a new one, rather than a grant refused for a session
// that expired while idle).
func (ss *sessions) current(ttl time.Duration) (*session, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.ctx.Err() != nil || ss.b.closed.Load() {
		return nil, backend.ErrClosed
	}
	s := ss.byTTL[ttl]
	if s != nil {
		s.mu.Lock()
		usable := !s.ended && time.Since(s.touched) < ttl/2
		s.mu.Unlock()
		if usable {
			return s, nil
		}
	}
	sid := backend.NewSessionID()
	key := ss.b.opts.prefix + "session:" + sid
	now := time.Now()
	s = &session{sid: sid, key: key, table: key + ":locks", ttl: ttl, horizon: now.Add(sessionSpan * ttl), touched: now}
	ss.byTTL[ttl] = s
	ss.bySID[sid] = s
	ss.wg.Add(1)
	go ss.walks(s)
	return s, nil
}

// TokenPrefix implements backend.TokenPrefixer: with sessions, "S" and the
// id of the session a lease of ttl joins.
func (b *Backend) TokenPrefix(ttl time.Duration) (string, error) {
	if b.refused != nil {
		return "", b.refused
	}
	if b.sessions == nil {
		return "", nil
	}
	if err := b.checkTTL(ttl); err != nil {
		return "", err
	}
	s, err := b.sessions.current(ttl)
	if err != nil {
		return "", err
	}
	return backend.SessionPrefix(s.sid), nil
}

// stored returns the value a lock held by token has on the store: the
// token, followed for a session token by "@" and its session's key.
func (b *Backend) stored(token string) string {
	if b.sessions == nil {
		return token
	}
	sid := backend.SessionID(token)
	if sid == "" {
		return token
	}
	return token + "@" + b.opts.prefix + "session:" + sid
}

// unstored returns the token of a lock's value (see stored).
func unstored(v string) string {
	t, _, _ := strings.Cut(v, "@")
	return t
}

// lookup returns the session a token names, or nil.
func (ss *sessions) lookup(token string) *session {
	sid := backend.SessionID(token)
	if sid == "" {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.bySID[sid]
}

// touch records that a request for token's session, sent at sent, made
// the session's key live a TTL from then.
func (ss *sessions) touch(token string, sent time.Time) {
	if s := ss.lookup(token); s != nil {
		s.mu.Lock()
		if sent.After(s.touched) {
			s.touched = sent
		}
		s.mu.Unlock()
	}
}

// ended marks the session of token as ended: no new lease joins it.
func (ss *sessions) ended(token string) {
	if s := ss.lookup(token); s != nil {
		s.mu.Lock()
		s.ended = true
		s.mu.Unlock()
	}
}

// errSessionEnded: a grant for a session whose key had expired.
var errSessionEnded = errors.New("redis: the lease's session ended (its key expired): a new attempt joins a new session")

// sessionRenewScript: KEYS = session key, then the locks of the renewals;
// ARGV = ttl ms, then each lock's value as stored. The session key lives
// ttl from now; returns for each lock 1 when it holds the value (with or
// without the waiters' mark), else 0; or {-1} when the session's key is
// gone: the session ended. One PEXPIRE and one MGET, however many locks.
var sessionRenewScript = goredis.NewScript(`
if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 0 then
  return {-1}
end
local vs = redis.call('MGET', unpack(KEYS, 2))
local out = {}
for i = 1, #vs do
  local want = ARGV[i + 1]
  if vs[i] == want or vs[i] == want .. '+' then
    out[i] = 1
  else
    out[i] = 0
  end
end
return out`)

// renew answers the renewals of rs whose tokens name a session of this
// backend (ok[i] true), one request per session and maxRenewBatch
// renewals, and leaves the others to the caller. Each renewal gets its own
// answer: its lock is checked by value in the same script that renews the
// session, so a lock released or deleted from outside is reported at the
// lease's next renewal, as without sessions.
func (ss *sessions) renew(ctx context.Context, rs []backend.Renewal, out []backend.RenewResult) (ok []bool) {
	ok = make([]bool, len(rs))
	groups := map[*session][]int{}
	for i, r := range rs {
		if s := ss.lookup(r.Token); s != nil {
			groups[s] = append(groups[s], i)
			ok[i] = true
		}
	}
	if len(groups) == 0 {
		return ok
	}
	type part struct {
		s   *session
		idx []int
		at  time.Time
	}
	var calls []*call
	var parts []part
	for s, idx := range groups {
		for len(idx) > 0 {
			n := min(len(idx), maxRenewBatch)
			ks := make([]string, 0, 1+n)
			args := make([]any, 0, 1+n)
			ks = append(ks, s.key)
			args = append(args, ms(s.ttl))
			for _, i := range idx[:n] {
				lk, _ := keys(ss.b.opts.prefix, rs[i].Key)
				ks = append(ks, lk)
				args = append(args, ss.b.stored(rs[i].Token))
			}
			calls = append(calls, ss.b.batch.newCall(ctx, sessionRenewScript, ks, args...))
			parts = append(parts, part{s: s, idx: idx[:n], at: time.Now()})
			idx = idx[n:]
		}
	}
	cmds := ss.b.batch.runAll(ctx, calls)
	for j, x := range parts {
		s := x.s
		res, err := cmds[j].Int64Slice()
		ended := err == nil && len(res) == 1 && res[0] == -1
		if err == nil && !ended && len(res) != len(x.idx) {
			err = fmt.Errorf("redis: session renewal: %d answers for %d renewals", len(res), len(x.idx))
		}
		s.mu.Lock()
		if ended {
			s.ended = true
		} else if err == nil && x.at.After(s.touched) {
			s.touched = x.at
		}
		horizon := s.horizon
		s.mu.Unlock()
		for k, i := range x.idx {
			r := rs[i]
			switch {
			case r.TTL != s.ttl:
				out[i].Err = fmt.Errorf("%w: redis: a renewal for %v of a lease whose session is for %v; a lease keeps its TTL", backend.ErrInvalid, r.TTL, s.ttl)
			case ended:
				out[i].Err = backend.ErrNotHeld
			case err != nil:
				out[i].Err = storeErr("renew", err)
			case res[k] == 0:
				out[i].Err = backend.ErrNotHeld
			case horizon.Sub(x.at) < sessionMargin*r.TTL:
				out[i].Err = storeErr("renew", fmt.Errorf("the session's lock keys are known to live only %v more, less than the TTL: its refresh walks are late", horizon.Sub(x.at).Round(time.Millisecond)))
			default:
				out[i].Grant = backend.Grant{TTL: granted(r.TTL)}
			}
		}
	}
	return ok
}

// sessionWalkScript: KEYS = the session's lock table, the session key;
// ARGV = HSCAN cursor, span ms, table ms. One step of a walk: every lock
// of the step's fields still held by its token of this session lives span
// from now (its next key and its holder key too: see label.go); the others leave the table (the holder's
// renewal reports them). Returns the next cursor. It also extends the
// table, and answers "ended" when the session key is gone.
var sessionWalkScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 'ended'
end
local r = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ` + fmt.Sprint(sessionWalkStep) + `)
local f = r[2]
local ks = {}
for i = 1, #f, 2 do
  if f[i] ~= '' and string.byte(f[i]) ~= 64 then ks[#ks + 1] = f[i] end
end
if #ks > 0 then
  local vs = redis.call('MGET', unpack(ks))
  local mine = '@' .. KEYS[2]
  local j = 0
  for i = 1, #f, 2 do
    if f[i] ~= '' and string.byte(f[i]) ~= 64 then
      j = j + 1
      local k, v, t = f[i], vs[j], f[i + 1]
      if v == t .. mine or v == t .. mine .. '+' then
        redis.call('PEXPIRE', k, ARGV[2])
        redis.call('PEXPIRE', k .. ':next', ARGV[2])
        redis.call('PEXPIRE', k .. ':h', ARGV[2])
      else
        redis.call('HDEL', KEYS[1], k)
      end
    end
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return r[1]`)

// walks runs the walks of s's lock table, one every sessionPass TTLs,
// until s ended or the backend closes.
func (ss *sessions) walks(s *session) {
	defer ss.wg.Done()
	period := time.Duration(sessionPass * float64(s.ttl))
	t := time.NewTimer(period)
	defer t.Stop()
	for {
		select {
		case <-ss.ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		ended, err := ss.walk(s)
		if ended {
			ss.forget(s)
			return
		}
		if err == nil {
			s.mu.Lock()
			s.horizon = start.Add(sessionSpan * s.ttl)
			s.mu.Unlock()
		}
		ss.resend(s)
		t.Reset(max(0, period-time.Since(start)))
	}
}

// walk walks s's lock table once; ended reports that the session ended.
func (ss *sessions) walk(s *session) (ended bool, err error) {
	ctx, cancel := context.WithTimeout(ss.ctx, s.ttl)
	defer cancel()
	cursor := "0"
	for {
		next, err := ss.b.batch.run(ctx, sessionWalkScript, []string{s.table, s.key}, cursor, ms(sessionSpan*s.ttl), ms((sessionSpan+1)*s.ttl)).Text()
		if err != nil {
			return false, err
		}
		if next == "ended" {
			s.mu.Lock()
			s.ended = true
			s.mu.Unlock()
			return true, nil
		}
		cursor = next
		if cursor == "0" {
			return false, nil
		}
	}
}

// released records the outcome of a release of token's lock lk: known
// (the store answered) or not. A release of unknown outcome may not have
// reached the server, and a lock of a session does not expire by itself
// while the session lives: its walks extend every lock in its table, for
// as long as other leases of the session keep renewing it. So the session
// keeps it pending until a release of it has a known outcome: each walk
// sends the release again (resend), and a release that package lock sends
// again (its cleanup) takes it out as well (see backend.PendingReleases
// for why sending it again is safe). Such a lock is free at the first walk
// that reaches the server after the release, sessionPass TTLs at most
// after the fault ends, or when the session ends.
//
// A release of a doubtful token (its grant's outcome was unknown) buries
// the token once the store answered the release; until then, it counts as
// pending.
func (ss *sessions) released(ctx context.Context, lk, token string, known bool) {
	s := ss.lookup(token)
	if s == nil {
		return
	}
	s.mu.Lock()
	_, doubtful := s.doubtful[token]
	s.mu.Unlock()
	if known && doubtful {
		if err := ss.b.batch.run(ctx, sessionBuryScript, []string{s.table}, token).Err(); err == nil {
			s.mu.Lock()
			delete(s.doubtful, token)
			s.mu.Unlock()
		} else {
			known = false // the next walk sends the release and this again
		}
	}
	s.pending.Record(lk, token, known)
}

// doubt records that a grant for token had an unknown outcome: it may
// still arrive, take a free key and enter the session.
//
// Why its release buries it: without sessions, such a late grant is
// refused while the token's tombstone lives (15s; see Dead tokens in
// redis.go), and after that it takes a lock that expires a TTL later. A
// session would keep that lock for as long as the session lives, since
// its walks extend every lock in its table. So the release of a doubtful
// token also writes the field "@TOKEN" into the session's lock table
// (sessionBuryScript), where the grant scripts look for it (buried): a
// grant for a buried token is refused as for a dead one, for as long as
// the session's table lives, which is longer than the session. The
// fields are few (one per grant of unknown outcome) and go with the
// table; the walks skip them.
func (ss *sessions) doubt(token string) {
	s := ss.lookup(token)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.doubtful == nil {
		s.doubtful = map[string]struct{}{}
	}
	s.doubtful[token] = struct{}{}
}

// sessionBuryScript: KEYS = a session's lock table; ARGV = a token. Buries
// the token (see doubt), unless the table is gone: the session then ended
// long ago, and no grant for it takes anything.
var sessionBuryScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], '@' .. ARGV[1], '')
end
return 1`)

// resend sends the pending releases of s's locks again, one after
// another, within a TTL (see released).
func (ss *sessions) resend(s *session) {
	ls := s.pending.List()
	if len(ls) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ss.ctx, s.ttl)
	defer cancel()
	for _, l := range ls {
		if ctx.Err() != nil {
			return
		}
		ss.b.releaseWith(ctx, l.Key, l.Token, "", "") // records its outcome
	}
}

// forget drops an ended session: its leases' renewals answer as for any
// token of no session of this backend, by their lock (which a script
// finds free: its session key is gone).
func (ss *sessions) forget(s *session) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.byTTL[s.ttl] == s {
		delete(ss.byTTL, s.ttl)
	}
	delete(ss.bySID, s.sid)
}

// close stops the walks. The sessions' keys expire by themselves.
func (ss *sessions) close() {
	ss.mu.Lock()
	ss.stop() // under mu: current starts no walks after it
	ss.mu.Unlock()
	ss.wg.Wait()
}

// The helpers of the single deployment's scripts, so that each rule exists
// once and the scripts read the same in both modes:
//
//   - live(k): the value of lock k, or false when it is free; with
//     sessions, a lock of an ended session is deleted first (see the rule
//     above).
//   - pttl(k, v): the remaining time of lock k, held with value v: the
//     lock key's, or its session key's when that is shorter.
//   - join(v, ttl): before a grant to v: false when v's session ended;
//     otherwise its session lives ttl from now (it begins, when its table
//     does not exist).
//   - span(v, ttl): the expiry of a lock granted to v for ttl.
//   - enter(k, v), leave(k, v): lock k was granted to v, or v let it go:
//     the session's lock table says so (statements of their own line).
//   - alive(v): v's session has not ended.
//
// v may carry the waiters' mark. With sessions, sessionLua defines them as
// functions before the script. Without, plainScript writes each call out
// as the one command (or nothing) it stands for, so that the scripts of
// a backend without sessions run as they did before sessions existed,
// with no function to create per call.
func plainScript(src string) string {
	for _, h := range []struct {
		name string
		out  func(args []string) string
	}{
		{"live", func(a []string) string { return "redis.call('GET', " + a[0] + ")" }},
		{"pttl", func(a []string) string { return "redis.call('PTTL', " + a[0] + ")" }},
		{"join", func([]string) string { return "true" }},
		{"alive", func([]string) string { return "true" }},
		{"buried", func([]string) string { return "false" }},
		{"span", func(a []string) string { return a[1] }},
		{"enter", func([]string) string { return "" }},
		{"leave", func([]string) string { return "" }},
	} {
		src = expandCalls(src, h.name, h.out)
	}
	// Drop the lines the statements left empty.
	var out []string
	for _, line := range strings.Split(src, "\n") {
		if strings.TrimSpace(line) != "" || line == "" {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// expandCalls replaces each call name(args) in src, name not part of a
// longer identifier, with out(args): args split at the commas outside
// brackets and parentheses, trimmed. A call without its closing
// parenthesis is a programming error: it panics, at package init.
func expandCalls(src, name string, out func([]string) string) string {
	var b strings.Builder
	for {
		i := strings.Index(src, name+"(")
		if i < 0 {
			b.WriteString(src)
			return b.String()
		}
		if i > 0 && isIdent(src[i-1]) {
			b.WriteString(src[:i+len(name)])
			src = src[i+len(name):]
			continue
		}
		b.WriteString(src[:i])
		depth, start := 0, i+len(name)+1
		var args []string
		j := start
		for ; j < len(src); j++ {
			switch src[j] {
			case '(', '[':
				depth++
			case ')', ']':
				depth--
			case ',':
				if depth == 0 {
					args = append(args, strings.TrimSpace(src[start:j]))
					start = j + 1
				}
			}
			if depth < 0 {
				break
			}
		}
		if j == len(src) {
			panic("redis: unclosed call of " + name + " in a script")
		}
		args = append(args, strings.TrimSpace(src[start:j]))
		b.WriteString(out(args))
		src = src[j+1:]
	}
}

func isIdent(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

var sessionLua = `
local function sessionOf(v)
  if not v then return nil end
  local at = string.find(v, '@', 1, true)
  if not at then return nil end
  local s = string.sub(v, at + 1)
  if string.byte(s, -1) == 43 then s = string.sub(s, 1, -2) end
  return s, string.sub(v, 1, at - 1)
end
local function live(k)
  local v = redis.call('GET', k)
  if v then
    local s = sessionOf(v)
    if s and redis.call('EXISTS', s) == 0 then
      redis.call('DEL', k, k .. ':next', k .. ':h')
      return false
    end
  end
  return v
end
local function pttl(k, v)
  local p = redis.call('PTTL', k)
  local s = v and sessionOf(v)
  if s then
    local q = redis.call('PTTL', s)
    if q < p then p = q end
  end
  return p
end
local function join(v, ttl)
  local s = sessionOf(v)
  if not s then return true end
  if redis.call('PEXPIRE', s, ttl) == 1 then return true end
  if redis.call('EXISTS', s .. ':locks') == 1 then return false end
  redis.call('SET', s, '1', 'PX', ttl)
  redis.call('HSET', s .. ':locks', '', '')
  redis.call('PEXPIRE', s .. ':locks', ` + fmt.Sprint(sessionSpan+1) + ` * ttl)
  return true
end
local function span(v, ttl)
  if sessionOf(v) then return ` + fmt.Sprint(sessionSpan) + ` * ttl end
  return ttl
end
local function enter(k, v)
  local s, t = sessionOf(v)
  if s then redis.call('HSET', s .. ':locks', k, t) end
end
local function leave(k, v)
  local s = sessionOf(v)
  if s then redis.call('HDEL', s .. ':locks', k) end
end
local function alive(v)
  local s = sessionOf(v)
  return not s or redis.call('EXISTS', s) == 1
end
local function buried(v)
  local s, t = sessionOf(v)
  return s ~= nil and redis.call('HEXISTS', s .. ':locks', '@' .. t) == 1
end
`

// scriptSet is the single deployment's scripts in one mode.
type scriptSet struct {
	acquire, renew, transfer, inspect, placeAcquire, queueRelease, refresh, setIfHeld *goredis.Script
}

var (
	plainScripts   = &scriptSet{acquireScript, renewScript, transferScript, inspectScript, placeAcquireScript, queueReleaseScript, refreshScript, setIfHeldScript}
	sessionScripts = newScriptSet(func(src string) string { return sessionLua + src })
)

func newScriptSet(mode func(string) string) *scriptSet {
	return &scriptSet{
		acquire:      goredis.NewScript(mode(acquireLua)),
		renew:        goredis.NewScript(mode(renewLua)),
		transfer:     goredis.NewScript(mode(transferLua)),
		inspect:      goredis.NewScript(mode(inspectLua)),
		placeAcquire: goredis.NewScript(mode(placeAcquireLua)),
		queueRelease: goredis.NewScript(mode(queueReleaseLua)),
		refresh:      goredis.NewScript(mode(refreshLua)),
		setIfHeld:    goredis.NewScript(mode(setIfHeldLua)),
	}
}

// sessionsRefused says why the backend's options and client allow no
// sessions, or returns nil.
func sessionsRefused(rdb Conn, o options) error {
	switch {
	case !o.sessions:
		return nil
	case o.slotFences:
		return fmt.Errorf("%w: redis: sessions (WithSessions) and slot fence counters (WithSlotFenceCounters) do not go together; choose one", backend.ErrInvalid)
	case strings.ContainsAny(o.prefix, " @"):
		return fmt.Errorf("%w: redis: with sessions (WithSessions), the key prefix %q may hold neither a space nor '@'", backend.ErrInvalid, o.prefix)
	}
	if _, ok := rdb.(*goredis.Client); !ok {
		return fmt.Errorf("%w: redis: sessions (WithSessions) need a *goredis.Client (one server, or Sentinel), not a %T: a session's scripts reach keys of many hash slots", backend.ErrInvalid, rdb)
	}
	return nil
}
