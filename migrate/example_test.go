package migrate_test

import (
	"context"
	"fmt"

	"github.com/distlock/lock"
	"github.com/distlock/lock/memory"
	"github.com/distlock/lock/migrate"
)

// A deployment moves from one store to another in four phases; each phase
// is rolled out to every instance before the next starts. Here every
// phase takes the same key once: the fences keep growing, and from phase
// 3 on they carry epoch 1, above every fence of the old store.
func Example() {
	ctx := context.Background()
	from, to := memory.NewStore(), memory.NewStore()
	for phase := migrate.FromOnly; phase <= migrate.ToOnly; phase++ {
		locks, err := migrate.NewClient(migrate.Config{From: from.NewBackend(), To: to.NewBackend(), Phase: phase})
		if err != nil {
			fmt.Println(err)
			return
		}
		err = locks.Do(ctx, "invoice:7", func(ctx context.Context, l *lock.Lease) error {
			fmt.Printf("phase %v: epoch %d\n", phase, l.Fence()>>lock.FenceEpochShift)
			return nil
		})
		if err != nil {
			fmt.Println(err)
		}
		locks.Close()
	}
	// Output:
	// phase 1 (from only): epoch 0
	// phase 2 (both stores, from's fences): epoch 0
	// phase 3 (both stores, to's fences at epoch+1): epoch 1
	// phase 4 (to only, epoch+1): epoch 1
}

// The same phases by URL: the from and to URLs of stores registered in
// lock's URL registry, and the phase.
func Example_url() {
	ctx := context.Background()
	locks, err := lock.Open(ctx, "migrate://?from=mem://example-old&to=mem://example-new&phase=3")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()
	l, err := locks.TryAcquire(ctx, "invoice:7")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Release(ctx)
	from, to, _ := migrate.Stores(locks.Backend())
	held := func(b any) bool {
		h, _ := b.(*memory.Backend).Inspect(ctx, "invoice:7")
		return h.Held
	}
	fmt.Println("held on from:", held(from), "on to:", held(to), "epoch:", l.Fence()>>lock.FenceEpochShift)
	// Output: held on from: true on to: true epoch: 1
}
