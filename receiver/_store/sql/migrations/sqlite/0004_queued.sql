-- Queued mode (README "Queued mode"): a new state 'queued' and the due_at column. SQLite cannot
-- alter a CHECK constraint, so the table is rebuilt (inside the migration's transaction).
CREATE TABLE receiver_receipts_0004 (
    provider              TEXT    NOT NULL,
    webhook_id            TEXT    NOT NULL,
    payload_hash          BLOB    NOT NULL,
    state                 TEXT    NOT NULL
        CHECK (state IN ('in_flight', 'completed', 'failed', 'released', 'queued')),
    fence                 INTEGER NOT NULL DEFAULT 1,
    event_type            TEXT,
    claimed_at            REAL    NOT NULL,
    lease_until           REAL    NOT NULL,
    expires_at            REAL    NOT NULL,
    completed_at          REAL,
    response_status       INTEGER,
    response_content_type TEXT,
    response_body         BLOB,
    response_headers      BLOB,
    request_body          BLOB,
    attempts              INTEGER NOT NULL DEFAULT 0,
    last_error            TEXT,
    due_at                REAL,
    PRIMARY KEY (provider, webhook_id)
) WITHOUT ROWID;
INSERT INTO receiver_receipts_0004
    (provider, webhook_id, payload_hash, state, fence, event_type, claimed_at, lease_until,
     expires_at, completed_at, response_status, response_content_type, response_body,
     response_headers, request_body, attempts, last_error)
SELECT provider, webhook_id, payload_hash, state, fence, event_type, claimed_at, lease_until,
       expires_at, completed_at, response_status, response_content_type, response_body,
       response_headers, request_body, attempts, last_error
FROM receiver_receipts;
DROP TABLE receiver_receipts;
ALTER TABLE receiver_receipts_0004 RENAME TO receiver_receipts;
CREATE INDEX IF NOT EXISTS receiver_receipts_expires_at
    ON receiver_receipts (expires_at);
CREATE INDEX IF NOT EXISTS receiver_receipts_in_flight
    ON receiver_receipts (lease_until) WHERE state = 'in_flight';
CREATE INDEX IF NOT EXISTS receiver_receipts_payload_hash
    ON receiver_receipts (payload_hash, provider);
CREATE INDEX IF NOT EXISTS receiver_receipts_released_failed
    ON receiver_receipts (provider, state, webhook_id) WHERE state IN ('released', 'failed');
