package pgbackend

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Schema is the SQL that CreateSchema runs: two tables and the two
// functions that serialise a key's grants and releases. The package doc
// explains each part.
const Schema = `
-- One row per key ever locked. It is never deleted, so that its fence
-- counter survives idle gaps and restarts; token, label and expires
-- describe the holder, and are NULL while the key is free.
CREATE TABLE IF NOT EXISTS distlock_locks (
	key     bytea PRIMARY KEY,          -- the key's bytes: bytea takes NUL
	fence   bigint NOT NULL DEFAULT 0,  -- the last fence granted
	token   text,                       -- the holder's
	label   text,                       -- the holder's label
	expires timestamptz                 -- the holder's expiry
);

-- One row per released token, kept until dead_until, so that an acquire
-- that arrives after the release of its own token is refused.
CREATE TABLE IF NOT EXISTS distlock_dead_tokens (
	key        bytea NOT NULL,
	token      text NOT NULL,
	freed      boolean NOT NULL,        -- the release freed the lock
	dead_until timestamptz NOT NULL,
	PRIMARY KEY (key, token)
);
CREATE INDEX IF NOT EXISTS distlock_dead_tokens_until ON distlock_dead_tokens (dead_until);

-- distlock_acquire grants k to tok for ttl_us microseconds, in one
-- transaction that holds k's row lock throughout. result is 'granted'
-- (with the fence), 'locked' (with the holder's remaining time) or
-- 'dead' (tok was released before).
CREATE OR REPLACE FUNCTION distlock_acquire(k bytea, tok text, lbl text, ttl_us bigint,
	OUT result text, OUT fence bigint, OUT remaining_us bigint)
LANGUAGE plpgsql AS $$
DECLARE
	r distlock_locks%ROWTYPE;
	now_ timestamptz;
BEGIN
	fence := 0;
	remaining_us := 0;
	-- The row lock first: every request on k waits here for the one
	-- before it to commit.
	INSERT INTO distlock_locks (key) VALUES (k) ON CONFLICT (key) DO NOTHING;
	SELECT * INTO r FROM distlock_locks l WHERE l.key = k FOR UPDATE;
	now_ := clock_timestamp();
	IF EXISTS (SELECT 1 FROM distlock_dead_tokens d
			WHERE d.key = k AND d.token = tok AND d.dead_until > now_) THEN
		result := 'dead';
		RETURN;
	END IF;
	IF r.token IS NOT NULL AND r.expires > now_ AND r.token <> tok THEN
		result := 'locked';
		remaining_us := floor(extract(epoch FROM r.expires - now_) * 1000000);
		RETURN;
	END IF;
	IF r.token = tok AND r.expires > now_ THEN
		fence := r.fence; -- the same acquire again: the same fence
	ELSE
		fence := r.fence + 1;
	END IF;
	UPDATE distlock_locks l SET fence = distlock_acquire.fence, token = tok, label = NULLIF(lbl, ''),
		expires = statement_timestamp() + ttl_us * interval '1 microsecond'
		WHERE l.key = k;
	result := 'granted';
END
$$;

-- distlock_release frees k if tok holds it, and records tok as dead until
-- dead_us microseconds from now, in one transaction that holds k's row
-- lock throughout. result is 'released' when this release or an earlier
-- one of tok freed the lock, 'notheld' otherwise.
CREATE OR REPLACE FUNCTION distlock_release(k bytea, tok text, dead_us bigint, OUT result text)
LANGUAGE plpgsql AS $$
DECLARE
	r distlock_locks%ROWTYPE;
	now_ timestamptz;
	freed_now boolean := false;
	freed_ever boolean;
BEGIN
	INSERT INTO distlock_locks (key) VALUES (k) ON CONFLICT (key) DO NOTHING;
	SELECT * INTO r FROM distlock_locks l WHERE l.key = k FOR UPDATE;
	now_ := clock_timestamp();
	IF r.token = tok AND r.expires > now_ THEN
		UPDATE distlock_locks l SET token = NULL, label = NULL, expires = NULL WHERE l.key = k;
		-- Delivered to the listeners when the transaction commits.
		PERFORM pg_notify('distlock_released', encode(k, 'hex'));
		freed_now := true;
	END IF;
	INSERT INTO distlock_dead_tokens AS d (key, token, freed, dead_until)
		VALUES (k, tok, freed_now, now_ + dead_us * interval '1 microsecond')
		ON CONFLICT (key, token) DO UPDATE
		SET freed = excluded.freed OR (d.freed AND d.dead_until > now_), dead_until = excluded.dead_until
		RETURNING d.freed INTO freed_ever;
	-- Sweep a few tombstones past their time, of any key: each release
	-- adds one and removes up to eight, so they cannot pile up.
	DELETE FROM distlock_dead_tokens d WHERE (d.key, d.token) IN (
		SELECT o.key, o.token FROM distlock_dead_tokens o WHERE o.dead_until < now_
		ORDER BY o.dead_until LIMIT 8 FOR UPDATE SKIP LOCKED);
	result := CASE WHEN freed_ever THEN 'released' ELSE 'notheld' END;
END
$$;
`

// Beginner begins transactions: a *pgxpool.Pool or a *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// CreateSchema creates the tables and functions of Schema, if they are
// not there yet, in one transaction that takes a transaction-level
// advisory lock first, so that clients starting together do not trip
// over each other. Run it once before New, as a migration would.
func CreateSchema(ctx context.Context, db Beginner) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgbackend: schema: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('distlock_schema'))`); err != nil {
		return fmt.Errorf("pgbackend: schema: %w", err)
	}
	if _, err := tx.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("pgbackend: schema: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgbackend: schema: %w", err)
	}
	return nil
}
