package consul

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock/backend"
)

// A waiter's blocking queries: on its record, which reports a handover to
// it or the record's end, and, for the first waiter, on the lock entry,
// which wakes it when the holder's session ends without a release.

// handoverGrace is how long a waiter that saw the lock entry freed waits
// for a handover before it tries the lock itself.
const handoverGrace = 200 * time.Millisecond

// watchEntry follows the lock entry with blocking queries from index, for
// a waiter that was first in the queue when it queued: when the entry is
// freed without a handover (its holder's session expired or was destroyed,
// or a release of unknown outcome destroyed it), it wakes the waiter, which
// then tries the lock (sleeping out a lock-delay) instead of waiting for
// its timer. It ends when the waiter's session holds the entry, or the
// place closes.
func (p *place) watchEntry(sess string, index uint64) {
	b := p.b
	p.mu.Lock()
	ctx := p.entryCtx()
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.heading = false
		if p.ctx == ctx {
			// The query returned: cancelling closes nothing now.
			p.cancel()
			p.ctx, p.cancel = nil, nil
		}
		p.mu.Unlock()
	}()
	for {
		kv, meta, err := b.cli.KV().Get(p.name, (&api.QueryOptions{WaitIndex: index, WaitTime: waitTime}).WithContext(ctx))
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if sleep(ctx, retryDelay) != nil {
				return
			}
			continue
		}
		if meta.LastIndex == index {
			continue
		}
		index = meta.LastIndex
		p.mu.Lock()
		done := p.closed || p.sess != sess
		p.mu.Unlock()
		switch {
		case done || (kv != nil && kv.Session == sess):
			return
		case kv == nil || kv.Session == "":
			// Freed. A release by this library hands the lock over
			// right after (to this waiter, most likely): wake the
			// waiter only if no handover came meanwhile.
			b.sawFree(p.name)
			time.AfterFunc(handoverGrace, func() {
				p.mu.Lock()
				handed := p.handed != ""
				p.mu.Unlock()
				if !handed {
					p.q.Wake()
				}
			})
		}
	}
}

// watch follows the place's record with blocking queries from index: it
// reports a handover, and wakes the waiter when the record goes or a
// releaser asks it to try.
func (p *place) watch(sess, rec string, index uint64) {
	b := p.b
	defer func() {
		p.mu.Lock()
		p.watching = false
		p.mu.Unlock()
	}()
	for {
		kv, meta, err := b.cli.KV().Get(rec, (&api.QueryOptions{WaitIndex: index, WaitTime: waitTime}).WithContext(b.ctx))
		if b.ctx.Err() != nil {
			return
		}
		if err != nil {
			if sleep(b.ctx, retryDelay) != nil {
				return
			}
			continue
		}
		if meta.LastIndex == index {
			continue // the wait timed out
		}
		index = meta.LastIndex
		p.mu.Lock()
		if p.closed || p.sess != sess || p.rec != rec {
			p.mu.Unlock()
			return
		}
		switch {
		case kv == nil || kv.Session != sess:
			// The record went (the place's own lock deleting it ended
			// the watch above): the session expired or was destroyed.
			// Queue again with a new session, under a new name (the
			// old one is under the session's lock-delay).
			p.goneLocked()
			p.mu.Unlock()
			p.q.Lost()
			return
		case strings.HasPrefix(string(kv.Value), recHanded):
			var v handedValue
			if json.Unmarshal(kv.Value[len(recHanded):], &v) != nil || v.Token == "" {
				p.mu.Unlock()
				continue
			}
			p.mu.Unlock()
			ttl := p.q.TTL()
			if !p.q.Handoff(v.Token, backend.Grant{Fence: kv.ModifyIndex, TTL: ttl}) {
				return
			}
			// Since is the place's latest confirmed renewal (zero until
			// the attempt that queued returns: a pooled session is then
			// renewed before it carries a lock again).
			// A lock of the place's attempt with the same token that
			// landed first (see place.lock) keeps its own grant: the
			// lease has that fence.
			b.mu.Lock()
			if o := b.owned[v.Token]; o == nil || o.fence == 0 {
				b.owned[v.Token] = &owned{key: p.name, session: sess, ttl: ttl, fence: kv.ModifyIndex, renewed: p.q.Refreshed(), rec: rec, next: v.Next}
			}
			b.mu.Unlock()
			p.mu.Lock()
			p.handed = v.Token
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

// entryCtx returns the context of the place's blocking queries on the lock
// entry. p.mu must be held.
func (p *place) entryCtx() context.Context {
	if p.ctx == nil {
		p.ctx, p.cancel = context.WithCancel(p.b.ctx)
	}
	return p.ctx
}
