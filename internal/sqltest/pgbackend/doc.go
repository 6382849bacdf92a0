// Package pgbackend is a worked example for backend authors: a lock
// backend on PostgreSQL, written against the public contract of package
// backend alone, and proved with package conformance. It lives in this
// repository's tests so that CI keeps it passing. It is an example, not a
// supported backend.
//
// Read this guide beside the code. The sections go in the order an author
// meets the problems: schema.go holds the SQL, pgbackend.go the four
// calls of the contract and Inspect, notify.go the wake-ups, and
// conformance_test.go the harness that runs the suite.
//
// Using it:
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/app")
//	err = pgbackend.CreateSchema(ctx, pool) // once, as a migration
//	b, err := pgbackend.New(pool)
//	locks, err := lock.New(b)
//
// # What a backend does
//
// A backend does one atomic step per call, and nothing else. Package lock
// retries, waits, renews and measures validity, once for every backend.
// Here every call is one statement: a call of a SQL function (Acquire,
// Release) or one UPDATE (Renew). One statement is one transaction, and
// one round trip once pgx has prepared it on the connection. No call
// leaves a transaction open when its caller gives up.
//
// # 1. The schema
//
// Two tables (schema.go).
//
// distlock_locks has one row per key. The row holds the holder's token,
// its label and its expiry, and the key's fence counter. The row is never
// deleted: a release or an expiry clears the holder and keeps the
// counter. So fences keep rising across idle gaps, however long, and
// across restarts, since the counter is an ordinary committed column. The
// cost is one small row per key ever locked. (A store with an unbounded
// key space could delete free rows instead, and take fences from one
// sequence for all keys. Then it needs another way to serialise a key
// that has no row, such as pg_advisory_xact_lock on a hash of the key.)
//
// distlock_dead_tokens has one row per released token: its tombstone.
// Section 5 says why it exists.
//
// # 2. One step per key: the row lock
//
// Every promise of the contract is about one key. Two requests on the
// same key must not interleave, and requests on different keys should not
// wait for each other. A row lock gives exactly that.
//
// distlock_acquire and distlock_release both start the same way: insert
// the key's row if it is missing (ON CONFLICT DO NOTHING), then lock it
// with SELECT ... FOR UPDATE. Everything after that runs while the
// function holds the row lock, until its transaction commits. The next
// request on the key waits at the SELECT ... FOR UPDATE. It then reads
// the row as the previous request committed it. Under READ COMMITTED,
// each statement in a PL/pgSQL function takes a new snapshot, so the
// statements after the lock see every change committed before it.
//
// Why not two plain statements? Under READ COMMITTED, "check, then
// write" races. Take a late acquire and the release that undoes it. The
// acquire reads the tombstones and finds none. The release then frees the
// key and writes the tombstone. The acquire then grants the key to a dead
// token. Nobody will ever release that lock. With the row lock, the
// release waits for the acquire's whole step, or the acquire waits for
// the release's whole step. Either order is safe. The same holds for two
// acquires: the second sees the first one's grant and answers ErrLocked.
// Drop the FOR UPDATE and MutualExclusion fails at once, with several
// holders of one key; CancelUnderLoad and GiveUpUnderLoad look for late
// acquires that beat their release. SERIALIZABLE isolation serialises
// too, but its conflicts end in serialization failures, which the backend
// would have to turn into answers of the contract. A row lock simply
// waits.
//
// Renew needs no function: one UPDATE with the holder check in its WHERE
// clause. The UPDATE takes the row lock itself, and re-checks the WHERE
// clause on the newest row version after it waited.
//
// # 3. Time
//
// A store expires locks by its own clock. Package lock counts validity
// on the client, from when it sent the request, minus a drift allowance.
// The store must never expire a lock earlier than the TTL after it
// received the request.
//
// PostgreSQL offers three readings of the server's wall clock:
//
//   - now() is the start of the transaction. It stands still while the
//     transaction waits for a row lock. Do not use it to decide whether a
//     lock has expired: after a long wait it answers for the past.
//   - clock_timestamp() is the moment it is called. The functions use it
//     for every check ("is the lock still held?").
//   - statement_timestamp() is when the server received the statement
//     from the client. The functions count the new expiry from it:
//     expires = statement_timestamp() + TTL.
//
// That choice matters for Capabilities. "Received" may be any moment from
// the request's arrival on, but the latest expiry (ExpiryFactor and
// ExpirySlack) counts from the same moment. Counted from
// clock_timestamp(), a request that waited for a row lock would hold the
// lock longer than TTL after the server read it, and ExpirySlack would
// have to cover the longest wait. Counted from statement_timestamp(), the
// lock ends exactly TTL after the server read the request. So the backend declares ExpiryFactor 1 and an ExpirySlack
// of 1ms, for rounding to microseconds. Granularity is 1µs: TTLs are
// rounded up to whole microseconds, never down, and Grant.TTL says so.
// (pgx runs cached prepared statements. statement_timestamp() is then
// when the server read this call's Bind and Execute, not when it first
// prepared the statement. A stale time would make locks expire early,
// and ExpiryNotEarly would fail.)
//
// A lock is held while expires > clock_timestamp(). Nothing deletes an
// expired lock. The next acquire finds it expired and takes the key.
// Inspect and Renew check the expiry too, so an expired lock is free for
// every call at once.
//
// The wall clock is the weak point. If someone steps the server's clock
// forward, every lock expires early. Run the server with a clock that is
// slewed, not stepped, as NTP daemons do once the machine has booted.
//
// MinTTL is 100ms. The server keeps any TTL to the microsecond, but a
// lease renews about every third of its TTL, and each renewal is a round
// trip and a commit. The conformance suite runs its short cases at
// max(MinTTL, 200ms) anyway.
//
// # 4. Keys
//
// A key is up to lock.MaxKeyLen bytes of UTF-8, and it may contain a NUL
// byte. PostgreSQL's text type refuses NUL. So the key column is bytea:
// the key's bytes, compared byte for byte. bytea has no collation, no
// case folding and no Unicode normalisation, so "Case" and "case", or
// the two spellings of é, stay different locks (the KeyShapes case
// checks this). A text column with a non-deterministic collation would
// merge them. Never truncate or hash a key into a shorter column unless
// collisions are impossible.
//
// NOTIFY payloads are text too, so the release notification carries the
// key in hex (section 6).
//
// # 5. Dead tokens
//
// Requests reach the server out of order. When a context ends, pgx
// returns at once, closes its connection and sends the server a cancel
// request. But the statement may already run, or it may still sit in the
// network. Meanwhile package lock sends a cleanup Release for the token,
// on another connection of the pool, and that release can arrive first.
// Without a record of the release, the late acquire would then take the
// key, and nobody would ever release it.
//
// So every Release leaves a tombstone: the key, the token, whether this
// release freed the lock, and dead_until. It does so whether it freed the
// lock or found nothing (ErrNotHeld). Then:
//
//   - an Acquire with a dead token returns an error that wraps
//     backend.ErrInvalid, and changes nothing;
//   - a Release of a token that died holding the lock returns nil again.
//     A release sent again after a lost reply must not make package lock
//     report a lease lost that was held until its release.
//
// Both checks happen under the key's row lock (section 2): the tombstone
// check and the grant are one step, and so are the release and its
// tombstone.
//
// A tombstone lives for backend.MinDeadTokenTTL (15s) by default, and
// WithDeadTokenTTL makes it longer. Choose longer than a request can take
// to reach the server. pgx sends nothing again on its own. But a TCP
// connection cut by a partition delivers its bytes when the partition
// heals, even after pgx closed it. A deployment with long partitions
// should raise the TTL: a tombstone costs one small row for that long.
//
// Old tombstones must go, or the table grows forever. Each release deletes
// up to eight tombstones past their dead_until, of any key, oldest first
// (an index on dead_until finds them). FOR UPDATE SKIP LOCKED keeps two
// releases from waiting on each other's sweeps. Each release adds one
// tombstone and may remove eight, so expired ones cannot pile up. Deleting
// an expired tombstone without the key's row lock is safe: an acquire
// would ignore it anyway.
//
// # 6. Waking waiters: the Notifier
//
// Without a Notifier, a waiting Acquire polls with backoff. With one, it
// sleeps until the key may be free. The rule is progress: after a
// release, at least one waiter that will still try must wake up.
//
// distlock_release calls pg_notify('distlock_released', hex key) when it
// frees a lock. PostgreSQL delivers a notification when its transaction
// commits, so a waiter never wakes before the key is free.
//
// Each backend keeps one listener connection. It takes it from the pool
// and keeps it (pgxpool's Hijack), since a LISTEN belongs to a session.
// The listener starts with the first Watch and runs until Close. Watch
// returns only once the listener is listening, so every release committed
// after Watch returns reaches it. Each notification wakes every watch of
// its key. Waking all keeps the progress rule without more work: a
// watcher that leaves passes nothing on. When the listener's connection
// fails, it connects again, with a backoff of up to a second, and then
// wakes every watch, since a release may have gone unheard meanwhile.
// Expiry wakes nobody. That is allowed: package lock bounds each wait by
// the holder's remaining TTL, which ErrLocked reports.
//
// Every listener hears every release in the database. For many
// backends and busy keys, LISTEN on several channels, chosen by a hash of
// the key.
//
// # 7. The harness
//
// conformance_test.go runs the whole suite, with conformance.RequireHooks
// so that no case is skipped unnoticed. It is all the glue a backend
// author writes, in fewer than 120 lines of code:
//
//   - The server: initdb runs first, as the user nobody when the test
//     runs as root, since postgres refuses root (package pgtest's InitDB
//     here; elsewhere a few lines of os/exec). Then conformance/serverproc
//     runs postgres on a free port, as the same user. Its Ready asks
//     a real question (a Ping on a new connection). A TCP dial is not
//     enough: PostgreSQL accepts connections while it starts up or
//     recovers, and answers them with an error.
//   - The network hooks: each backend's pool dials through two
//     conformance/faultproxy proxies of its own, and the harness embeds
//     faultproxy.Hooks. That gives Disconnecter, ReplyHolder, Delayer,
//     ConnResetter, and LinkDelayer (with two links per client, requests
//     on one overtake those on the other).
//   - Pauser: serverproc's Stop and Continue. PostgreSQL's backend
//     processes call setsid and so leave the postmaster's process group;
//     serverproc stops every descendant of the main process, not only its
//     group.
//   - Restarter: serverproc's Restart (SIGKILL, then start on the same
//     data directory: crash recovery). A restart that loses data runs
//     initdb again.
//   - Evicter: one UPDATE that ends a lock as its expiry would.
//   - NewBackend returns a wrapper whose Close also closes the pool and the
//     proxies, as a process's exit would. It embeds *Backend, so that the
//     suite still sees Inspector and Notifier.
//   - Capabilities come from the backend itself, so that the harness and
//     the backend cannot disagree (Run checks that they do not).
//   - Left out: RequestCounter (HotKeyRequests counts requests only for a
//     FIFO store), SQLResourcer and ProcessContenders (fault runs only).
//
// # Guarantees
//
//	Fence             strictly increasing per key; a column of the key's row,
//	                  written in the granting transaction
//	After a restart   locks, fences and tombstones survive; locks keep their
//	                  expiry on the server's clock
//	Safe when         fsync, synchronous_commit and full_page_writes on (the
//	                  defaults), and a server clock that is not stepped
//
// DurableFence is true because a grant commits its fence before the reply
// leaves: with synchronous_commit on, the commit waits for the WAL flush.
// With synchronous_commit off, a crash can lose the last grants, and their
// fences would be handed out again. The harness runs with the defaults,
// and FenceAfterRestart kills the server with SIGKILL.
//
// With a standby, only synchronous replication (synchronous_commit =
// remote_apply, say) keeps fences and locks across a failover.
// Asynchronous replication can lose the latest grants.
//
// Capabilities.FIFO is false: waiters race for a freed key.
package pgbackend
