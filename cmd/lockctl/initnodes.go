package main

import (
	"context"
	"fmt"
	"time"
)

// nodeInitializer is a backend whose nodes wait before their first vote
// unless marked new (redis.Redlock).
type nodeInitializer interface {
	InitNewNodes(ctx context.Context) (int, error)
}

// initNodes marks the nodes of a new Redlock deployment ready, so that its
// first locks do not wait the maximum TTL. Only for nodes that never held a
// lock: a node that came back empty must wait (see redis.Redlock).
func (e *environment) initNodes(ctx context.Context, args []string) int {
	fs := newFlags("init-nodes", "[--backend redlock://... | --backend-file PATH]")
	bf := addBackendFlags(fs, "", ", redlock://...")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if code, ok := e.noArgs(fs); !ok {
		return code
	}
	url, code, ok := e.backend(bf)
	if !ok {
		return code
	}
	locks, code := e.open(ctx, "init-nodes", url)
	if locks == nil {
		return code
	}
	defer locks.Close()
	in, ok := locks.Backend().(nodeInitializer)
	if !ok {
		return e.usageError("init-nodes", "only redlock:// backends have nodes to mark as new")
	}
	ictx, cancel := context.WithTimeout(ctx, 30*time.Second) // a node that does not answer
	defer cancel()
	n, err := in.InitNewNodes(ictx)
	if err != nil {
		e.printf(e.stderr, "lockctl init-nodes: %v\n", err)
		return exitBackend
	}
	fmt.Fprintf(e.stdout, "%d nodes marked new and ready; nodes already ready or waiting were left alone\n", n)
	return exitOK
}
