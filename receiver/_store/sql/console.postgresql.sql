-- The console's statements for its sessions, bulk replays and live numbers
-- (receiver/_console/sessions.py, bulk.py, live.py), loaded with queries.postgresql.sql.

-- name: console_session_add
-- A signed-in browser: $1 the sha256 (hex) of its cookie's secret, expiring $6 seconds from
-- now ($5: the ledger's time, NULL: the database's).
WITH t AS (SELECT COALESCE(to_timestamp($5::float8), statement_timestamp()) AS now)
INSERT INTO receiver_console_sessions
    (id, operator, role, credential, created_at, expires_at, notice)
SELECT $1, $2, $3, $4, t.now, t.now + $6::float8 * interval '1 second', $7 FROM t
RETURNING id;

-- name: console_session_get
-- A live session (not expired at $2), with the notice waiting for its next page.
SELECT operator, role, credential, notice, extract(epoch FROM expires_at)::float8 AS expires_at
FROM receiver_console_sessions
WHERE id = $1 AND expires_at > COALESCE(to_timestamp($2::float8), statement_timestamp());

-- name: console_session_notice
-- The notice for the session's next page ($2, NULL: clear it), if the session is live.
UPDATE receiver_console_sessions SET notice = $2
WHERE id = $1 AND expires_at > COALESCE(to_timestamp($3::float8), statement_timestamp())
RETURNING id;

-- name: console_session_shown
-- The notice was shown: cleared unless a newer one replaced it meanwhile.
UPDATE receiver_console_sessions SET notice = NULL WHERE id = $1 AND notice = $2
RETURNING id;

-- name: console_session_end
DELETE FROM receiver_console_sessions WHERE id = $1 RETURNING id;

-- name: console_session_end_all
-- Every session, ended at once.
DELETE FROM receiver_console_sessions RETURNING id;

-- name: console_session_sweep
-- At most $2 expired sessions deleted (receiver_console_sessions_expires).
DELETE FROM receiver_console_sessions
WHERE id IN (
    SELECT id FROM receiver_console_sessions
    WHERE expires_at <= COALESCE(to_timestamp($1::float8), statement_timestamp())
    ORDER BY expires_at
    LIMIT $2
)
RETURNING id;

-- name: console_session_list
-- The live signed-in sessions (not the notices-only rows of a console without sign-in),
-- newest first ($1: the ledger's time), at most $2.
SELECT operator, role, extract(epoch FROM created_at)::float8 AS created_at,
       extract(epoch FROM expires_at)::float8 AS expires_at
FROM receiver_console_sessions
WHERE role <> 'browser'
  AND expires_at > COALESCE(to_timestamp($1::float8), statement_timestamp())
ORDER BY created_at DESC
LIMIT $2;

-- Bulk replay (receiver/_console/bulk.py). The filter is $1 provider, $2 state ('released',
-- 'failed'; '' for both), $3 event type, $4/$5 claimed in [since, until) (unix seconds, NULL: no
-- bound), $6 text in the last error (case-insensitive); '' for any. Only webhook deliveries
-- that can be replayed match: a stored body, and not waiting for a person's review. They are
-- read through receiver_receipts_released_failed (the small states), never the whole ledger.

-- name: bulk_match
-- The first $7 matches, in the index's order (the dry run's sample).
SELECT provider, webhook_id, fence, state, event_type, attempts, last_error,
       extract(epoch FROM claimed_at)::float8 AS claimed_at
FROM receiver_receipts
WHERE state IN ('released', 'failed')
  AND ($1::text = '' OR provider = $1::text)
  AND ($2::text = '' OR state = $2::text)
  AND ($3::text = '' OR event_type = $3::text)
  AND claimed_at >= COALESCE(to_timestamp($4::float8), '-infinity')
  AND claimed_at < COALESCE(to_timestamp($5::float8), 'infinity')
  AND ($6::text = '' OR strpos(lower(last_error), lower($6::text)) > 0)
  AND strpos(provider, ':') = 0
  AND request_body IS NOT NULL
  AND NOT (state = 'failed'
           AND position('"needs_review"'::bytea IN substring(response_body FROM 1 FOR 200))
               > 0)
ORDER BY provider, state, webhook_id
LIMIT $7;

-- name: bulk_count
-- How many match, counting at most $7.
SELECT count(*) AS n FROM (
    SELECT 1 FROM receiver_receipts
    WHERE state IN ('released', 'failed')
      AND ($1::text = '' OR provider = $1::text)
      AND ($2::text = '' OR state = $2::text)
      AND ($3::text = '' OR event_type = $3::text)
      AND claimed_at >= COALESCE(to_timestamp($4::float8), '-infinity')
      AND claimed_at < COALESCE(to_timestamp($5::float8), 'infinity')
      AND ($6::text = '' OR strpos(lower(last_error), lower($6::text)) > 0)
      AND strpos(provider, ':') = 0
      AND request_body IS NOT NULL
      AND NOT (state = 'failed'
               AND position('"needs_review"'::bytea IN substring(response_body FROM 1 FOR 200))
                   > 0)
    LIMIT $7
) m;

-- name: bulk_snapshot
-- The job's items ($8): every match (at most $7) with the fence it has now, numbered.
INSERT INTO receiver_bulk_items (job, seq, provider, webhook_id, fence, state)
SELECT $8::int8, row_number() OVER (ORDER BY provider, state, webhook_id), provider, webhook_id,
       fence, 'pending'
FROM (
    SELECT provider, state, webhook_id, fence FROM receiver_receipts
    WHERE state IN ('released', 'failed')
      AND ($1::text = '' OR provider = $1::text)
      AND ($2::text = '' OR state = $2::text)
      AND ($3::text = '' OR event_type = $3::text)
      AND claimed_at >= COALESCE(to_timestamp($4::float8), '-infinity')
      AND claimed_at < COALESCE(to_timestamp($5::float8), 'infinity')
      AND ($6::text = '' OR strpos(lower(last_error), lower($6::text)) > 0)
      AND strpos(provider, ':') = 0
      AND request_body IS NOT NULL
      AND NOT (state = 'failed'
               AND position('"needs_review"'::bytea IN substring(response_body FROM 1 FOR 200))
                   > 0)
    ORDER BY provider, state, webhook_id
    LIMIT $7
) m;

-- name: bulk_job_add
-- A confirmed job ($1: the confirmation form's id, so that a second click finds the first
-- job); runnable at once (its lease is free).
WITH t AS (SELECT COALESCE(to_timestamp($2::float8), statement_timestamp()) AS now)
INSERT INTO receiver_bulk_jobs
    (request, created_at, actor, reason, filter, total, rate, state, lease_until)
SELECT $1, t.now, $3, $4, $5, 0, $6, 'running', t.now FROM t
ON CONFLICT (request) DO NOTHING
RETURNING id;

-- name: bulk_job_by_request
SELECT id FROM receiver_bulk_jobs WHERE request = $1;

-- name: bulk_job_total
UPDATE receiver_bulk_jobs
SET total = (SELECT count(*) FROM receiver_bulk_items WHERE job = $1), audit_id = $2
WHERE id = $1
RETURNING total;

-- name: bulk_job_get
SELECT id, extract(epoch FROM created_at)::float8 AS created_at, actor, reason, filter, total,
       done, rate, state, owner, extract(epoch FROM lease_until)::float8 AS lease_until,
       extract(epoch FROM finished_at)::float8 AS finished_at, audit_id,
       extract(epoch FROM COALESCE(to_timestamp($2::float8), statement_timestamp()))::float8
           AS now
FROM receiver_bulk_jobs
WHERE id = $1;

-- name: bulk_job_list
-- The newest $1 jobs.
SELECT id, extract(epoch FROM created_at)::float8 AS created_at, actor, reason, filter, total,
       done, rate, state, owner, extract(epoch FROM lease_until)::float8 AS lease_until,
       extract(epoch FROM finished_at)::float8 AS finished_at, audit_id,
       extract(epoch FROM statement_timestamp())::float8 AS now
FROM receiver_bulk_jobs
ORDER BY id DESC
LIMIT $1;

-- name: bulk_job_orphan
-- A running job nobody holds (its lease ran out: its runner died, or it was never taken).
SELECT id FROM receiver_bulk_jobs
WHERE state = 'running'
  AND lease_until <= COALESCE(to_timestamp($1::float8), statement_timestamp())
ORDER BY lease_until
LIMIT 1;

-- name: bulk_job_lease
-- Take (or keep) a running job for $3 seconds: the runner $2 holds it, or its lease ran out.
-- Of two consoles taking the same job, exactly one gets it.
WITH t AS (SELECT COALESCE(to_timestamp($4::float8), statement_timestamp()) AS now)
UPDATE receiver_bulk_jobs j
SET owner = $2, lease_until = t.now + $3::float8 * interval '1 second'
FROM t
WHERE j.id = $1 AND j.state = 'running' AND (j.owner = $2 OR j.lease_until <= t.now)
RETURNING j.id, j.rate;

-- name: bulk_job_cancel
WITH t AS (SELECT COALESCE(to_timestamp($2::float8), statement_timestamp()) AS now)
UPDATE receiver_bulk_jobs j
SET state = 'cancelled', finished_at = t.now, owner = NULL
FROM t
WHERE j.id = $1 AND j.state = 'running'
RETURNING j.id, j.audit_id;

-- name: bulk_job_finish
-- Done when no item is left (by the runner holding it).
WITH t AS (SELECT COALESCE(to_timestamp($3::float8), statement_timestamp()) AS now)
UPDATE receiver_bulk_jobs j
SET state = 'done', finished_at = t.now, owner = NULL
FROM t
WHERE j.id = $1 AND j.state = 'running' AND j.owner = $2
  AND NOT EXISTS (SELECT 1 FROM receiver_bulk_items i WHERE i.job = $1 AND i.state <> 'done')
RETURNING j.id, j.audit_id;

-- name: bulk_items_next
-- The next $2 items not done, in order (receiver_bulk_items_todo).
SELECT seq, provider, webhook_id, fence, state FROM receiver_bulk_items
WHERE job = $1 AND state <> 'done'
ORDER BY seq
LIMIT $2;

-- name: bulk_item_started
-- An item ($2) whose replay begins: marked, so that a runner taking the job over after a crash
-- judges it from its receipt (the items still pending were never reached).
UPDATE receiver_bulk_items SET state = 'started'
WHERE job = $1 AND seq = $2 AND state = 'pending'
RETURNING seq;

-- name: bulk_item_done
UPDATE receiver_bulk_items SET state = 'done', outcome = $3
WHERE job = $1 AND seq = $2 AND state <> 'done'
RETURNING seq;

-- name: bulk_job_progress
UPDATE receiver_bulk_jobs SET done = done + $2 WHERE id = $1 RETURNING done;

-- name: bulk_outcomes
-- A job's items by outcome (NULL: not done yet).
SELECT outcome, count(*) AS n FROM receiver_bulk_items WHERE job = $1 GROUP BY outcome;

-- Live numbers (receiver/_console/live.py), each an index walk bounded however large the
-- ledger: a provider's oldest queued or released delivery (receiver_receipts_backlog, one
-- probe), its newest claims since $2 (receiver_receipts_provider_claimed, at most $3), and the
-- newest failed attempts since $1 (receiver_attempts_failed_at, at most $2).

-- name: live_backlog
SELECT extract(epoch FROM COALESCE(due_at, claimed_at))::float8 AS oldest
FROM receiver_receipts
WHERE provider COLLATE "C" = $1 AND state IN ('queued', 'released')
ORDER BY COALESCE(due_at, claimed_at)
LIMIT 1;

-- name: live_recent
SELECT extract(epoch FROM claimed_at)::float8 AS claimed_at,
       extract(epoch FROM completed_at)::float8 AS completed_at, state
FROM receiver_receipts
WHERE provider COLLATE "C" = $1 AND claimed_at >= to_timestamp($2::float8)
ORDER BY claimed_at DESC
LIMIT $3;

-- name: live_failures
SELECT provider, extract(epoch FROM failed_at)::float8 AS failed_at
FROM receiver_attempts
WHERE failed_at >= to_timestamp($1::float8)
ORDER BY failed_at DESC
LIMIT $2;
