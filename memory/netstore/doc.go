// Package netstore serves a memory.Store over TCP, and is the backend of
// package lock for such a server: a lock store outside the client's
// process.
//
// It is for the tests of package lock, whose paths for stores outside the
// process (the per-client queue of goroutines waiting for one key, the
// handover of a lock between them through backend.Transferer, the cleanup
// of acquires of unknown outcome) need a store with round trips, lost
// replies and requests reordered on the wire, without a Redis; and it is
// an example for backend authors of a small networked backend with every
// optional interface, proved by package conformance through a fault proxy.
// It is not a lock service for production: the store lives in the server's
// memory.
//
//	srv := netstore.Serve(ln, memory.NewStore())
//	defer srv.Close()
//	b, err := netstore.New(srv.Addr().String())
//	...
//	locks, err := lock.New(b)
//
// # Protocol
//
// Every message is a frame: a 4-byte big-endian length, then a body. In a
// body, strings are a uvarint length and bytes, numbers and durations
// (nanoseconds) uvarints, booleans one byte. A request is an op byte and
// its arguments:
//
//	a key token ttl                 Acquire   -> fence ttl
//	n key token ttl                 Renew     -> fence ttl
//	r key token                     Release
//	t key from to ttl fence reserve Transfer  -> fence ttl next
//	i key                           Inspect   -> held token fence remaining
//	w id key                        Watch: wake-ups for key come as pushes
//	u id                            Unwatch
//
// The server runs a connection's requests one at a time and answers them
// in order, so a client may send several before the first reply
// (pipelining). A reply is a kind byte, then its fields: k (ok, then the
// results above), l (locked, then the holder's remaining TTL), h (not
// held), x (transfer refused), v (invalid, then a message), e (failed,
// outcome unknown, then a message). A push, "! id", may come between
// replies: the watch id of that connection may take the key now. A watch
// ends with its unwatch or its connection; either way, the server passes
// the wake-up on to the next watch of the key if the key is free then (an
// unwatch can arrive after the same client's release of the key).
//
// A Backend sends its requests on a small pool of connections in turn, so
// two requests of one client can reach the server in the other order (a
// release overtaking the acquire it undoes, say); the store keeps released
// tokens dead for that (memory.Store.KeepDeadTokens). Its watches share one
// more connection; when that one dies every watch is woken, and registered
// again on a new one.
//
// # Guarantees
//
//	what                 | guarantee
//	---------------------|---------------------------------------------------
//	mutual exclusion     | exact: a lock expires TTL after its request
//	                     | reached the server, on the server's clock
//	fence                | one counter per Store, strictly increasing
//	server restart       | everything is in the *memory.Store: a new Server
//	                     | over the same Store (or Store.Restart(KeepData))
//	                     | keeps locks and fences, which is the configuration
//	                     | DurableFence declares; a new Store starts over
//	                     | from fence 1, and a process restart loses all
//	released tokens      | dead for memory.DeadTokenTTL (15s) after their
//	                     | release: an Acquire with one fails with ErrInvalid,
//	                     | a Transfer to one too, a Release again answers as
//	                     | the first did; requests delayed longer than that
//	                     | can take a lock, which then expires after its TTL
//	wake-ups             | a release wakes the longest-waiting watch of the
//	                     | key; a watch that ends while the key is free
//	                     | passes it on; a lost connection wakes its watches
//	                     | and registers them again; expiry wakes no one
//	                     | (package lock's timer finds it)
//	order                | not FIFO: a woken waiter races newcomers; no
//	                     | lock is handed to a waiter (it takes the key with
//	                     | its own request and TTL), so a waiter that died
//	                     | holds nothing
//	maximum TTL          | the server's store's (memory.WithMaxTTL, default
//	                     | 1m), which refuses longer TTLs; declare it with
//	                     | WithMaxTTL so that package lock refuses them first
//	transfer             | refused when an acquire from another owner found
//	                     | the lock held, so that owner gets its chance
//	cancellation         | a call returns when its context ends, with an
//	                     | error wrapping ctx.Err(); its request may still
//	                     | take effect, as on any network
package netstore
