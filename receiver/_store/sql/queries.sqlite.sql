-- receiver: the ledger's statements for SQLite (aiosqlite).
-- Same names and positional parameters as queries.postgresql.sql; "?N" is SQLite's spelling of
-- "$N". Times are stored as unix seconds (REAL).

-- name: claim
-- The arbiter: one statement. A row back means this caller owns the key with fence 1, and
-- whether the same payload of the same type is already in the window under another webhook-id
-- (key drift: a sender that regenerates ids on retry defeats dedup; one lookup of the
-- payload-hash index, named because without statistics SQLite would walk the primary key by
-- provider); no row, that the key exists (the caller looks it up: SQLite has no INSERT inside
-- WITH, and a second statement costs no network round trip here).
-- Time is the database's (?5 NULL: julianday('now'), the same for the whole statement) unless
-- the store was given a clock; ?6 and ?7 are the lease and the window in seconds.
INSERT INTO receiver_receipts
    (provider, webhook_id, payload_hash, state, fence, event_type,
     claimed_at, lease_until, expires_at, request_body)
VALUES (?1, ?2, ?3, 'in_flight', 1, ?4,
        COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0),
        COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0) + ?6,
        COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0) + ?7,
        ?8)
ON CONFLICT (provider, webhook_id) DO NOTHING
RETURNING 1 AS claimed, provider, webhook_id, fence, claimed_at AS now,
    EXISTS (
        SELECT 1
        FROM receiver_receipts AS d INDEXED BY receiver_receipts_payload_hash
        WHERE d.provider = ?1 AND d.payload_hash = ?3 AND d.webhook_id <> ?2
          AND d.event_type IS ?4
          AND d.expires_at > COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0)
    ) AS drift;

-- name: lookup
SELECT state, fence, payload_hash, event_type,
       COALESCE(?3, (julianday('now') - 2440587.5) * 86400.0) AS now,
       claimed_at,
       lease_until,
       expires_at,
       completed_at,
       response_status, response_content_type, response_body, response_headers, request_body,
       attempts, last_error
FROM receiver_receipts
WHERE provider = ?1 AND webhook_id = ?2;

-- name: reclaim
-- Compare-and-set on the fence seen by the caller: of several callers that saw the same
-- released, lease-expired or expired row, exactly one gets it, with the next fence. A live
-- lease always wins over expiry: an attempt still running is never taken over.
UPDATE receiver_receipts
SET fence = fence + 1,
    state = 'in_flight',
    attempts = CASE WHEN expires_at <= COALESCE(?6, (julianday('now') - 2440587.5) * 86400.0) THEN 0 ELSE attempts END,
    last_error = CASE WHEN expires_at <= COALESCE(?6, (julianday('now') - 2440587.5) * 86400.0) THEN NULL ELSE last_error END,
    payload_hash = ?4,
    event_type = ?5,
    claimed_at = COALESCE(?6, (julianday('now') - 2440587.5) * 86400.0),
    lease_until = COALESCE(?6, (julianday('now') - 2440587.5) * 86400.0) + ?7,
    expires_at = COALESCE(?6, (julianday('now') - 2440587.5) * 86400.0) + ?8,
    request_body = ?9,
    completed_at = NULL,
    response_status = NULL,
    response_content_type = NULL,
    response_body = NULL,
    response_headers = NULL
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3
  AND (state = 'released'
       OR (state = 'in_flight' AND lease_until <= COALESCE(?6, (julianday('now') - 2440587.5) * 86400.0))
       OR (state <> 'in_flight' AND expires_at <= COALESCE(?6, (julianday('now') - 2440587.5) * 86400.0)))
RETURNING fence;

-- name: complete
-- Fenced: zero rows means a newer claim owns the key and the caller must roll back.
UPDATE receiver_receipts
SET state = ?4,
    response_status = ?5,
    response_content_type = ?6,
    response_body = ?7,
    response_headers = ?9,
    completed_at = COALESCE(?8, (julianday('now') - 2440587.5) * 86400.0),
    request_body = CASE WHEN ?4 = 'completed' THEN NULL ELSE request_body END
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'in_flight'
RETURNING provider, webhook_id, fence;

-- name: release
-- Fenced: give the key back so that the sender's retry runs the handlers again.
UPDATE receiver_receipts
SET state = 'released',
    attempts = attempts + 1,
    last_error = ?4,
    lease_until = COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0)
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'in_flight'
RETURNING fence;

-- name: forget
-- Fenced: the key of an attempt that did nothing goes, with its attempts (forget_attempts), so
-- that a corrected request under it is a new request (queries.postgresql.sql says when).
DELETE FROM receiver_receipts
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'in_flight'
RETURNING fence;

-- name: forget_attempts
DELETE FROM receiver_attempts WHERE provider = ?1 AND webhook_id = ?2;

-- name: unresolve
-- Fenced: reconcile() of an interrupted external attempt failed, so what happened outside is
-- still unknown. Never released (a release lets the retry run the external effect again): the
-- key stays in flight with its lease ended, so that the next attempt reconciles again.
UPDATE receiver_receipts
SET attempts = attempts + 1,
    last_error = ?4,
    lease_until = COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0)
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'in_flight'
RETURNING fence;

-- name: record_attempt
INSERT INTO receiver_attempts (provider, webhook_id, fence, failed_at, error)
VALUES (?1, ?2, ?3, COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0), ?5)
ON CONFLICT (provider, webhook_id, fence)
DO UPDATE SET failed_at = excluded.failed_at, error = excluded.error;

-- name: note_failure
-- A receipt marked failed for review keeps its reason, counted as an attempt (fenced).
UPDATE receiver_receipts
SET attempts = attempts + 1,
    last_error = ?4
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3
RETURNING fence;

-- name: list_attempts
SELECT fence, failed_at, error
FROM receiver_attempts
WHERE provider = ?1 AND webhook_id = ?2
ORDER BY fence;

-- name: same_content
-- The first receipt of provider ?1 in the window with the same payload hash (?2) and event type
-- (?4) under another key than ?3 (queries.postgresql.sql says what for).
SELECT webhook_id, state, response_status, response_content_type, response_body,
       response_headers
FROM receiver_receipts AS d INDEXED BY receiver_receipts_payload_hash
WHERE d.provider = ?1 AND d.payload_hash = ?2 AND d.webhook_id <> ?3
  AND d.event_type IS ?4 AND d.state <> 'released'
  AND d.expires_at > COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0)
ORDER BY d.claimed_at, d.webhook_id
LIMIT 1;

-- name: legacy_horizon
-- Until when receipts of provider ?1 stored under a body-digest key can still answer a
-- redelivery (queries.postgresql.sql says what for); NULL when there are none.
SELECT max(expires_at) AS until,
       COALESCE(?2, (julianday('now') - 2440587.5) * 86400.0) AS now
FROM receiver_receipts
WHERE provider = ?1 AND substr(webhook_id, 1, 7) = 'sha256:';

-- name: extend_lease
-- The lease runs ?5 seconds from now; the window grows with it if it must (a live lease
-- always wins over expiry anyway).
UPDATE receiver_receipts
SET lease_until = COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0) + ?5,
    expires_at = max(expires_at, COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0) + ?5)
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'in_flight'
RETURNING fence;

-- name: schema_ready
-- For /readyz: the tables are there (reading no row). A file is writable or cannot be opened.
SELECT false AS read_only, true AS privileged
FROM (SELECT count(*) FROM receiver_receipts WHERE false) AS schema;

-- name: stale
-- In-flight receipts whose lease ran out: their attempt died or stalled (the sweeper's work).
SELECT provider, webhook_id, state, fence, payload_hash, event_type,
       COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0) AS now,
       claimed_at, lease_until, expires_at, completed_at,
       response_status, response_content_type, response_body, response_headers, request_body,
       attempts, last_error
FROM receiver_receipts
WHERE state = 'in_flight' AND due_at IS NULL  -- queued receipts are the workers' (queue_stale)
  AND lease_until <= COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0)
ORDER BY lease_until
LIMIT ?2;

-- name: delete_expired
-- What expiry means per state: see queries.postgresql.sql (?1 NULL: the database's clock; ?2:
-- the retention, seconds). One batch of at most ?3 rows; one
-- row (n = 1) per receipt deleted. Their attempts go with delete_orphan_attempts (SQLite has no
-- data-modifying CTE); SQLite's single writer means no concurrent sweeper to skip.
-- Completed receipts first, then dead letters, each from its own partial index (0008).
DELETE FROM receiver_receipts
WHERE (provider, webhook_id) IN (
    SELECT provider, webhook_id FROM (
        SELECT provider, webhook_id FROM receiver_receipts
        WHERE state = 'completed' AND expires_at < 9e999
          AND expires_at <= COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0)
        LIMIT ?3
    )
    UNION ALL
    SELECT provider, webhook_id FROM (
        SELECT provider, webhook_id FROM receiver_receipts
        WHERE state IN ('failed', 'released') AND expires_at < 9e999
          AND expires_at <= COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0) - ?2
        LIMIT ?3
    )
    LIMIT ?3
)
RETURNING 1 AS n;

-- name: delete_orphan_attempts
DELETE FROM receiver_attempts
WHERE (provider, webhook_id, fence) IN (
    SELECT a.provider, a.webhook_id, a.fence
    FROM receiver_attempts a
    LEFT JOIN receiver_receipts r
        ON r.provider = a.provider AND r.webhook_id = a.webhook_id
    WHERE r.provider IS NULL
    LIMIT ?1
)
RETURNING fence;

-- name: list_failed
SELECT provider, webhook_id, state, fence, event_type, attempts, last_error,
       claimed_at, completed_at
FROM receiver_receipts
WHERE (state = 'failed' OR (state IN ('released', 'queued') AND attempts > 0))
  AND (?1 = '' OR provider = ?1)
ORDER BY claimed_at
LIMIT ?2;

-- name: oldest_in_flight_by_provider
-- For the metrics' oldest in-flight age; reads only in-flight rows (the partial index).
SELECT provider, min(claimed_at) AS claimed_at
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
-- SQLite keeps no row estimates: no rows, so the receipts are counted exactly.
SELECT NULL AS provider, NULL AS n, NULL AS total WHERE 0;

-- name: reopen
-- Dead-letter replay: give a failed receipt back (fenced), so that the replay reclaims it with
-- the next fence exactly as a sender's retry of a released receipt would.
UPDATE receiver_receipts
SET state = 'released',
    lease_until = COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0),
    completed_at = NULL,
    response_status = NULL,
    response_content_type = NULL,
    response_body = NULL,
    response_headers = NULL
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'failed'
RETURNING fence;

-- Queued mode (receiver/_queue/receipts.py); see queries.postgresql.sql for the whole story. SQLite has
-- one writer: the batch is a group of these statements in one transaction, and a single
-- worker process fetches (no SKIP LOCKED needed, none available).

-- name: enqueue
-- One row (PostgreSQL's takes the whole batch as arrays), with its key drift as the claim
-- reports it. No NOTIFY on SQLite: workers poll.
INSERT INTO receiver_receipts
    (provider, webhook_id, payload_hash, state, fence, event_type, claimed_at,
     lease_until, expires_at, due_at, request_body,
     response_status, response_content_type, response_body)
VALUES (?1, ?2, ?3, 'queued', 0, ?4,
        COALESCE(?6, (julianday('now') - 2440587.5) * 86400.0),
        COALESCE(?6, (julianday('now') - 2440587.5) * 86400.0),
        9e999,
        COALESCE(?6, (julianday('now') - 2440587.5) * 86400.0),
        ?5, ?7, ?8, ?9)
ON CONFLICT (provider, webhook_id) DO NOTHING
RETURNING provider, webhook_id,
    EXISTS (
        SELECT 1
        FROM receiver_receipts AS d INDEXED BY receiver_receipts_payload_hash
        WHERE d.provider = ?1 AND d.payload_hash = ?3 AND d.webhook_id <> ?2
          AND d.event_type IS ?4
          AND d.expires_at > COALESCE(?6, (julianday('now') - 2440587.5) * 86400.0)
    ) AS drift;

-- name: queue_fetch
UPDATE receiver_receipts
SET state = 'in_flight',
    fence = fence + 1,
    claimed_at = COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0),
    lease_until = COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0) + ?3
WHERE (provider, webhook_id) IN (
    SELECT provider, webhook_id FROM receiver_receipts
    WHERE state = 'queued'
      AND due_at <= COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0)
    ORDER BY due_at
    LIMIT ?2
)
RETURNING provider, webhook_id, fence, payload_hash, event_type, request_body, attempts,
          due_at, claimed_at AS now;

-- name: queue_complete
UPDATE receiver_receipts
SET state = ?4,
    completed_at = COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0),
    lease_until = COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0),
    expires_at = COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0) + ?6,
    request_body = CASE WHEN ?4 = 'completed' THEN NULL ELSE request_body END
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'in_flight'
RETURNING provider, webhook_id, fence;

-- name: queue_retry
UPDATE receiver_receipts
SET state = CASE WHEN ?7 THEN 'failed' ELSE 'queued' END,
    attempts = attempts + 1,
    last_error = ?4,
    lease_until = COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0),
    due_at = CASE WHEN ?7 THEN due_at
                  ELSE COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0) + ?6 END,
    completed_at = CASE WHEN ?7 THEN COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0) END,
    expires_at = CASE WHEN ?7 THEN COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0) + ?8
                      ELSE expires_at END
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'in_flight'
RETURNING fence;

-- name: queue_reclaim
UPDATE receiver_receipts
SET fence = fence + 1,
    claimed_at = COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0),
    lease_until = COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0) + ?5
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'in_flight'
  AND due_at IS NOT NULL
  AND lease_until <= COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0)
RETURNING fence;

-- name: queue_stale
SELECT provider, webhook_id, state, fence, payload_hash, event_type,
       COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0) AS now,
       claimed_at, lease_until, expires_at, completed_at,
       response_status, response_content_type, response_body, response_headers, request_body,
       attempts, last_error
FROM receiver_receipts
WHERE state = 'in_flight' AND due_at IS NOT NULL
  AND lease_until <= COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0)
ORDER BY lease_until
LIMIT ?2;

-- name: queue_requeue
UPDATE receiver_receipts
SET state = 'queued', payload_hash = ?4, event_type = ?5, request_body = ?6,
    claimed_at = COALESCE(?7, (julianday('now') - 2440587.5) * 86400.0),
    lease_until = COALESCE(?7, (julianday('now') - 2440587.5) * 86400.0),
    expires_at = 9e999,
    due_at = COALESCE(?7, (julianday('now') - 2440587.5) * 86400.0),
    completed_at = NULL, attempts = 0, last_error = NULL,
    response_status = ?8, response_content_type = ?9, response_body = ?10,
    response_headers = NULL
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3
  AND (state = 'released'
       OR (state <> 'in_flight' AND state <> 'queued'
           AND expires_at <= COALESCE(?7, (julianday('now') - 2440587.5) * 86400.0)))
RETURNING fence;

-- name: queue_reopen
UPDATE receiver_receipts
SET state = 'queued',
    due_at = COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0),
    lease_until = COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0),
    attempts = 0, completed_at = NULL, expires_at = 9e999
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'failed'
  AND due_at IS NOT NULL
RETURNING fence;

-- name: queue_next_due
-- Seconds until the earliest queued receipt is due (<= 0: one is due now; NULL: none queued),
-- so that an idle worker wakes for a retry when it is due, not on its next poll. The first
-- entry of receiver_receipts_due.
SELECT min(due_at) - COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0) AS wait
FROM receiver_receipts
WHERE state = 'queued';

-- name: queue_depth
SELECT provider,
       sum(due_at <= t.now) AS due,
       sum(due_at > t.now) AS waiting,
       min(CASE WHEN due_at <= t.now THEN due_at END) AS oldest_due,
       t.now AS now
FROM receiver_receipts,
     (SELECT COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0) AS now) t
WHERE state = 'queued'
GROUP BY provider;

-- name: queue_release
UPDATE receiver_receipts
SET state = 'queued',
    due_at = COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0),
    lease_until = COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0)
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'in_flight'
  AND due_at IS NOT NULL
RETURNING fence;

-- console
-- The operator console's statements (receiver/_console/); see queries.postgresql.sql. Times are
-- unix seconds (REAL) here, so a receipt's "mark" (the keyset cursor) is its claimed_at itself.

-- name: console_providers
WITH RECURSIVE p(provider) AS (
    SELECT (SELECT min(provider) FROM receiver_receipts)
    UNION ALL
    SELECT (SELECT min(r.provider) FROM receiver_receipts r WHERE r.provider > p.provider)
    FROM p
    WHERE p.provider IS NOT NULL
)
SELECT provider FROM p WHERE provider IS NOT NULL;

-- name: console_receipts
SELECT provider, webhook_id, state, fence, event_type, attempts, last_error, claimed_at,
       lease_until, expires_at, completed_at, response_status, queued, needs_review, mark,
       COALESCE(?10, (julianday('now') - 2440587.5) * 86400.0) AS now
FROM (
    SELECT provider, webhook_id, state, fence, event_type, attempts, last_error, claimed_at,
           lease_until, expires_at, completed_at, response_status,
           due_at IS NOT NULL AS queued,
           (state = 'failed'
            AND instr(substr(response_body, 1, 200), CAST('"needs_review"' AS BLOB)) > 0)
               AS needs_review,
           claimed_at AS mark
    FROM receiver_receipts
    WHERE provider = ?1
      AND claimed_at <= COALESCE(?2, 9e999)
      AND (claimed_at < COALESCE(?2, 9e999) OR ?3 IS NULL OR webhook_id < ?3)
      AND claimed_at >= COALESCE(?4, -9e999)
    ORDER BY claimed_at DESC, webhook_id DESC
    LIMIT ?8
) walked
WHERE (?5 = '' OR state = ?5)
  AND (?6 = '' OR event_type = ?6)
  AND (?7 = '' OR substr(webhook_id, 1, length(?7)) = ?7)
ORDER BY claimed_at DESC, webhook_id DESC
LIMIT ?9;

-- name: console_horizon
SELECT mark, webhook_id, claimed_at, read
FROM (
    SELECT claimed_at AS mark, webhook_id, claimed_at, count(*) OVER () AS read
    FROM (
        SELECT claimed_at, webhook_id
        FROM receiver_receipts
        WHERE provider = ?1
          AND claimed_at <= COALESCE(?2, 9e999)
          AND (claimed_at < COALESCE(?2, 9e999) OR ?3 IS NULL OR webhook_id < ?3)
          AND claimed_at >= COALESCE(?4, -9e999)
        ORDER BY claimed_at DESC, webhook_id DESC
        LIMIT ?5
    ) walked
) counted
ORDER BY claimed_at, webhook_id
LIMIT 1;

-- name: console_dead_letters
SELECT provider, webhook_id, state, fence, event_type, attempts, last_error, claimed_at,
       lease_until, expires_at, completed_at, response_status, due_at IS NOT NULL AS queued,
       (state = 'failed'
        AND instr(substr(response_body, 1, 200), CAST('"needs_review"' AS BLOB)) > 0)
           AS needs_review,
       claimed_at AS mark,
       COALESCE(?7, (julianday('now') - 2440587.5) * 86400.0) AS now
FROM receiver_receipts
WHERE state IN ('released', 'failed')
  AND (?1 = '' OR provider = ?1)
  AND CASE ?2
          WHEN 'released' THEN state = 'released' AND attempts > 0
          WHEN 'needs_review' THEN state = 'failed' AND instr(substr(response_body, 1, 200),
                                   CAST('"needs_review"' AS BLOB)) > 0
          ELSE state = 'failed' AND instr(substr(response_body, 1, 200),
                                   CAST('"needs_review"' AS BLOB)) = 0
      END
  AND (?3 IS NULL OR (claimed_at, provider, webhook_id) < (?3, ?4, ?5))
ORDER BY claimed_at DESC, provider DESC, webhook_id DESC
LIMIT ?6;

-- name: console_in_flight
SELECT provider, webhook_id, state, fence, event_type, attempts, last_error, claimed_at,
       lease_until, expires_at, completed_at, response_status, due_at IS NOT NULL AS queued,
       0 AS needs_review, claimed_at AS mark,
       COALESCE(?7, (julianday('now') - 2440587.5) * 86400.0) AS now
FROM receiver_receipts
WHERE state = 'in_flight'
  AND (?1 = '' OR provider = ?1)
  AND (NOT ?2 OR lease_until <= COALESCE(?7, (julianday('now') - 2440587.5) * 86400.0))
  AND (?3 IS NULL OR (claimed_at, provider, webhook_id) < (?3, ?4, ?5))
ORDER BY claimed_at DESC, provider DESC, webhook_id DESC
LIMIT ?6;

-- name: console_needs_review_counts
SELECT provider, count(*) AS n
FROM receiver_receipts
WHERE state = 'failed'
  AND instr(substr(response_body, 1, 200), CAST('"needs_review"' AS BLOB)) > 0
GROUP BY provider;

-- name: console_delivery_chart
WITH RECURSIVE b(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM b WHERE i + 1 < ?4)
SELECT b.i,
       (SELECT count(*) FROM (
            SELECT 1 FROM receiver_receipts
            WHERE provider = ?1 AND claimed_at >= ?2 + b.i * ?3
              AND claimed_at < ?2 + (b.i + 1) * ?3
            LIMIT ?5)) AS n,
       (SELECT min(claimed_at) FROM (
            SELECT claimed_at FROM receiver_receipts
            WHERE provider = ?1 AND claimed_at >= ?2 + b.i * ?3
              AND claimed_at < ?2 + (b.i + 1) * ?3
            ORDER BY claimed_at DESC
            LIMIT ?5)) AS earliest
FROM b
ORDER BY b.i;

-- name: console_failure_chart
WITH RECURSIVE b(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM b WHERE i + 1 < ?3)
SELECT b.i,
       (SELECT count(*) FROM (
            SELECT 1 FROM receiver_attempts
            WHERE failed_at >= ?1 + b.i * ?2 AND failed_at < ?1 + (b.i + 1) * ?2
            LIMIT ?4)) AS n,
       (SELECT min(failed_at) FROM (
            SELECT failed_at FROM receiver_attempts
            WHERE failed_at >= ?1 + b.i * ?2 AND failed_at < ?1 + (b.i + 1) * ?2
            ORDER BY failed_at DESC
            LIMIT ?4)) AS earliest
FROM b
ORDER BY b.i;

-- name: console_replay_chart
WITH RECURSIVE b(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM b WHERE i + 1 < ?3)
SELECT b.i,
       (SELECT count(*) FROM (
            SELECT 1 FROM receiver_audit
            WHERE at >= ?1 + b.i * ?2 AND at < ?1 + (b.i + 1) * ?2
              AND action IN ('replay', 'rerun')
            LIMIT ?4)) AS n,
       (SELECT min(at) FROM (
            SELECT at FROM receiver_audit
            WHERE at >= ?1 + b.i * ?2 AND at < ?1 + (b.i + 1) * ?2
              AND action IN ('replay', 'rerun')
            ORDER BY at DESC
            LIMIT ?4)) AS earliest
FROM b
ORDER BY b.i;

-- name: console_reopen_completed
UPDATE receiver_receipts
SET state = 'released',
    request_body = ?6,
    lease_until = COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0),
    completed_at = NULL,
    response_status = NULL,
    response_content_type = NULL,
    response_body = NULL,
    response_headers = NULL
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND payload_hash = ?4
  AND state = 'completed' AND due_at IS NULL
RETURNING fence;

-- name: console_requeue_completed
UPDATE receiver_receipts
SET state = 'queued', request_body = ?6,
    due_at = COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0),
    lease_until = COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0),
    attempts = 0, completed_at = NULL, expires_at = 9e999
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND payload_hash = ?4
  AND state = 'completed' AND due_at IS NOT NULL
RETURNING fence;

-- name: console_settle
UPDATE receiver_receipts
SET state = ?4,
    response_status = CASE WHEN due_at IS NULL THEN ?5 ELSE response_status END,
    response_content_type = CASE WHEN due_at IS NULL THEN ?6 ELSE response_content_type END,
    response_body = CASE WHEN due_at IS NULL THEN ?7 ELSE response_body END,
    response_headers = CASE WHEN due_at IS NULL THEN NULL ELSE response_headers END,
    completed_at = COALESCE(?8, (julianday('now') - 2440587.5) * 86400.0),
    request_body = CASE WHEN ?4 = 'completed' THEN NULL ELSE request_body END
WHERE provider = ?1 AND webhook_id = ?2 AND fence = ?3 AND state = 'failed'
RETURNING fence;

-- name: console_audit_add
INSERT INTO receiver_audit (at, actor, action, provider, webhook_id, fence, reason, outcome)
VALUES (COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0), ?2, ?3, ?4, ?5, ?6, ?7, ?8)
RETURNING id;

-- name: console_audit_done
UPDATE receiver_audit SET outcome = ?2, detail = ?3 WHERE id = ?1
RETURNING id;

-- name: delete_old_audit
-- See queries.postgresql.sql: at most ?3 of the oldest audit records older than ?2 seconds
-- before ?1, through receiver_audit_at; one row (n = 1) per record deleted.
DELETE FROM receiver_audit
WHERE id IN (
    SELECT id FROM receiver_audit
    WHERE at < COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0) - ?2
    ORDER BY at
    LIMIT ?3
)
RETURNING 1 AS n;

-- name: delete_old_bulk_items
-- See queries.postgresql.sql: at most ?3 items of bulk replays that ended more than ?2 seconds
-- before ?1; one row (n = 1) per item deleted.
DELETE FROM receiver_bulk_items
WHERE (job, seq) IN (
    SELECT i.job, i.seq FROM receiver_bulk_items i
    WHERE i.job IN (
        SELECT j.id FROM receiver_bulk_jobs j
        WHERE j.state <> 'running'
          AND j.finished_at < COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0) - ?2
    )
    LIMIT ?3
)
RETURNING 1 AS n;

-- name: delete_old_bulk_jobs
-- See queries.postgresql.sql: at most ?3 ended jobs past the retention with no items left.
DELETE FROM receiver_bulk_jobs
WHERE id IN (
    SELECT j.id FROM receiver_bulk_jobs j
    WHERE j.state <> 'running'
      AND j.finished_at < COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0) - ?2
      AND NOT EXISTS (SELECT 1 FROM receiver_bulk_items i WHERE i.job = j.id)
    ORDER BY j.finished_at
    LIMIT ?3
)
RETURNING 1 AS n;

-- name: console_audit_list
SELECT id, at, actor, action, provider, webhook_id, fence, reason, outcome, detail
FROM receiver_audit
WHERE (?1 IS NULL OR id < ?1)
ORDER BY id DESC
LIMIT ?2;

-- name: console_audit_of
SELECT id, at, actor, action, provider, webhook_id, fence, reason, outcome, detail
FROM receiver_audit
WHERE provider = ?1 AND webhook_id = ?2
ORDER BY id DESC
LIMIT ?3;
