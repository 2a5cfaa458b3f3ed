-- receiver: the ledger's statements for PostgreSQL (asyncpg).
-- Blocks start with "-- name: NAME"; queries.sqlite.sql defines the same names with the same
-- positional parameters. Times travel as unix seconds (float8) so that the ledger code is the
-- same for both dialects.

-- name: claim
-- The arbiter: one statement, one round trip. If the insert wins, the row says so (claimed,
-- fence 1) and whether the same payload of the same type is already in the window under another
-- webhook-id (key drift: a sender that regenerates ids on retry defeats dedup, or a captured
-- delivery re-sent under a new unsigned id; receiver/_webhooks/resent.py). If it loses, the row
-- is the existing receipt (without its request body). No row at all: the conflicting claim
-- committed after this statement's snapshot was taken; the caller looks the key up again.
-- Time is the database's ($5 NULL) unless the store was given a clock: leases and expiry are
-- never judged by each replica's own clock. $6 and $7 are the lease and the window in seconds;
-- "now" comes back so that the caller decides with the same clock. ON CONFLICT names no
-- arbiter, so that the statement runs on both layouts: the single table's primary key is its
-- only unique index; the partitioned layout's arbiter is its key table, whose trigger skips
-- the row (receiver/_store/sql/layouts/partitioned.postgresql.sql).
WITH t AS (SELECT COALESCE(to_timestamp($5::float8), statement_timestamp()) AS now),
claimed AS (
    INSERT INTO receiver_receipts
        (provider, webhook_id, payload_hash, state, fence, event_type,
         claimed_at, lease_until, expires_at, request_body)
    SELECT $1, $2, $3, 'in_flight', 1, $4,
           t.now, t.now + $6::float8 * interval '1 second',
           t.now + $7::float8 * interval '1 second', $8
    FROM t
    ON CONFLICT DO NOTHING
    RETURNING fence, claimed_at
)
SELECT true AS claimed, c.fence, extract(epoch FROM c.claimed_at)::float8 AS now,
       EXISTS (
           SELECT 1 FROM receiver_receipts d
           WHERE d.provider = $1 AND d.payload_hash = $3 AND d.webhook_id <> $2
             AND d.event_type IS NOT DISTINCT FROM $4 AND d.expires_at > c.claimed_at
       ) AS drift,
       NULL::text AS state, NULL::bytea AS payload_hash, NULL::text AS event_type,
       NULL::float8 AS claimed_at, NULL::float8 AS lease_until, NULL::float8 AS expires_at,
       NULL::float8 AS completed_at, NULL::integer AS response_status,
       NULL::text AS response_content_type, NULL::bytea AS response_body,
       NULL::bytea AS response_headers,
       NULL::bytea AS request_body, NULL::integer AS attempts, NULL::text AS last_error
FROM claimed c
UNION ALL
SELECT false, r.fence, (SELECT extract(epoch FROM t.now)::float8 FROM t), NULL,
       r.state, r.payload_hash, r.event_type,
       extract(epoch FROM r.claimed_at)::float8,
       extract(epoch FROM r.lease_until)::float8,
       extract(epoch FROM r.expires_at)::float8,
       extract(epoch FROM r.completed_at)::float8,
       r.response_status, r.response_content_type, r.response_body, r.response_headers,
       NULL, r.attempts, r.last_error
FROM receiver_receipts r
WHERE r.provider = $1 AND r.webhook_id = $2 AND NOT EXISTS (SELECT 1 FROM claimed);

-- name: lookup
SELECT state, fence, payload_hash, event_type,
       extract(epoch FROM COALESCE(to_timestamp($3::float8), statement_timestamp()))::float8
           AS now,
       extract(epoch FROM claimed_at)::float8 AS claimed_at,
       extract(epoch FROM lease_until)::float8 AS lease_until,
       extract(epoch FROM expires_at)::float8 AS expires_at,
       extract(epoch FROM completed_at)::float8 AS completed_at,
       response_status, response_content_type, response_body, response_headers, request_body,
       attempts, last_error
FROM receiver_receipts
WHERE provider = $1 AND webhook_id = $2;

-- name: reclaim
-- Compare-and-set on the fence seen by the caller: of several callers that saw the same
-- released, lease-expired or expired row, exactly one gets it, with the next fence. A live
-- lease always wins over expiry: an attempt still running is never taken over.
WITH t AS (SELECT COALESCE(to_timestamp($6::float8), statement_timestamp()) AS now)
UPDATE receiver_receipts
SET fence = fence + 1,
    state = 'in_flight',
    attempts = CASE WHEN expires_at <= t.now THEN 0 ELSE attempts END,
    last_error = CASE WHEN expires_at <= t.now THEN NULL ELSE last_error END,
    payload_hash = $4,
    event_type = $5,
    claimed_at = t.now,
    lease_until = t.now + $7::float8 * interval '1 second',
    expires_at = t.now + $8::float8 * interval '1 second',
    request_body = $9,
    completed_at = NULL,
    response_status = NULL,
    response_content_type = NULL,
    response_body = NULL,
    response_headers = NULL
FROM t
WHERE provider = $1 AND webhook_id = $2 AND fence = $3
  AND (state = 'released'
       OR (state = 'in_flight' AND lease_until <= t.now)
       OR (state <> 'in_flight' AND expires_at <= t.now))
RETURNING fence;

-- name: complete
-- The fenced statements say state COLLATE "C" = 'in_flight' (the same test): the predicate of
-- the in-flight partial index is then not implied, so that a generic plan made while the table
-- was empty and never analyzed cannot walk that index and filter by key (it would read every
-- in-flight entry per delivery, a cost that grows with load); the primary key is the way.
-- Fenced: zero rows means a newer claim owns the key and the caller must roll back.
-- Batched completions send this same statement once per receipt, pipelined in one round trip
-- (asyncpg's fetchmany, atomic): an UPDATE ... FROM unnest(...) joins the ledger by key, and
-- its generic plan scanned the whole table for every batch (tests/integration/test_plans.py).
-- The key comes back so that the rows of such a pipeline say which receipts were completed.
UPDATE receiver_receipts
SET state = $4,
    response_status = $5,
    response_content_type = $6,
    response_body = $7,
    response_headers = $9,
    completed_at = COALESCE(to_timestamp($8::float8), statement_timestamp()),
    request_body = CASE WHEN $4 = 'completed' THEN NULL ELSE request_body END
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state COLLATE "C" = 'in_flight'
RETURNING provider, webhook_id, fence;

-- name: release
-- Fenced: give the key back so that the sender's retry runs the handlers again.
UPDATE receiver_receipts
SET state = 'released',
    attempts = attempts + 1,
    last_error = $4,
    lease_until = COALESCE(to_timestamp($5::float8), statement_timestamp())
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state COLLATE "C" = 'in_flight'
RETURNING fence;

-- name: forget
-- Fenced: an attempt that the caller knows did nothing (its writes rolled back, nothing outside
-- began) and whose request must not be remembered, as a request the framework refused before
-- the endpoint ran: the key goes, so that the client's corrected request under it is a new
-- request, not another request under a used key. Its attempts go with it (forget_attempts).
DELETE FROM receiver_receipts
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state COLLATE "C" = 'in_flight'
RETURNING fence;

-- name: forget_attempts
DELETE FROM receiver_attempts WHERE provider = $1 AND webhook_id = $2;

-- name: unresolve
-- Fenced: reconcile() of an interrupted external attempt failed, so what happened outside is
-- still unknown. Never released (a release lets the retry run the external effect again): the
-- key stays in flight with its lease ended, so that the next attempt reconciles again.
UPDATE receiver_receipts
SET attempts = attempts + 1,
    last_error = $4,
    lease_until = COALESCE(to_timestamp($5::float8), statement_timestamp())
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state COLLATE "C" = 'in_flight'
RETURNING fence;

-- name: record_attempt
INSERT INTO receiver_attempts (provider, webhook_id, fence, failed_at, error)
VALUES ($1, $2, $3, COALESCE(to_timestamp($4::float8), statement_timestamp()), $5)
ON CONFLICT (provider, webhook_id, fence)
DO UPDATE SET failed_at = EXCLUDED.failed_at, error = EXCLUDED.error;

-- name: note_failure
-- A receipt marked failed for review keeps its reason, counted as an attempt (fenced).
UPDATE receiver_receipts
SET attempts = attempts + 1,
    last_error = $4
WHERE provider = $1 AND webhook_id = $2 AND fence = $3
RETURNING fence;

-- name: list_attempts
SELECT fence, extract(epoch FROM failed_at)::float8 AS failed_at, error
FROM receiver_attempts
WHERE provider = $1 AND webhook_id = $2
ORDER BY fence;

-- name: same_content
-- The first receipt of provider $1 in the window with the same payload hash ($2) and event type
-- ($4) under another key than $3: the event a delivery repeats (Provider(same_content=...),
-- the console's receipt page). Not a released one: it has no answer, and waits for its own
-- sender's retry. Read through receiver_receipts_payload_hash.
SELECT webhook_id, state, response_status, response_content_type, response_body,
       response_headers
FROM receiver_receipts
WHERE provider = $1 AND payload_hash = $2 AND webhook_id <> $3
  AND event_type IS NOT DISTINCT FROM $4 AND state <> 'released'
  AND expires_at > COALESCE(to_timestamp($5::float8), statement_timestamp())
ORDER BY claimed_at, webhook_id
LIMIT 1;

-- name: legacy_horizon
-- Until when receipts of provider $1 stored under a body-digest key ("sha256:...", the key of
-- GitHub, Shopify and Twilio deliveries before they were keyed on the sender's event id) can
-- still answer a redelivery; NULL when there are none. Read once per process and provider.
SELECT extract(epoch FROM max(expires_at))::float8 AS until,
       extract(epoch FROM COALESCE(to_timestamp($2::float8), statement_timestamp()))::float8
           AS now
FROM receiver_receipts
WHERE provider = $1 AND left(webhook_id, 7) = 'sha256:';

-- name: extend_lease
-- The lease runs $5 seconds from now; the window grows with it if it must (a live lease
-- always wins over expiry anyway).
WITH t AS (
    SELECT COALESCE(to_timestamp($4::float8), statement_timestamp())
           + $5::float8 * interval '1 second' AS until
)
UPDATE receiver_receipts
SET lease_until = t.until,
    expires_at = GREATEST(expires_at, t.until)
FROM t
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state COLLATE "C" = 'in_flight'
RETURNING fence;

-- name: schema_ready
-- For /readyz: the tables are there (reading no row), the session can write (not a standby),
-- and the role holds every privilege the ledger uses.
SELECT current_setting('transaction_read_only') = 'on' AS read_only,
       has_table_privilege('receiver_receipts', 'SELECT')
       AND has_table_privilege('receiver_receipts', 'INSERT')
       AND has_table_privilege('receiver_receipts', 'UPDATE')
       AND has_table_privilege('receiver_receipts', 'DELETE')
       AND has_table_privilege('receiver_attempts', 'SELECT')
       AND has_table_privilege('receiver_attempts', 'INSERT')
       AND has_table_privilege('receiver_attempts', 'UPDATE')
       AND has_table_privilege('receiver_attempts', 'DELETE') AS privileged
FROM (SELECT count(*) FROM receiver_receipts WHERE false) AS schema;

-- name: stale
-- In-flight receipts whose lease ran out: their attempt died or stalled (the sweeper's work).
SELECT provider, webhook_id, state, fence, payload_hash, event_type,
       extract(epoch FROM COALESCE(to_timestamp($1::float8), statement_timestamp()))::float8
           AS now,
       extract(epoch FROM claimed_at)::float8 AS claimed_at,
       extract(epoch FROM lease_until)::float8 AS lease_until,
       extract(epoch FROM expires_at)::float8 AS expires_at,
       extract(epoch FROM completed_at)::float8 AS completed_at,
       response_status, response_content_type, response_body, response_headers, request_body,
       attempts, last_error
FROM receiver_receipts
WHERE state = 'in_flight' AND due_at IS NULL  -- queued receipts are the workers' (queue_stale)
  AND lease_until <= COALESCE(to_timestamp($1::float8), statement_timestamp())
ORDER BY lease_until
LIMIT $2;

-- name: delete_expired
-- What expiry means per state (docs/explanation/ledger.md, "Expiry, by state"): a completed receipt goes when its window ends
-- ($1); a dead letter (failed, or released after a failed attempt) stays for the retention
-- after its window ($2), as the evidence an operator needs; an
-- in-flight receipt is never deleted (its work is unfinished: the sweeper recovers it first).
-- $1 NULL: the database's clock. $2: the retention, seconds. One batch of at most $3 rows, with
-- its attempts: completed receipts first, then dead letters for what is left of the batch, each
-- from its own partial index (0008), so that a batch never walks past the dead letters still
-- kept. SKIP LOCKED: concurrent sweepers (several
-- replicas) take disjoint batches instead of waiting on each other's row locks, and never on a
-- row a delivery is reclaiming. Keyed deletes and data-modifying CTEs, as distributed
-- PostgreSQL-compatible databases support them (no ctid).
WITH completed AS (
    SELECT provider, webhook_id FROM receiver_receipts
    WHERE state = 'completed' AND expires_at < 'infinity'
      AND expires_at <= COALESCE(to_timestamp($1::float8), statement_timestamp())
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), dead AS (
    SELECT provider, webhook_id FROM receiver_receipts
    WHERE state IN ('failed', 'released') AND expires_at < 'infinity'
      AND expires_at <= COALESCE(to_timestamp($1::float8), statement_timestamp())
                        - $2::float8 * interval '1 second'
    LIMIT GREATEST($3 - (SELECT count(*) FROM completed), 0)
    FOR UPDATE SKIP LOCKED
), doomed AS (
    SELECT provider, webhook_id FROM completed
    UNION ALL
    SELECT provider, webhook_id FROM dead
), gone AS (
    DELETE FROM receiver_receipts r
    USING doomed d
    WHERE r.provider = d.provider AND r.webhook_id = d.webhook_id
    RETURNING r.provider, r.webhook_id
), attempts AS (
    DELETE FROM receiver_attempts a
    USING gone g
    WHERE a.provider = g.provider AND a.webhook_id = g.webhook_id
    RETURNING 1
)
SELECT count(*) AS n FROM gone;

-- name: delete_orphan_attempts
DELETE FROM receiver_attempts
WHERE (provider, webhook_id, fence) IN (
    SELECT a.provider, a.webhook_id, a.fence
    FROM receiver_attempts a
    LEFT JOIN receiver_receipts r
        ON r.provider = a.provider AND r.webhook_id = a.webhook_id
    WHERE r.provider IS NULL
    LIMIT $1
)
RETURNING fence;

-- name: list_failed
SELECT provider, webhook_id, state, fence, event_type, attempts, last_error,
       extract(epoch FROM claimed_at)::float8 AS claimed_at,
       extract(epoch FROM completed_at)::float8 AS completed_at
FROM receiver_receipts
WHERE (state = 'failed' OR (state IN ('released', 'queued') AND attempts > 0))
  AND ($1 = '' OR provider = $1)
ORDER BY claimed_at
LIMIT $2;

-- name: oldest_in_flight_by_provider
-- For the metrics' oldest in-flight age; reads only in-flight rows (the partial index).
SELECT provider, extract(epoch FROM min(claimed_at))::float8 AS claimed_at
FROM receiver_receipts
WHERE state = 'in_flight'
GROUP BY provider;

-- name: count_by_provider_state
-- Exact, and it reads the whole table: for small tables only (receiver/_ops/counts.py).
SELECT provider, state, count(*) AS n
FROM receiver_receipts
GROUP BY provider, state;

-- name: count_small_states
-- The states that stay small (in flight, released, failed), counted through their partial
-- indexes (receiver_receipts_in_flight, receiver_receipts_released_failed): the cost follows
-- the number of unfinished receipts, not the size of the table.
SELECT provider, 'in_flight' AS state, count(*) AS n
FROM receiver_receipts
WHERE state = 'in_flight'
GROUP BY provider
UNION ALL
SELECT provider, state, count(*) AS n
FROM receiver_receipts
WHERE state IN ('released', 'failed')
GROUP BY provider, state;

-- name: estimate_by_provider
-- The planner's statistics, not a count: the table's live rows (kept by the statistics system
-- as rows come and go; reltuples, from the last VACUUM or ANALYZE, after a crash reset them)
-- split between providers by the frequencies ANALYZE sampled. Constant cost however large the
-- table; no rows before the table was first analyzed.
SELECT mcv.provider, mcv.freq * t.live AS n, t.live AS total
FROM (
    SELECT n.nspname,
           CASE WHEN pg_stat_get_live_tuples(c.oid) > 0
                THEN pg_stat_get_live_tuples(c.oid)::float8
                ELSE greatest(c.reltuples, 0)::float8 END AS live
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = to_regclass('receiver_receipts')
) t
CROSS JOIN LATERAL (
    SELECT v.provider, v.freq::float8 AS freq
    FROM pg_stats s,
         unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(provider, freq)
    WHERE s.schemaname = t.nspname AND s.tablename = 'receiver_receipts'
      AND s.attname = 'provider'
) mcv;

-- name: reopen
-- Dead-letter replay: give a failed receipt back (fenced), so that the replay reclaims it with
-- the next fence exactly as a sender's retry of a released receipt would.
UPDATE receiver_receipts
SET state = 'released',
    lease_until = COALESCE(to_timestamp($4::float8), statement_timestamp()),
    completed_at = NULL,
    response_status = NULL,
    response_content_type = NULL,
    response_body = NULL,
    response_headers = NULL
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state = 'failed'
RETURNING fence;

-- Queued mode (receiver/_queue/receipts.py). A queued receipt is inserted in state 'queued', due now,
-- with the sender's answer (the 202) already in the response columns: that answer is replayed
-- to every redelivery whatever the processing state, and no worker statement touches it.
-- Until it is finished it never expires (expires_at is infinity); its window starts when a
-- worker finishes it. due_at stays set afterwards: it marks the receipt as a queued one.

-- name: enqueue
-- Ingest micro-batching: the whole batch in one statement (arrays, unnest), one autocommit.
-- Only the rows inserted come back, each with its key drift (the payload already in the window
-- under another webhook-id, as the claim reports it; rows of this same batch are not seen); a
-- key already there (or twice in the batch) is a duplicate the caller looks up. One NOTIFY per
-- batch, and none for a batch of duplicates: NOTIFY takes a cluster-wide lock at commit, which
-- would serialise the committers.
WITH t AS (SELECT COALESCE(to_timestamp($6::float8), statement_timestamp()) AS now),
ins AS (
    INSERT INTO receiver_receipts
        (provider, webhook_id, payload_hash, state, fence, event_type, claimed_at,
         lease_until, expires_at, due_at, request_body,
         response_status, response_content_type, response_body)
    SELECT d.provider, d.webhook_id, d.payload_hash, 'queued', 0, d.event_type, t.now,
           t.now, 'infinity', t.now, d.request_body, $7, $8, $9
    FROM t, unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bytea[])
        AS d(provider, webhook_id, payload_hash, event_type, request_body)
    -- Key order: two batches waiting on each other's keys would otherwise deadlock.
    ORDER BY d.provider, d.webhook_id
    ON CONFLICT DO NOTHING
    RETURNING provider, webhook_id, payload_hash, event_type, claimed_at
),
notified AS (
    SELECT pg_notify('receiver_queue', '') AS n WHERE EXISTS (SELECT 1 FROM ins)
)
SELECT i.provider, i.webhook_id,
       EXISTS (
           SELECT 1 FROM receiver_receipts d
           WHERE d.provider = i.provider AND d.payload_hash = i.payload_hash
             AND d.webhook_id <> i.webhook_id AND d.event_type IS NOT DISTINCT FROM i.event_type
             AND d.expires_at > i.claimed_at
       ) AS drift
FROM ins i
UNION ALL
SELECT NULL, NULL, NULL FROM notified;

-- name: queue_fetch
-- A worker takes up to $2 due receipts: locked with SKIP LOCKED (workers never wait on each
-- other), moved in flight with the next fence and a lease of $3 seconds, in one short
-- statement. An index scan of receiver_receipts_due, however large the table.
WITH due AS (
    SELECT provider, webhook_id
    FROM receiver_receipts
    WHERE state = 'queued'
      AND due_at <= COALESCE(to_timestamp($1::float8), statement_timestamp())
    ORDER BY due_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
t AS (SELECT COALESCE(to_timestamp($1::float8), statement_timestamp()) AS now)
UPDATE receiver_receipts r
SET state = 'in_flight',
    fence = r.fence + 1,
    claimed_at = t.now,
    lease_until = t.now + $3::float8 * interval '1 second'
FROM due, t
WHERE r.provider = due.provider AND r.webhook_id = due.webhook_id
RETURNING r.provider, r.webhook_id, r.fence, r.payload_hash, r.event_type, r.request_body,
          r.attempts, extract(epoch FROM r.due_at)::float8 AS due_at,
          extract(epoch FROM t.now)::float8 AS now;

-- name: queue_complete
-- Fenced, like complete, but the stored answer (the 202) stays: the handlers' result is not
-- the sender's. The window ($6 seconds) starts now. Batched like complete (pipelined).
WITH t AS (SELECT COALESCE(to_timestamp($5::float8), statement_timestamp()) AS now)
UPDATE receiver_receipts
SET state = $4,
    completed_at = t.now,
    lease_until = t.now,
    expires_at = t.now + $6::float8 * interval '1 second',
    request_body = CASE WHEN $4 = 'completed' THEN NULL ELSE request_body END
FROM t
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state COLLATE "C" = 'in_flight'
RETURNING provider, webhook_id, fence;

-- name: queue_retry
-- Fenced: a failed attempt. Due again in $6 seconds, or, after the last attempt ($7 true),
-- failed: a dead letter, kept for its window ($8 seconds) with its body for a replay.
WITH t AS (SELECT COALESCE(to_timestamp($5::float8), statement_timestamp()) AS now)
UPDATE receiver_receipts
SET state = CASE WHEN $7::boolean THEN 'failed' ELSE 'queued' END,
    attempts = attempts + 1,
    last_error = $4,
    lease_until = t.now,
    due_at = CASE WHEN $7::boolean THEN due_at ELSE t.now + $6::float8 * interval '1 second' END,
    completed_at = CASE WHEN $7::boolean THEN t.now END,
    expires_at = CASE WHEN $7::boolean THEN t.now + $8::float8 * interval '1 second'
                      ELSE expires_at END
FROM t
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state COLLATE "C" = 'in_flight'
RETURNING fence;

-- name: queue_reclaim
-- Take over a queued receipt whose worker died or stalled (in flight, lease expired): a
-- compare-and-set on the fence seen, keeping the stored answer.
WITH t AS (SELECT COALESCE(to_timestamp($4::float8), statement_timestamp()) AS now)
UPDATE receiver_receipts
SET fence = fence + 1,
    claimed_at = t.now,
    lease_until = t.now + $5::float8 * interval '1 second'
FROM t
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state COLLATE "C" = 'in_flight'
  AND due_at IS NOT NULL
  -- As a CASE, so that no plan walks receiver_receipts_in_flight by lease instead of the key.
  AND CASE WHEN lease_until <= t.now THEN true ELSE false END
RETURNING fence;

-- name: queue_stale
-- Queued receipts whose worker died or stalled; read through receiver_receipts_in_flight.
SELECT provider, webhook_id, state, fence, payload_hash, event_type,
       extract(epoch FROM COALESCE(to_timestamp($1::float8), statement_timestamp()))::float8
           AS now,
       extract(epoch FROM claimed_at)::float8 AS claimed_at,
       extract(epoch FROM lease_until)::float8 AS lease_until,
       extract(epoch FROM expires_at)::float8 AS expires_at,
       extract(epoch FROM completed_at)::float8 AS completed_at,
       response_status, response_content_type, response_body, response_headers, request_body,
       attempts, last_error
FROM receiver_receipts
WHERE state = 'in_flight' AND due_at IS NOT NULL
  AND lease_until <= COALESCE(to_timestamp($1::float8), statement_timestamp())
ORDER BY lease_until
LIMIT $2;

-- name: queue_requeue
-- A queued delivery whose key's receipt expired (not yet deleted): queue it again, fenced on
-- the fence seen, exactly as a fresh one.
WITH t AS (SELECT COALESCE(to_timestamp($7::float8), statement_timestamp()) AS now)
UPDATE receiver_receipts
SET state = 'queued', payload_hash = $4, event_type = $5, request_body = $6,
    claimed_at = t.now, lease_until = t.now, expires_at = 'infinity', due_at = t.now,
    completed_at = NULL, attempts = 0, last_error = NULL,
    response_status = $8, response_content_type = $9, response_body = $10,
    response_headers = NULL
FROM t
WHERE provider = $1 AND webhook_id = $2 AND fence = $3
  AND (state = 'released'
       OR (state <> 'in_flight' AND state <> 'queued' AND expires_at <= t.now))
RETURNING fence;

-- name: queue_reopen
-- Dead-letter replay of a queued receipt: due now, with a fresh round of attempts (fenced).
WITH t AS (SELECT COALESCE(to_timestamp($4::float8), statement_timestamp()) AS now)
UPDATE receiver_receipts
SET state = 'queued', due_at = t.now, lease_until = t.now, attempts = 0,
    completed_at = NULL, expires_at = 'infinity'
FROM t
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state = 'failed'
  AND due_at IS NOT NULL
RETURNING fence;

-- name: queue_next_due
-- Seconds until the earliest queued receipt is due (<= 0: one is due now; NULL: none queued),
-- so that an idle worker wakes for a retry when it is due, not on its next poll. The first
-- entry of receiver_receipts_due.
SELECT extract(epoch FROM min(due_at) - COALESCE(to_timestamp($1::float8),
                                                 statement_timestamp()))::float8 AS wait
FROM receiver_receipts
WHERE state = 'queued';

-- name: queue_depth
-- For the metrics: queued receipts per provider (due now, and waiting for a retry), and the
-- oldest due one. Reads only queued rows (receiver_receipts_due).
SELECT provider,
       count(*) FILTER (WHERE due_at <= t.now) AS due,
       count(*) FILTER (WHERE due_at > t.now) AS waiting,
       extract(epoch FROM min(due_at) FILTER (WHERE due_at <= t.now))::float8 AS oldest_due,
       extract(epoch FROM t.now)::float8 AS now
FROM receiver_receipts,
     (SELECT COALESCE(to_timestamp($1::float8), statement_timestamp()) AS now) t
WHERE state = 'queued'
GROUP BY provider, t.now;

-- name: queue_release
-- A stopping worker gives back an attempt it cancelled (rolled back): due now, fenced, not
-- counted as a failure.
WITH t AS (SELECT COALESCE(to_timestamp($4::float8), statement_timestamp()) AS now)
UPDATE receiver_receipts
SET state = 'queued', due_at = t.now, lease_until = t.now
FROM t
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state COLLATE "C" = 'in_flight'
  AND due_at IS NOT NULL
RETURNING fence;

-- The micro-batcher's statements (receiver/_ledger/batcher.py). PostgreSQL only: their point is to
-- save round trips, and SQLite, in-process with one writer, has none to save.

-- name: claim_many
-- Many claims in one statement: $1 is the time (NULL: the database's), then one array per
-- column, in the order of the batch. One row back per input, in order: claimed (this input won
-- its key, with fence 1), or the existing receipt, or neither (state NULL: another input of
-- this batch won the key, or a concurrent claim committed after this statement's snapshot; the
-- caller looks it up). Keys are inserted in key order, so concurrent batches never deadlock.
WITH t AS (SELECT COALESCE(to_timestamp($1::float8), statement_timestamp()) AS now),
input AS (
    SELECT *
    FROM unnest($2::text[], $3::text[], $4::bytea[], $5::text[], $6::float8[], $7::float8[],
                $8::bytea[])
        WITH ORDINALITY AS i(provider, webhook_id, payload_hash, event_type, lease, win, body, n)
),
first AS (
    SELECT DISTINCT ON (provider, webhook_id) provider, webhook_id, n
    FROM input
    ORDER BY provider, webhook_id, n
),
claimed AS (
    INSERT INTO receiver_receipts
        (provider, webhook_id, payload_hash, state, fence, event_type,
         claimed_at, lease_until, expires_at, request_body)
    SELECT i.provider, i.webhook_id, i.payload_hash, 'in_flight', 1, i.event_type,
           t.now, t.now + i.lease * interval '1 second', t.now + i.win * interval '1 second',
           i.body
    FROM first f
    JOIN input i ON i.n = f.n
    CROSS JOIN t
    ORDER BY i.provider, i.webhook_id
    ON CONFLICT DO NOTHING
    RETURNING provider, webhook_id, fence
)
SELECT i.n,
       (c.fence IS NOT NULL AND f.n = i.n) AS claimed,
       COALESCE(c.fence, r.fence) AS fence,
       extract(epoch FROM t.now)::float8 AS now,
       CASE WHEN c.fence IS NOT NULL AND f.n = i.n THEN EXISTS (
           SELECT 1 FROM receiver_receipts d
           WHERE d.provider = i.provider AND d.payload_hash = i.payload_hash
             AND d.webhook_id <> i.webhook_id AND d.event_type IS NOT DISTINCT FROM i.event_type
             AND d.expires_at > t.now
       ) END AS drift,
       r.state, r.payload_hash, r.event_type,
       extract(epoch FROM r.claimed_at)::float8 AS claimed_at,
       extract(epoch FROM r.lease_until)::float8 AS lease_until,
       extract(epoch FROM r.expires_at)::float8 AS expires_at,
       extract(epoch FROM r.completed_at)::float8 AS completed_at,
       r.response_status, r.response_content_type, r.response_body, r.response_headers,
       NULL::bytea AS request_body, r.attempts, r.last_error
FROM input i
CROSS JOIN t
JOIN first f ON f.provider = i.provider AND f.webhook_id = i.webhook_id
LEFT JOIN claimed c ON c.provider = i.provider AND c.webhook_id = i.webhook_id
LEFT JOIN receiver_receipts r
    ON c.fence IS NULL AND r.provider = i.provider AND r.webhook_id = i.webhook_id
ORDER BY i.n;


-- console
-- The operator console's statements (receiver/_console/). Its lists walk indexes and stop
-- after a bounded number of entries, so that a page costs the same at 10M receipts as at 1k:
-- receiver_receipts_provider_claimed (0006) for the newest receipts of a provider, the partial
-- indexes for the small states, receiver_attempts_failed_at and receiver_audit_at for the
-- charts. A "mark" is a receipt's claimed_at in whole microseconds since the epoch: the exact
-- keyset cursor of a page (a float of seconds may not survive the round trip exactly).

-- name: console_providers
-- Every provider (and action:/idem: namespace) in the ledger: a loose index scan of the
-- primary key, one probe per provider however many receipts each holds.
WITH RECURSIVE p AS (
    SELECT (SELECT min(provider) FROM receiver_receipts) AS provider
    UNION ALL
    SELECT (SELECT min(r.provider) FROM receiver_receipts r WHERE r.provider > p.provider)
    FROM p
    WHERE p.provider IS NOT NULL
)
SELECT provider FROM p WHERE provider IS NOT NULL;

-- name: console_receipts
-- One provider's receipts, newest first, below the cursor ($2 mark, NULL: from the newest;
-- $3 the webhook-id at that mark, NULL: every webhook-id at the mark) and not older than $4
-- (unix seconds, NULL: no bound). The walk reads at most $8 index entries; of those, the ones
-- matching the filters ($5 state, $6 event type, $7 webhook-id prefix; '' for any) come back,
-- at most $9. $10: the ledger's time (NULL: the database's).
SELECT provider, webhook_id, state, fence, event_type, attempts, last_error,
       extract(epoch FROM claimed_at)::float8 AS claimed_at,
       extract(epoch FROM lease_until)::float8 AS lease_until,
       extract(epoch FROM expires_at)::float8 AS expires_at,
       extract(epoch FROM completed_at)::float8 AS completed_at,
       response_status, queued, needs_review, mark,
       extract(epoch FROM COALESCE(to_timestamp($10::float8), statement_timestamp()))::float8
           AS now
FROM (
    SELECT provider, webhook_id, state, fence, event_type, attempts, last_error, claimed_at,
           lease_until, expires_at, completed_at, response_status,
           due_at IS NOT NULL AS queued,
           (state = 'failed'
            AND position('"needs_review"'::bytea IN substring(response_body FROM 1 FOR 200)) > 0)
               AS needs_review,
           (extract(epoch FROM claimed_at) * 1000000)::int8 AS mark
    FROM receiver_receipts
    WHERE provider COLLATE "C" = $1
      AND claimed_at <= COALESCE('epoch'::timestamptz + $2::int8 * interval '1 microsecond',
                                 'infinity')
      AND (claimed_at < COALESCE('epoch'::timestamptz + $2::int8 * interval '1 microsecond',
                                 'infinity')
           OR $3::text IS NULL OR webhook_id < $3::text)
      AND claimed_at >= COALESCE(to_timestamp($4::float8), '-infinity')
    ORDER BY claimed_at DESC, webhook_id DESC
    LIMIT $8
) walked
WHERE ($5::text = '' OR state = $5::text)
  AND ($6::text = '' OR event_type = $6::text)
  AND ($7::text = '' OR left(webhook_id, length($7::text)) = $7::text)
ORDER BY claimed_at DESC, webhook_id DESC
LIMIT $9;

-- name: console_horizon
-- Where a filtered walk of console_receipts (same $1-$4, $5 its $8) stopped: the last of the
-- entries it read, and how many it read (fewer than $5: the provider has nothing older).
SELECT mark, webhook_id, extract(epoch FROM claimed_at)::float8 AS claimed_at, read
FROM (
    SELECT (extract(epoch FROM claimed_at) * 1000000)::int8 AS mark, webhook_id, claimed_at,
           count(*) OVER () AS read
    FROM (
        SELECT claimed_at, webhook_id
        FROM receiver_receipts
        WHERE provider COLLATE "C" = $1
          AND claimed_at <= COALESCE('epoch'::timestamptz + $2::int8 * interval '1 microsecond',
                                     'infinity')
          AND (claimed_at < COALESCE('epoch'::timestamptz + $2::int8 * interval '1 microsecond',
                                     'infinity')
               OR $3::text IS NULL OR webhook_id < $3::text)
          AND claimed_at >= COALESCE(to_timestamp($4::float8), '-infinity')
        ORDER BY claimed_at DESC, webhook_id DESC
        LIMIT $5
    ) walked
) counted
ORDER BY claimed_at, webhook_id
LIMIT 1;

-- name: console_dead_letters
-- Failed receipts ($2 'failed': final failures; 'needs_review': those a person must look at)
-- or released ones after failed attempts ($2 'released'), newest first, through the partial
-- index of released and failed receipts. $1 provider ('' for all); cursor $3 mark (NULL: from
-- the newest), $4 provider, $5 webhook-id; at most $6; $7 the ledger's time.
SELECT provider, webhook_id, state, fence, event_type, attempts, last_error,
       extract(epoch FROM claimed_at)::float8 AS claimed_at,
       extract(epoch FROM lease_until)::float8 AS lease_until,
       extract(epoch FROM expires_at)::float8 AS expires_at,
       extract(epoch FROM completed_at)::float8 AS completed_at,
       response_status, due_at IS NOT NULL AS queued,
       (state = 'failed'
        AND position('"needs_review"'::bytea IN substring(response_body FROM 1 FOR 200)) > 0)
           AS needs_review,
       (extract(epoch FROM claimed_at) * 1000000)::int8 AS mark,
       extract(epoch FROM COALESCE(to_timestamp($7::float8), statement_timestamp()))::float8
           AS now
FROM receiver_receipts
WHERE state IN ('released', 'failed')
  AND ($1::text = '' OR provider = $1::text)
  AND CASE $2::text
          WHEN 'released' THEN state = 'released' AND attempts > 0
          WHEN 'needs_review' THEN state = 'failed' AND position('"needs_review"'::bytea IN
                                   substring(response_body FROM 1 FOR 200)) > 0
          ELSE state = 'failed' AND position('"needs_review"'::bytea IN
                                   substring(response_body FROM 1 FOR 200)) = 0
      END
  AND ($3::int8 IS NULL
       OR (claimed_at, provider, webhook_id)
          < ('epoch'::timestamptz + $3::int8 * interval '1 microsecond', $4::text, $5::text))
ORDER BY claimed_at DESC, provider DESC, webhook_id DESC
LIMIT $6;

-- name: console_in_flight
-- In-flight receipts ($2 true: only those whose lease ran out, i.e. stale), newest first,
-- through the partial index of in-flight receipts; parameters as console_dead_letters.
SELECT provider, webhook_id, state, fence, event_type, attempts, last_error,
       extract(epoch FROM claimed_at)::float8 AS claimed_at,
       extract(epoch FROM lease_until)::float8 AS lease_until,
       extract(epoch FROM expires_at)::float8 AS expires_at,
       extract(epoch FROM completed_at)::float8 AS completed_at,
       response_status, due_at IS NOT NULL AS queued, false AS needs_review,
       (extract(epoch FROM claimed_at) * 1000000)::int8 AS mark,
       extract(epoch FROM COALESCE(to_timestamp($7::float8), statement_timestamp()))::float8
           AS now
FROM receiver_receipts
WHERE state = 'in_flight'
  AND ($1::text = '' OR provider = $1::text)
  AND (NOT $2::boolean
       OR lease_until <= COALESCE(to_timestamp($7::float8), statement_timestamp()))
  AND ($3::int8 IS NULL
       OR (claimed_at, provider, webhook_id)
          < ('epoch'::timestamptz + $3::int8 * interval '1 microsecond', $4::text, $5::text))
ORDER BY claimed_at DESC, provider DESC, webhook_id DESC
LIMIT $6;

-- name: console_needs_review_counts
-- Receipts that need a person, per provider: failed ones only (the partial index), whose
-- stored answer says so.
SELECT provider, count(*) AS n
FROM receiver_receipts
WHERE state IN ('released', 'failed') AND state = 'failed'
  AND position('"needs_review"'::bytea IN substring(response_body FROM 1 FOR 200)) > 0
GROUP BY provider;

-- name: console_delivery_chart
-- Receipts of provider $1 claimed per bucket: $4 buckets of $3 seconds from $2 (unix seconds).
-- Each bucket walks at most $5 entries of receiver_receipts_provider_claimed, newest first;
-- "earliest" is the oldest entry it read, from which a full bucket's count is extrapolated.
SELECT b.i, c.n, c.earliest
FROM generate_series(0, $4::int - 1) AS b(i)
CROSS JOIN LATERAL (
    SELECT count(*) AS n, extract(epoch FROM min(w.claimed_at))::float8 AS earliest
    FROM (
        SELECT claimed_at
        FROM receiver_receipts
        WHERE provider COLLATE "C" = $1
          AND claimed_at >= to_timestamp($2::float8 + b.i * $3::float8)
          AND claimed_at < to_timestamp($2::float8 + (b.i + 1) * $3::float8)
        ORDER BY claimed_at DESC
        LIMIT $5
    ) w
) c
ORDER BY b.i;

-- name: console_failure_chart
-- Failed attempts per bucket ($3 buckets of $2 seconds from $1), at most $4 read per bucket.
SELECT b.i, c.n, c.earliest
FROM generate_series(0, $3::int - 1) AS b(i)
CROSS JOIN LATERAL (
    SELECT count(*) AS n, extract(epoch FROM min(w.failed_at))::float8 AS earliest
    FROM (
        SELECT failed_at
        FROM receiver_attempts
        WHERE failed_at >= to_timestamp($1::float8 + b.i * $2::float8)
          AND failed_at < to_timestamp($1::float8 + (b.i + 1) * $2::float8)
        ORDER BY failed_at DESC
        LIMIT $4
    ) w
) c
ORDER BY b.i;

-- name: console_replay_chart
-- Operators' replays and re-runs per bucket, from the audit records (as the failure chart).
SELECT b.i, c.n, c.earliest
FROM generate_series(0, $3::int - 1) AS b(i)
CROSS JOIN LATERAL (
    SELECT count(*) AS n, extract(epoch FROM min(w.at))::float8 AS earliest
    FROM (
        SELECT at
        FROM receiver_audit
        WHERE at >= to_timestamp($1::float8 + b.i * $2::float8)
          AND at < to_timestamp($1::float8 + (b.i + 1) * $2::float8)
          AND action IN ('replay', 'rerun')
        ORDER BY at DESC
        LIMIT $4
    ) w
) c
ORDER BY b.i;

-- name: console_reopen_completed
-- An operator's deliberate re-run of a completed inline delivery: give it back (fenced, and
-- only while it is the same payload) with the body the operator supplied, so that the replay
-- reclaims it with the next fence exactly as a dead letter's. $5: the ledger's time.
UPDATE receiver_receipts
SET state = 'released',
    request_body = $6,
    lease_until = COALESCE(to_timestamp($5::float8), statement_timestamp()),
    completed_at = NULL,
    response_status = NULL,
    response_content_type = NULL,
    response_body = NULL,
    response_headers = NULL
WHERE provider = $1 AND webhook_id = $2 AND fence = $3
  -- As a CASE, so that no plan looks the row up by payload hash instead of the key.
  AND CASE WHEN payload_hash = $4 THEN true ELSE false END
  AND state = 'completed' AND due_at IS NULL
RETURNING fence;

-- name: console_requeue_completed
-- The same for a completed queued delivery: due again now for the workers, with a fresh round
-- of attempts; its stored answer to the sender (the 202) stays.
WITH t AS (SELECT COALESCE(to_timestamp($5::float8), statement_timestamp()) AS now)
UPDATE receiver_receipts
SET state = 'queued', request_body = $6, due_at = t.now, lease_until = t.now, attempts = 0,
    completed_at = NULL, expires_at = 'infinity'
FROM t
WHERE provider = $1 AND webhook_id = $2 AND fence = $3
  -- As a CASE, so that no plan looks the row up by payload hash instead of the key.
  AND CASE WHEN payload_hash = $4 THEN true ELSE false END
  AND state = 'completed' AND due_at IS NOT NULL
RETURNING fence;

-- name: console_settle
-- A person decided a failed receipt (needs review): stored as $4 ('completed': reconciled by
-- hand, or 'failed': a final failure) with the answer $5-$7, fenced on the fence seen. A
-- queued receipt keeps its stored 202, the sender's answer. $8: the ledger's time.
UPDATE receiver_receipts
SET state = $4,
    response_status = CASE WHEN due_at IS NULL THEN $5 ELSE response_status END,
    response_content_type = CASE WHEN due_at IS NULL THEN $6 ELSE response_content_type END,
    response_body = CASE WHEN due_at IS NULL THEN $7 ELSE response_body END,
    response_headers = CASE WHEN due_at IS NULL THEN NULL ELSE response_headers END,
    completed_at = COALESCE(to_timestamp($8::float8), statement_timestamp()),
    request_body = CASE WHEN $4 = 'completed' THEN NULL ELSE request_body END
WHERE provider = $1 AND webhook_id = $2 AND fence = $3 AND state = 'failed'
RETURNING fence;

-- name: console_audit_add
-- One operator action, recorded before it takes effect (its outcome follows).
INSERT INTO receiver_audit (at, actor, action, provider, webhook_id, fence, reason, outcome)
VALUES (COALESCE(to_timestamp($1::float8), statement_timestamp()), $2, $3, $4, $5, $6, $7, $8)
RETURNING id;

-- name: console_audit_done
UPDATE receiver_audit SET outcome = $2, detail = $3 WHERE id = $1
RETURNING id;

-- name: delete_old_audit
-- The sweeper's batch of audit records older than the audit retention ($2 seconds before $1,
-- NULL: the database's clock): at most $3 of the oldest, read from receiver_audit_at, so a
-- batch costs its own rows however large the table. No FOR UPDATE: it needs the UPDATE
-- privilege, which the role that sweeps is not given on the console's tables (SELECT and DELETE
-- are enough: docs/how-to/postgresql.md); two sweepers that pick the same rows delete each once,
-- the second waiting for the first and skipping what it deleted.
-- The ids as an array: the delete then probes the primary key for each (a join with the
-- batch may hash the whole table instead).
WITH gone AS (
    DELETE FROM receiver_audit
    WHERE id = ANY (ARRAY(
        SELECT id FROM receiver_audit
        WHERE at < COALESCE(to_timestamp($1::float8), statement_timestamp())
                   - $2::float8 * interval '1 second'
        ORDER BY at
        LIMIT $3
    ))
    RETURNING 1
)
SELECT count(*) AS n FROM gone;

-- name: delete_old_bulk_items
-- The sweeper's batch of bulk-replay items ($3 at most) of jobs that ended (done or cancelled)
-- more than $2 seconds before $1 (NULL: the database's clock), the audit retention: the audit
-- record keeps the job's outcome counts. Jobs are few (operator actions); each job's items are
-- read through the primary key's (job, seq) prefix.
WITH gone AS (
    DELETE FROM receiver_bulk_items
    WHERE (job, seq) IN (
        SELECT i.job, i.seq FROM receiver_bulk_items i
        WHERE i.job = ANY (ARRAY(
            SELECT j.id FROM receiver_bulk_jobs j
            WHERE j.state <> 'running'
              AND j.finished_at < COALESCE(to_timestamp($1::float8), statement_timestamp())
                                  - $2::float8 * interval '1 second'
        ))
        LIMIT $3
    )
    RETURNING 1
)
SELECT count(*) AS n FROM gone;

-- name: delete_old_bulk_jobs
-- Jobs that ended before the audit retention ($2 seconds before $1) and have no items left
-- (delete_old_bulk_items goes first): at most $3. Neither takes row locks before deleting, as
-- delete_old_audit does not (SELECT and DELETE are the privileges these need).
WITH gone AS (
    DELETE FROM receiver_bulk_jobs
    WHERE id = ANY (ARRAY(
        SELECT j.id FROM receiver_bulk_jobs j
        WHERE j.state <> 'running'
          AND j.finished_at < COALESCE(to_timestamp($1::float8), statement_timestamp())
                              - $2::float8 * interval '1 second'
          AND NOT EXISTS (SELECT 1 FROM receiver_bulk_items i WHERE i.job = j.id)
        ORDER BY j.finished_at
        LIMIT $3
    ))
    RETURNING 1
)
SELECT count(*) AS n FROM gone;

-- name: console_audit_list
-- Newest first, below the id $1 (NULL: from the newest), at most $2.
SELECT id, extract(epoch FROM at)::float8 AS at, actor, action, provider, webhook_id, fence,
       reason, outcome, detail
FROM receiver_audit
WHERE ($1::int8 IS NULL OR id < $1::int8)
ORDER BY id DESC
LIMIT $2;

-- name: console_audit_of
-- One receipt's audit records, newest first.
SELECT id, extract(epoch FROM at)::float8 AS at, actor, action, provider, webhook_id, fence,
       reason, outcome, detail
FROM receiver_audit
WHERE provider = $1 AND webhook_id = $2
ORDER BY id DESC
LIMIT $3;
