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
