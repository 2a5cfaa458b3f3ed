-- receiver: the partitioned layout of the PostgreSQL ledger (receiver/_store/partitions.py).
-- Blocks start with "-- name: NAME". A block without parameters may hold several statements
-- (it runs as one script); {placeholders} are identifiers the module has checked.
--
-- receiver_receipts becomes a table partitioned by LIST (bucket): each partition holds the
-- receipts first claimed while it was the newest (the current one). Uniqueness of the key stays
-- global without the partition key in it: receiver_receipt_keys, one narrow row per receipt,
-- is the arbiter, filled by the BEFORE INSERT trigger; a claim that loses its key there inserts
-- nothing, exactly as ON CONFLICT DO NOTHING does on the single table. Every statement of
-- queries.postgresql.sql runs unchanged on either layout.
-- The functions run as their owner (SECURITY DEFINER, search path pinned), so that the ledger's
-- role (docs/how-to/postgresql.md, "Privileges") needs no privilege on the key table and no DDL
-- for the sweep to open and drop partitions.
-- Not for sharded engines (triggers, functions, DDL in the sweep): this is the layout of one
-- PostgreSQL, whose expiry drops a partition instead of deleting its rows one by one.

-- name: layout
SELECT c.relkind = 'p' AS partitioned
FROM pg_class c
WHERE c.oid = to_regclass('receiver_receipts');

-- name: partition
-- The conversion, in the caller's transaction. The existing table becomes partition 0 as it
-- is: no rewrite, its indexes are attached to the partitioned table's as they are, its primary
-- key stays (a partition's own uniqueness); the cost is one scan to check that its rows belong
-- to partition 0 and one pass to copy the keys into the key table. New claims go to partition 1.
ALTER TABLE receiver_receipts RENAME TO receiver_receipts_p0;
ALTER INDEX receiver_receipts_pkey RENAME TO receiver_receipts_p0_pkey;
-- A constant default: no rewrite (PostgreSQL 11 and later).
ALTER TABLE receiver_receipts_p0 ADD COLUMN bucket bigint NOT NULL DEFAULT 0;

-- The partitions, newest last; the newest is the current one (where claims go).
CREATE TABLE receiver_partitions (
    bucket    bigint      PRIMARY KEY,
    opened_at timestamptz NOT NULL
);
GRANT SELECT ON receiver_partitions TO PUBLIC;
INSERT INTO receiver_partitions (bucket, opened_at)
VALUES (0, statement_timestamp()), (1, statement_timestamp());

CREATE FUNCTION receiver_receipts_bucket() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$ SELECT max(bucket) FROM receiver_partitions $$;

CREATE TABLE receiver_receipts
    (LIKE receiver_receipts_p0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY LIST (bucket);
ALTER TABLE receiver_receipts ALTER COLUMN bucket SET DEFAULT receiver_receipts_bucket();

-- name: rename_index
-- {name}: one of the single table's indexes, now partition 0's: its name goes to the
-- partitioned table's copy of it, built before partition 0 is attached, so that ATTACH adopts
-- this one instead of building another.
ALTER INDEX {name} RENAME TO {renamed};

-- name: partition_keys
-- The arbiter. bucket says which partition holds the receipt; keys are appended in claim order,
-- so a partition's keys lie together and a BRIN index finds them for the drop.
CREATE TABLE receiver_receipt_keys (
    provider   text   NOT NULL,
    webhook_id text   NOT NULL,
    bucket     bigint NOT NULL
);
INSERT INTO receiver_receipt_keys (provider, webhook_id, bucket)
SELECT provider, webhook_id, 0 FROM receiver_receipts_p0;
ALTER TABLE receiver_receipt_keys ADD PRIMARY KEY (provider, webhook_id);
CREATE INDEX receiver_receipt_keys_bucket ON receiver_receipt_keys USING brin (bucket);

-- A receipt is inserted only if its key is: the key's unique index waits for a concurrent
-- claim of the same key to end, and a key already there skips the row (RETURN NULL), so the
-- claim's RETURNING is empty, as with ON CONFLICT DO NOTHING. While the sweep moves a
-- receipt that is still kept out of a partition it drops (receiver.moving), the key follows it.
CREATE FUNCTION receiver_receipts_claim_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF current_setting('receiver.moving', true) = 'on' THEN
        UPDATE receiver_receipt_keys SET bucket = NEW.bucket
        WHERE provider = NEW.provider AND webhook_id = NEW.webhook_id;
        RETURN NEW;
    END IF;
    INSERT INTO receiver_receipt_keys (provider, webhook_id, bucket)
    VALUES (NEW.provider, NEW.webhook_id, NEW.bucket)
    ON CONFLICT (provider, webhook_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;

-- A receipt deleted (the console, a test's clean-up) gives its key back.
CREATE FUNCTION receiver_receipts_free_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF current_setting('receiver.moving', true) IS DISTINCT FROM 'on' THEN
        DELETE FROM receiver_receipt_keys
        WHERE provider = OLD.provider AND webhook_id = OLD.webhook_id AND bucket = OLD.bucket;
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION receiver_receipts_free_keys() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    TRUNCATE receiver_receipt_keys;
    RETURN NULL;
END
$$;

CREATE TRIGGER receiver_receipts_claim_key BEFORE INSERT ON receiver_receipts
    FOR EACH ROW EXECUTE FUNCTION receiver_receipts_claim_key();
CREATE TRIGGER receiver_receipts_free_key AFTER DELETE ON receiver_receipts
    FOR EACH ROW EXECUTE FUNCTION receiver_receipts_free_key();
CREATE TRIGGER receiver_receipts_free_keys AFTER TRUNCATE ON receiver_receipts
    FOR EACH STATEMENT EXECUTE FUNCTION receiver_receipts_free_keys();

-- The sweep's partition changes, run as the owner by the ledger's role. Whoever may delete
-- receipts may drop a partition of them; nobody else.
CREATE FUNCTION receiver_partitions_allowed() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT has_table_privilege(session_user, 'receiver_receipts', 'DELETE') THEN
        RAISE EXCEPTION 'changing the partitions of receiver_receipts needs DELETE on it'
            USING ERRCODE = '42501';
    END IF;
END
$$;

-- A new partition, created apart and attached: ATTACH takes a lock that claims do not wait on
-- (CREATE TABLE ... PARTITION OF would), and the new partition is empty.
CREATE FUNCTION receiver_open_partition(p_bucket bigint, p_now float8) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    part text := 'receiver_receipts_p' || p_bucket;
BEGIN
    PERFORM receiver_partitions_allowed();
    EXECUTE format('CREATE TABLE %I (LIKE receiver_receipts INCLUDING DEFAULTS '
                   'INCLUDING CONSTRAINTS)', part);
    EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (provider, webhook_id)', part);
    EXECUTE format('ALTER TABLE receiver_receipts ATTACH PARTITION %I FOR VALUES IN (%s)',
                   part, p_bucket);
    INSERT INTO receiver_partitions (bucket, opened_at) VALUES (p_bucket, to_timestamp(p_now));
END
$$;

-- From here on, a row of the partition can only stay expired as of p_now (a dead letter: as
-- of p_now less the retention): a redelivery that would claim one of its receipts again (or an
-- operator's re-run) fails and is retried after the drop, when its key is free. Every
-- transaction that could have changed a row of it has ended when this commits (it waits for
-- their locks).
CREATE FUNCTION receiver_close_partition(p_bucket bigint, p_now float8, p_retention float8)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    part text := 'receiver_receipts_p' || p_bucket;
BEGIN
    PERFORM receiver_partitions_allowed();
    IF EXISTS (SELECT 1 FROM pg_constraint WHERE conname = part || '_closed') THEN
        RETURN;
    END IF;
    EXECUTE format(
        'ALTER TABLE %I ADD CONSTRAINT %I CHECK ('
        '(state = %L AND expires_at < %L AND expires_at <= to_timestamp(%s))'
        ' OR (state IN (%L, %L) AND expires_at < %L AND expires_at <= to_timestamp(%s))'
        ') NOT VALID',
        part, part || '_closed', 'completed', 'infinity', p_now,
        'failed', 'released', 'infinity', p_now - p_retention);
END
$$;

-- The partition's attempts, its keys, then the partition: the number of receipts dropped.
CREATE FUNCTION receiver_drop_partition(p_bucket bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    gone bigint;
BEGIN
    PERFORM receiver_partitions_allowed();
    DELETE FROM receiver_attempts a
    USING receiver_receipt_keys k
    WHERE k.bucket = p_bucket AND a.provider = k.provider AND a.webhook_id = k.webhook_id;
    DELETE FROM receiver_receipt_keys WHERE bucket = p_bucket;
    GET DIAGNOSTICS gone = ROW_COUNT;
    EXECUTE format('DROP TABLE %I', 'receiver_receipts_p' || p_bucket);
    DELETE FROM receiver_partitions WHERE bucket = p_bucket;
    RETURN gone;
END
$$;

ALTER TABLE receiver_receipts ATTACH PARTITION receiver_receipts_p0 FOR VALUES IN (0);
CREATE TABLE receiver_receipts_p1 PARTITION OF receiver_receipts FOR VALUES IN (1);
ALTER TABLE receiver_receipts_p1 ADD PRIMARY KEY (provider, webhook_id);

-- name: unpartition_columns
-- The receipts' columns but the bucket, in order: the single table gets them all back.
SELECT attname AS name
FROM pg_attribute
WHERE attrelid = 'receiver_receipts'::regclass AND attnum > 0 AND NOT attisdropped
  AND attname <> 'bucket'
ORDER BY attnum;

-- name: receipts_indexes
-- The receipts table's indexes but its primary key (the single table's, or the partitioned
-- table's, written ON ONLY): what a conversion builds again on the other layout.
SELECT c.relname AS name, pg_get_indexdef(i.indexrelid) AS definition
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = 'receiver_receipts'::regclass AND NOT i.indisprimary
ORDER BY c.relname;

-- name: unpartition
-- Back to the single table (schema.sql): every receipt copied, in the caller's transaction.
-- {columns}: the receipts' columns but the bucket (unpartition_columns), checked identifiers.
-- The indexes are built again after it from the partitioned table's (receipts_indexes).
CREATE TABLE receiver_receipts_single
    (LIKE receiver_receipts INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE receiver_receipts_single DROP COLUMN bucket;
INSERT INTO receiver_receipts_single ({columns}) SELECT {columns} FROM receiver_receipts;
DROP TABLE receiver_receipts;
DROP TABLE receiver_receipt_keys, receiver_partitions;
DROP FUNCTION receiver_receipts_bucket(), receiver_receipts_claim_key(),
              receiver_receipts_free_key(), receiver_receipts_free_keys(),
              receiver_open_partition(bigint, float8),
              receiver_close_partition(bigint, float8, float8),
              receiver_drop_partition(bigint), receiver_partitions_allowed();
ALTER TABLE receiver_receipts_single RENAME TO receiver_receipts;
ALTER TABLE receiver_receipts ADD PRIMARY KEY (provider, webhook_id);

-- name: partitions
-- The partitions, oldest first; the last is the current one. due: it has been current for a
-- span ($1 seconds) at $2 (NULL: the database's clock), so the sweep opens a new one. Judged by
-- the ledger's clock, as expiry is.
SELECT bucket,
       bucket = max(bucket) OVER () AND opened_at <= COALESCE(to_timestamp($2::float8),
                                                              statement_timestamp())
           - $1::float8 * interval '1 second' AS due
FROM receiver_partitions
ORDER BY bucket;

-- name: open_partition
SELECT receiver_open_partition($1, $2);

-- name: still_open
-- Whether partition $1 still holds a completed receipt within its window at $2 (NULL: the
-- database's clock): then it is not dropped yet (the bulk of its rows would have to move).
SELECT EXISTS (
    SELECT 1 FROM receiver_receipts
    WHERE bucket = $1 AND state = 'completed' AND expires_at < 'infinity'
      AND expires_at > COALESCE(to_timestamp($2::float8), statement_timestamp())
) AS open;

-- name: move_kept
-- The receipts of partition $1 that expiry keeps at $2 (what delete_expired would not delete:
-- in flight, queued, within the window, a dead letter within its retention of $3 seconds) move
-- to the current partition; their keys follow them (receiver.moving is on around it).
UPDATE receiver_receipts
SET bucket = receiver_receipts_bucket()
WHERE bucket = $1
  AND NOT ((state = 'completed' AND expires_at < 'infinity'
            AND expires_at <= to_timestamp($2::float8))
           OR (state IN ('failed', 'released') AND expires_at < 'infinity'
               AND expires_at <= to_timestamp($2::float8) - $3::float8 * interval '1 second'));

-- name: moving
SELECT set_config('receiver.moving', $1, true) AS moving;

-- name: close_partition
SELECT receiver_close_partition($1, $2, $3);

-- name: drop_partition
SELECT receiver_drop_partition($1) AS n;

-- name: lock_timeout
-- How long a step that locks the ledger waits for the transactions in progress ($1: e.g. 1s).
SELECT set_config('lock_timeout', $1, true) AS lock_timeout;

-- name: try_lock
-- The sweep's partition steps take turns across replicas (the migration runner's lock is
-- 7241901; this is another).
SELECT pg_try_advisory_xact_lock(7241902) AS locked;

-- name: lock
SELECT pg_advisory_xact_lock(7241902) AS locked;

-- name: lock_receipts
-- A conversion holds the receipts table from its first statement to its commit: the ledger's
-- statements wait for it. Without this, a claim or a completion committed while the rows are
-- copied (going back to the single table) would be lost with the table they were copied from,
-- and the delivery's retry would run its handlers again.
LOCK TABLE receiver_receipts IN ACCESS EXCLUSIVE MODE;

-- name: migration_lock
-- A layout change and a migration never run at once.
SELECT pg_advisory_xact_lock(7241901) AS locked;

-- name: present
SELECT EXISTS (SELECT 1 FROM receiver_partitions WHERE bucket = $1) AS present;

-- name: database_now
SELECT extract(epoch FROM statement_timestamp())::float8 AS now;
