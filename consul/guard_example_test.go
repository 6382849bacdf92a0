package consul_test

import (
	"context"
	"errors"
	"log"

	"github.com/hashicorp/consul/api"

	"github.com/distlock/lock"
	"github.com/distlock/lock/consul"
)

// A write to Consul's KV store that lands only while the lock is held.
func ExampleBackend_TxnIfHeld() {
	ctx := context.Background()
	c, err := lock.Open(ctx, "consul://127.0.0.1:8500")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	b := c.Backend().(*consul.Backend)

	l, err := c.Acquire(ctx, "reports/daily")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)

	// ... build the report, then publish it while still holding the lock:
	_, err = b.TxnIfHeld(ctx, l, api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: "reports/daily/latest", Value: []byte("2024-06-01")}},
	})
	switch {
	case errors.Is(err, lock.ErrNotHeld):
		log.Print("the lock was lost before the write: nothing was written")
	case err != nil:
		log.Fatal(err)
	}
}
