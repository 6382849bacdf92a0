package faultproxy

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/distlock/lock/backend"
)

// Hooks gives a conformance harness its network hooks (conformance's
// Disconnecter, ReplyHolder, Delayer and ConnResetter) from the proxies of each backend: register
// a backend's proxies with Add when the harness makes it, and Forget them
// when it closes. Embed a Hooks in a harness; its zero value is ready.
type Hooks struct {
	mu      sync.Mutex
	proxies map[backend.Backend][]*Proxy
}

// Add records that b reaches its store through ps.
func (h *Hooks) Add(b backend.Backend, ps ...*Proxy) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.proxies == nil {
		h.proxies = map[backend.Backend][]*Proxy{}
	}
	h.proxies[b] = append(h.proxies[b], ps...)
}

// Forget drops b's proxies (call it from b's Close).
func (h *Hooks) Forget(b backend.Backend) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.proxies, b)
}

// each applies f to b's proxies; a backend the harness did not register is
// an error.
func (h *Hooks) each(b backend.Backend, f func(*Proxy)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	ps, ok := h.proxies[b]
	if !ok {
		return fmt.Errorf("faultproxy: no proxies registered for the backend %T (Hooks.Add it when the harness makes it)", b)
	}
	for _, p := range ps {
		f(p)
	}
	return nil
}

// Disconnect holds every byte between b and its store (Proxy.Cut).
func (h *Hooks) Disconnect(_ context.Context, b backend.Backend) error {
	return h.each(b, (*Proxy).Cut)
}

// Reconnect delivers what Disconnect held (Proxy.Heal).
func (h *Hooks) Reconnect(_ context.Context, b backend.Backend) error {
	return h.each(b, (*Proxy).Heal)
}

// HoldReplies holds the store's replies to b; requests still reach it.
func (h *Hooks) HoldReplies(_ context.Context, b backend.Backend) error {
	return h.each(b, func(p *Proxy) { p.Hold(ToClient) })
}

// DeliverReplies delivers the replies HoldReplies held.
func (h *Hooks) DeliverReplies(_ context.Context, b backend.Backend) error {
	return h.each(b, func(p *Proxy) { p.Deliver(ToClient) })
}

// DropReplies drops the replies HoldReplies held: it resets b's
// connections, which go with them, and lets later replies through.
func (h *Hooks) DropReplies(_ context.Context, b backend.Backend) error {
	return h.each(b, func(p *Proxy) {
		p.Reset()
		p.Deliver(ToClient)
	})
}

// All applies f to the proxies of every registered backend (to reset every
// connection when the store restarts, say).
func (h *Hooks) All(f func(*Proxy)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ps := range h.proxies {
		for _, p := range ps {
			f(p)
		}
	}
}

// Delay delays b's traffic by d both ways (conformance.Delayer).
func (h *Hooks) Delay(_ context.Context, b backend.Backend, d time.Duration) error {
	return h.each(b, func(p *Proxy) { p.Delay(Both, d) })
}

// DelayOneLink delays the traffic of the first proxy registered for b by
// d both ways, and none of the others (conformance.LinkDelayer): a client
// that reaches the store through several proxies (two endpoints of one
// member, say) then sees requests on its other links overtake those on
// the first. Undelay ends it.
func (h *Hooks) DelayOneLink(_ context.Context, b backend.Backend, d time.Duration) error {
	first := true
	return h.each(b, func(p *Proxy) {
		if first {
			p.Delay(Both, d)
			first = false
		}
	})
}

// Undelay ends Delay and DelayOneLink for b.
func (h *Hooks) Undelay(_ context.Context, b backend.Backend) error {
	return h.each(b, func(p *Proxy) { p.Delay(Both, 0) })
}

// ResetConns resets b's open connections (conformance.ConnResetter).
func (h *Hooks) ResetConns(_ context.Context, b backend.Backend) error {
	return h.each(b, (*Proxy).Reset)
}
