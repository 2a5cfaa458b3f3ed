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
