-- receiver: SQLite schema of the receipt ledger (the embedded default store).
-- Same columns and meaning as schema.sql (PostgreSQL); times are unix seconds (REAL), because
-- SQLite has no timestamp type and the ledger only compares and orders them.

CREATE TABLE IF NOT EXISTS receiver_receipts (
    provider              TEXT    NOT NULL,
    webhook_id            TEXT    NOT NULL,
    payload_hash          BLOB    NOT NULL,
    state                 TEXT    NOT NULL
        CHECK (state IN ('in_flight', 'completed', 'failed', 'released')),
    fence                 INTEGER NOT NULL DEFAULT 1,
    event_type            TEXT,
    claimed_at            REAL    NOT NULL,
    lease_until           REAL    NOT NULL,
    expires_at            REAL    NOT NULL,
    completed_at          REAL,
    response_status       INTEGER,
    response_content_type TEXT,
    response_body         BLOB,
    request_body          BLOB,
    attempts              INTEGER NOT NULL DEFAULT 0,
    last_error            TEXT,
    PRIMARY KEY (provider, webhook_id)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS receiver_receipts_expires_at
    ON receiver_receipts (expires_at);

CREATE INDEX IF NOT EXISTS receiver_receipts_in_flight
    ON receiver_receipts (lease_until) WHERE state = 'in_flight';

-- Key drift (the metrics): is this payload already here under another webhook-id?
CREATE INDEX IF NOT EXISTS receiver_receipts_payload_hash
    ON receiver_receipts (payload_hash, provider);

CREATE TABLE IF NOT EXISTS receiver_attempts (
    provider   TEXT    NOT NULL,
    webhook_id TEXT    NOT NULL,
    fence      INTEGER NOT NULL,
    failed_at  REAL    NOT NULL,
    error      TEXT    NOT NULL,
    PRIMARY KEY (provider, webhook_id, fence)
) WITHOUT ROWID;
