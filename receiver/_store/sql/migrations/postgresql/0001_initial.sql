-- receiver: PostgreSQL schema of the receipt ledger. Applied by `receiver migrate` (idempotent).
--
-- One row per (provider, webhook_id). The primary key is the arbiter of "exactly once": a claim
-- is one INSERT ... ON CONFLICT DO NOTHING, never a check followed by an insert. The SQL is kept
-- to what PostgreSQL-compatible distributed databases (Citus, YugabyteDB, CockroachDB) support,
-- so the table can be sharded by its key.

CREATE TABLE IF NOT EXISTS receiver_receipts (
    provider              text        NOT NULL,
    webhook_id            text        NOT NULL,
    -- sha256 of the normalized payload (sorted keys, no insignificant whitespace)
    payload_hash          bytea       NOT NULL,
    state                 text        NOT NULL
        CHECK (state IN ('in_flight', 'completed', 'failed', 'released')),
    -- grows on every claim of the key; completion and release are conditioned on it
    fence                 bigint      NOT NULL DEFAULT 1,
    event_type            text,
    claimed_at            timestamptz NOT NULL,
    lease_until           timestamptz NOT NULL,
    expires_at            timestamptz NOT NULL,
    completed_at          timestamptz,
    -- the stored answer, replayed byte for byte: bytea, because jsonb would reorder keys
    response_status       integer,
    response_content_type text,
    response_body         bytea,
    -- the verified request body, kept until completion so failed or stuck deliveries can be
    -- recovered, inspected and replayed
    request_body          bytea,
    attempts              integer     NOT NULL DEFAULT 0,
    last_error            text,
    PRIMARY KEY (provider, webhook_id)
);

CREATE INDEX IF NOT EXISTS receiver_receipts_expires_at
    ON receiver_receipts (expires_at);

CREATE INDEX IF NOT EXISTS receiver_receipts_in_flight
    ON receiver_receipts (lease_until) WHERE state = 'in_flight';

-- Key drift (the metrics): is this payload already here under another webhook-id?
CREATE INDEX IF NOT EXISTS receiver_receipts_payload_hash
    ON receiver_receipts (payload_hash, provider);

-- Every failed attempt of a delivery, for the dead-letter view and `receiver inspect`.
CREATE TABLE IF NOT EXISTS receiver_attempts (
    provider   text        NOT NULL,
    webhook_id text        NOT NULL,
    fence      bigint      NOT NULL,
    failed_at  timestamptz NOT NULL,
    error      text        NOT NULL,
    PRIMARY KEY (provider, webhook_id, fence)
);
