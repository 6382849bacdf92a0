package etcd_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/lock"
	"github.com/distlock/lock/etcd"
)

// A backend over the application's own etcd client. (No output: the
// example needs an etcd server on localhost:2379.)
func ExampleNew() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	b, err := etcd.New(cli, etcd.WithPrefix("myapp/locks/"))
	if err != nil {
		log.Fatal(err)
	}
	locks, err := lock.New(b) // locks.Close closes b, not cli
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	ctx := context.Background()
	err = locks.Do(ctx, "invoice:7", func(ctx context.Context, l *lock.Lease) error {
		// The fence is an etcd revision: a resource that remembers the
		// newest fence it saw refuses writes from an older holder.
		fmt.Println("charging with fence", l.Fence())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// The same from a URL: the backend builds its client and closes it.
func Example_open() {
	ctx := context.Background()
	locks, err := lock.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379?prefix=myapp/locks/&ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	l, err := locks.TryAcquire(ctx, "job:nightly-report")
	if err != nil {
		log.Fatal(err) // errors.Is(err, lock.ErrLocked): another replica runs it
	}
	defer l.Release(ctx)
}
