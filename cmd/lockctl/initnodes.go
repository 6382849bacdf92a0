package main

import (
	"context"
	"fmt"
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
	fs := newFlags("init-nodes", "[--backend redlock://...]")
	backendFlag := fs.String("backend", "", "backend `URL`, redlock://... (default: $LOCK_BACKEND)")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if code, ok := e.noArgs(fs); !ok {
		return code
	}
	locks, code := e.open(ctx, "init-nodes", e.backendURL(*backendFlag, ""))
	if locks == nil {
		return code
	}
	defer locks.Close()
	in, ok := locks.Backend().(nodeInitializer)
	if !ok {
		return e.usageError("init-nodes", "only redlock:// backends have nodes to mark as new")
	}
	n, err := in.InitNewNodes(ctx)
	if err != nil {
		fmt.Fprintf(e.stderr, "lockctl init-nodes: %v\n", msg(err))
		return exitBackend
	}
	fmt.Fprintf(e.stdout, "%d nodes marked new and ready; nodes already ready or waiting were left alone\n", n)
	return exitOK
}
