-- The console's statements for its sessions, bulk replays and live numbers
-- (receiver/_console/sessions.py, bulk.py, live.py), loaded with queries.sqlite.sql.

-- name: console_session_add
INSERT INTO receiver_console_sessions
    (id, operator, role, credential, created_at, expires_at, notice)
VALUES (?1, ?2, ?3, ?4, COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0),
        COALESCE(?5, (julianday('now') - 2440587.5) * 86400.0) + ?6, ?7)
RETURNING id;

-- name: console_session_get
SELECT operator, role, credential, notice, expires_at
FROM receiver_console_sessions
WHERE id = ?1 AND expires_at > COALESCE(?2, (julianday('now') - 2440587.5) * 86400.0);

-- name: console_session_notice
UPDATE receiver_console_sessions SET notice = ?2
WHERE id = ?1 AND expires_at > COALESCE(?3, (julianday('now') - 2440587.5) * 86400.0)
RETURNING id;

-- name: console_session_shown
UPDATE receiver_console_sessions SET notice = NULL WHERE id = ?1 AND notice = ?2
RETURNING id;

-- name: console_session_end
DELETE FROM receiver_console_sessions WHERE id = ?1 RETURNING id;

-- name: console_session_end_all
DELETE FROM receiver_console_sessions RETURNING id;

-- name: console_session_sweep
DELETE FROM receiver_console_sessions
WHERE id IN (
    SELECT id FROM receiver_console_sessions
    WHERE expires_at <= COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0)
    ORDER BY expires_at
    LIMIT ?2
)
RETURNING id;

-- name: console_session_list
SELECT operator, role, created_at, expires_at
FROM receiver_console_sessions
WHERE role <> 'browser'
  AND expires_at > COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0)
ORDER BY created_at DESC
LIMIT ?2;

-- Bulk replay (receiver/_console/bulk.py): see console.postgresql.sql for the parameters.

-- name: bulk_match
SELECT provider, webhook_id, fence, state, event_type, attempts, last_error, claimed_at
FROM receiver_receipts
WHERE state IN ('released', 'failed')
  AND (?1 = '' OR provider = ?1)
  AND (?2 = '' OR state = ?2)
  AND (?3 = '' OR event_type = ?3)
  AND (?4 IS NULL OR claimed_at >= ?4)
  AND (?5 IS NULL OR claimed_at < ?5)
  AND (?6 = '' OR instr(lower(last_error), lower(?6)) > 0)
  AND instr(provider, ':') = 0
  AND request_body IS NOT NULL
  AND NOT (state = 'failed'
           AND instr(substr(response_body, 1, 200), CAST('"needs_review"' AS BLOB)) > 0)
ORDER BY provider, state, webhook_id
LIMIT ?7;

-- name: bulk_count
SELECT count(*) AS n FROM (
    SELECT 1 FROM receiver_receipts
    WHERE state IN ('released', 'failed')
      AND (?1 = '' OR provider = ?1)
      AND (?2 = '' OR state = ?2)
      AND (?3 = '' OR event_type = ?3)
      AND (?4 IS NULL OR claimed_at >= ?4)
      AND (?5 IS NULL OR claimed_at < ?5)
      AND (?6 = '' OR instr(lower(last_error), lower(?6)) > 0)
      AND instr(provider, ':') = 0
      AND request_body IS NOT NULL
      AND NOT (state = 'failed'
               AND instr(substr(response_body, 1, 200), CAST('"needs_review"' AS BLOB)) > 0)
    LIMIT ?7
) m;

-- name: bulk_snapshot
INSERT INTO receiver_bulk_items (job, seq, provider, webhook_id, fence, state)
SELECT ?8, row_number() OVER (ORDER BY provider, state, webhook_id), provider, webhook_id,
       fence, 'pending'
FROM (
    SELECT provider, state, webhook_id, fence FROM receiver_receipts
    WHERE state IN ('released', 'failed')
      AND (?1 = '' OR provider = ?1)
      AND (?2 = '' OR state = ?2)
      AND (?3 = '' OR event_type = ?3)
      AND (?4 IS NULL OR claimed_at >= ?4)
      AND (?5 IS NULL OR claimed_at < ?5)
      AND (?6 = '' OR instr(lower(last_error), lower(?6)) > 0)
      AND instr(provider, ':') = 0
      AND request_body IS NOT NULL
      AND NOT (state = 'failed'
               AND instr(substr(response_body, 1, 200), CAST('"needs_review"' AS BLOB)) > 0)
    ORDER BY provider, state, webhook_id
    LIMIT ?7
) m;

-- name: bulk_job_add
INSERT INTO receiver_bulk_jobs
    (request, created_at, actor, reason, filter, total, rate, state, lease_until)
VALUES (?1, COALESCE(?2, (julianday('now') - 2440587.5) * 86400.0), ?3, ?4, ?5, 0, ?6, 'running', COALESCE(?2, (julianday('now') - 2440587.5) * 86400.0))
ON CONFLICT (request) DO NOTHING
RETURNING id;

-- name: bulk_job_by_request
SELECT id FROM receiver_bulk_jobs WHERE request = ?1;

-- name: bulk_job_total
UPDATE receiver_bulk_jobs
SET total = (SELECT count(*) FROM receiver_bulk_items WHERE job = ?1), audit_id = ?2
WHERE id = ?1
RETURNING total;

-- name: bulk_job_get
SELECT id, created_at, actor, reason, filter, total, done, rate, state, owner, lease_until,
       finished_at, audit_id, COALESCE(?2, (julianday('now') - 2440587.5) * 86400.0) AS now
FROM receiver_bulk_jobs
WHERE id = ?1;

-- name: bulk_job_list
SELECT id, created_at, actor, reason, filter, total, done, rate, state, owner, lease_until,
       finished_at, audit_id, (julianday('now') - 2440587.5) * 86400.0 AS now
FROM receiver_bulk_jobs
ORDER BY id DESC
LIMIT ?1;

-- name: bulk_job_orphan
SELECT id FROM receiver_bulk_jobs
WHERE state = 'running' AND lease_until <= COALESCE(?1, (julianday('now') - 2440587.5) * 86400.0)
ORDER BY lease_until
LIMIT 1;

-- name: bulk_job_lease
UPDATE receiver_bulk_jobs
SET owner = ?2, lease_until = COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0) + ?3
WHERE id = ?1 AND state = 'running'
  AND (owner = ?2 OR lease_until <= COALESCE(?4, (julianday('now') - 2440587.5) * 86400.0))
RETURNING id, rate;

-- name: bulk_job_cancel
UPDATE receiver_bulk_jobs
SET state = 'cancelled', finished_at = COALESCE(?2, (julianday('now') - 2440587.5) * 86400.0), owner = NULL
WHERE id = ?1 AND state = 'running'
RETURNING id, audit_id;

-- name: bulk_job_finish
UPDATE receiver_bulk_jobs
SET state = 'done', finished_at = COALESCE(?3, (julianday('now') - 2440587.5) * 86400.0), owner = NULL
WHERE id = ?1 AND state = 'running' AND owner = ?2
  AND NOT EXISTS (SELECT 1 FROM receiver_bulk_items i WHERE i.job = ?1 AND i.state <> 'done')
RETURNING id, audit_id;

-- name: bulk_items_next
SELECT seq, provider, webhook_id, fence, state FROM receiver_bulk_items
WHERE job = ?1 AND state <> 'done'
ORDER BY seq
LIMIT ?2;

-- name: bulk_item_started
-- An item (?2) whose replay begins: marked, so that a runner taking the job over after a crash
-- judges it from its receipt (the items still pending were never reached).
UPDATE receiver_bulk_items SET state = 'started'
WHERE job = ?1 AND seq = ?2 AND state = 'pending'
RETURNING seq;

-- name: bulk_item_done
UPDATE receiver_bulk_items SET state = 'done', outcome = ?3
WHERE job = ?1 AND seq = ?2 AND state <> 'done'
RETURNING seq;

-- name: bulk_job_progress
UPDATE receiver_bulk_jobs SET done = done + ?2 WHERE id = ?1 RETURNING done;

-- name: bulk_outcomes
SELECT outcome, count(*) AS n FROM receiver_bulk_items WHERE job = ?1 GROUP BY outcome;

-- Live numbers (receiver/_console/live.py): see console.postgresql.sql.

-- name: live_backlog
SELECT COALESCE(due_at, claimed_at) AS oldest
FROM receiver_receipts
WHERE provider = ?1 AND state IN ('queued', 'released')
ORDER BY COALESCE(due_at, claimed_at)
LIMIT 1;

-- name: live_recent
SELECT claimed_at, completed_at, state
FROM receiver_receipts
WHERE provider = ?1 AND claimed_at >= ?2
ORDER BY claimed_at DESC
LIMIT ?3;

-- name: live_failures
SELECT provider, failed_at
FROM receiver_attempts
WHERE failed_at >= ?1
ORDER BY failed_at DESC
LIMIT ?2;
