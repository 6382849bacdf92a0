package faultproxy

import (
	"context"
	"testing"

	"github.com/distlock/lock/memory"
)

func TestHooksActOnTheBackendsProxies(t *testing.T) {
	ctx := context.Background()
	var h Hooks
	a, b := memory.New(), memory.New()
	defer a.Close()
	defer b.Close()
	s := startServer(t)
	p := Start(t, s.ln.Addr().String())
	h.Add(a, p)
	if err := h.Disconnect(ctx, b); err == nil {
		t.Fatal("Disconnect of a backend never added: nil error; want one that says so")
	}
	c := dial(t, p.Addr)
	c.roundTrip(t, s, "up")
	if err := h.Disconnect(ctx, a); err != nil {
		t.Fatal(err)
	}
	c.send(t, "held")
	s.expectNothing(t)
	if err := h.Reconnect(ctx, a); err != nil {
		t.Fatal(err)
	}
	s.expectGot(t, "held")
	c.expect(t, "held")
	if err := h.HoldReplies(ctx, a); err != nil {
		t.Fatal(err)
	}
	c.send(t, "reply held")
	s.expectGot(t, "reply held")
	if err := h.DeliverReplies(ctx, a); err != nil {
		t.Fatal(err)
	}
	c.expect(t, "reply held")
	h.Forget(a)
	if err := h.HoldReplies(ctx, a); err == nil {
		t.Fatal("HoldReplies after Forget: nil error; want one")
	}
}
