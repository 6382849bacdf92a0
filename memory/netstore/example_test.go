package netstore_test

import (
	"context"
	"fmt"
	"net"

	"github.com/distlock/lock"
	"github.com/distlock/lock/memory"
	"github.com/distlock/lock/memory/netstore"
)

// Serve a store on a loopback port and take a lock through it, as another
// process would.
func Example() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := netstore.Serve(ln, memory.NewStore())
	defer srv.Close()

	b, err := netstore.New(srv.Addr().String())
	if err != nil {
		panic(err)
	}
	locks, err := lock.New(b) // owns b: Close closes it
	if err != nil {
		panic(err)
	}
	defer locks.Close()

	ctx := context.Background()
	l, err := locks.Acquire(ctx, "job")
	if err != nil {
		panic(err)
	}
	fmt.Println("fence:", l.Fence())
	fmt.Println("in process:", locks.Capabilities().InProcess)
	fmt.Println(l.Release(ctx))
	// Output:
	// fence: 1
	// in process: false
	// <nil>
}
