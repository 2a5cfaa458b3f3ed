-- receiver: no-transaction
-- The console's server-side state (receiver/_console/sessions.py, bulk.py, live.py):
-- - receiver_console_sessions: one row per signed-in browser, keyed by the sha256 of its
--   cookie's random secret (a copy of the ledger gives no cookie). Sign-out deletes the row,
--   expiry makes it dead (and it is deleted on a later sign-in), so a copied cookie is dead
--   after either. The notice to show on the next page travels here, never in a URL.
-- - receiver_bulk_jobs and receiver_bulk_items: a bulk replay, its keys snapshotted when it is
--   confirmed (with the fence each had), run by whichever console or CLI holds the job's lease.
-- - receiver_receipts_backlog: the oldest queued or released delivery of a provider, in one
--   index probe (the live overview's backlog age).
-- No transaction: the index on the live receipts table is built CONCURRENTLY; every statement
-- can run again after an interruption.
CREATE TABLE IF NOT EXISTS receiver_console_sessions (
    id          text        PRIMARY KEY,
    operator    text        NOT NULL,
    role        text        NOT NULL,
    credential  text        NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    notice      text
);
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_console_sessions_expires
    ON receiver_console_sessions (expires_at);
CREATE TABLE IF NOT EXISTS receiver_bulk_jobs (
    id          bigserial   PRIMARY KEY,
    request     text        NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL,
    actor       text        NOT NULL,
    reason      text        NOT NULL,
    filter      text        NOT NULL,
    total       integer     NOT NULL,
    done        integer     NOT NULL DEFAULT 0,
    rate        float8      NOT NULL,
    state       text        NOT NULL CHECK (state IN ('running', 'cancelled', 'done')),
    owner       text,
    lease_until timestamptz NOT NULL,
    finished_at timestamptz,
    audit_id    bigint
);
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_bulk_jobs_running
    ON receiver_bulk_jobs (lease_until) WHERE state = 'running';
CREATE TABLE IF NOT EXISTS receiver_bulk_items (
    job         bigint  NOT NULL,
    seq         integer NOT NULL,
    provider    text    NOT NULL,
    webhook_id  text    NOT NULL,
    fence       bigint  NOT NULL,
    state       text    NOT NULL CHECK (state IN ('pending', 'started', 'done')),
    outcome     text,
    PRIMARY KEY (job, seq)
);
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_bulk_items_todo
    ON receiver_bulk_items (job, seq) WHERE state <> 'done';
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_receipts_backlog
    ON receiver_receipts (provider COLLATE "C", (COALESCE(due_at, claimed_at)))
    WHERE state IN ('queued', 'released');
