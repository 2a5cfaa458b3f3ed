-- The console's server-side state (receiver/_console/sessions.py, bulk.py, live.py):
-- - receiver_console_sessions: one row per signed-in browser, keyed by the sha256 of its
--   cookie's random secret (a copy of the ledger gives no cookie). Sign-out deletes the row,
--   expiry makes it dead (and it is deleted on a later sign-in), so a copied cookie is dead
--   after either. The notice to show on the next page travels here, never in a URL.
-- - receiver_bulk_jobs and receiver_bulk_items: a bulk replay, its keys snapshotted when it is
--   confirmed (with the fence each had), run by whichever console or CLI holds the job's lease.
-- - receiver_receipts_backlog: the oldest queued or released delivery of a provider, in one
--   index probe (the live overview's backlog age).
CREATE TABLE IF NOT EXISTS receiver_console_sessions (
    id          TEXT PRIMARY KEY,
    operator    TEXT NOT NULL,
    role        TEXT NOT NULL,
    credential  TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,
    notice      TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS receiver_console_sessions_expires
    ON receiver_console_sessions (expires_at);
CREATE TABLE IF NOT EXISTS receiver_bulk_jobs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    request     TEXT    NOT NULL UNIQUE,
    created_at  REAL    NOT NULL,
    actor       TEXT    NOT NULL,
    reason      TEXT    NOT NULL,
    filter      TEXT    NOT NULL,
    total       INTEGER NOT NULL,
    done        INTEGER NOT NULL DEFAULT 0,
    rate        REAL    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('running', 'cancelled', 'done')),
    owner       TEXT,
    lease_until REAL    NOT NULL,
    finished_at REAL,
    audit_id    INTEGER
);
CREATE INDEX IF NOT EXISTS receiver_bulk_jobs_running
    ON receiver_bulk_jobs (lease_until) WHERE state = 'running';
CREATE TABLE IF NOT EXISTS receiver_bulk_items (
    job         INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    provider    TEXT    NOT NULL,
    webhook_id  TEXT    NOT NULL,
    fence       INTEGER NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('pending', 'started', 'done')),
    outcome     TEXT,
    PRIMARY KEY (job, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS receiver_bulk_items_todo
    ON receiver_bulk_items (job, seq) WHERE state <> 'done';
CREATE INDEX IF NOT EXISTS receiver_receipts_backlog
    ON receiver_receipts (provider, COALESCE(due_at, claimed_at))
    WHERE state IN ('queued', 'released');
