-- receiver: PostgreSQL schema of the receipt ledger, as the migrations in
-- receiver/_store/sql/migrations/postgresql/ leave it when applied in order (a test checks that the two
-- agree). Read it to know the tables; create and upgrade them with `receiver migrate`, which
-- applies the numbered migrations a database lacks and records them in receiver_migrations.
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
        CHECK (state IN ('in_flight', 'completed', 'failed', 'released', 'queued')),
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
    -- the handler's other response headers, a JSON list of [name, value] pairs (0002: added
    -- columns come last)
    response_headers      bytea,
    -- queued mode (0004): when a worker may next take the receipt; NULL for inline deliveries,
    -- kept after completion (it marks the receipt as a queued one)
    due_at                timestamptz,
    PRIMARY KEY (provider, webhook_id)
);

-- Expiry by state (0008): the sweeper reads completed receipts and dead letters apart.
CREATE INDEX IF NOT EXISTS receiver_receipts_completed_expiry
    ON receiver_receipts (expires_at) WHERE state = 'completed' AND expires_at < 'infinity';
CREATE INDEX IF NOT EXISTS receiver_receipts_dead_letter_expiry
    ON receiver_receipts (expires_at)
    WHERE state IN ('failed', 'released') AND expires_at < 'infinity';

CREATE INDEX IF NOT EXISTS receiver_receipts_in_flight
    ON receiver_receipts (lease_until) WHERE state = 'in_flight';

-- Queued mode: the workers' fetch reads only due rows, oldest first, however large the table.
CREATE INDEX IF NOT EXISTS receiver_receipts_due
    ON receiver_receipts (due_at) WHERE state = 'queued';

-- The metrics' per-state counts read released and failed receipts here, never the whole table.
CREATE INDEX IF NOT EXISTS receiver_receipts_released_failed
    ON receiver_receipts (provider, state, webhook_id) WHERE state IN ('released', 'failed');

-- Key drift (the metrics): is this payload already here under another webhook-id?
CREATE INDEX IF NOT EXISTS receiver_receipts_payload_hash
    ON receiver_receipts (payload_hash, provider);

-- The operator console (0006): a provider's newest receipts, read newest first.
CREATE INDEX IF NOT EXISTS receiver_receipts_provider_claimed
    ON receiver_receipts (provider COLLATE "C", claimed_at);

-- Every failed attempt of a delivery, for the dead-letter view and `receiver inspect`.
CREATE TABLE IF NOT EXISTS receiver_attempts (
    provider   text        NOT NULL,
    webhook_id text        NOT NULL,
    fence      bigint      NOT NULL,
    failed_at  timestamptz NOT NULL,
    error      text        NOT NULL,
    PRIMARY KEY (provider, webhook_id, fence)
);

-- The operator console's charts (0006): failed attempts by time.
CREATE INDEX IF NOT EXISTS receiver_attempts_failed_at
    ON receiver_attempts (failed_at);

-- Every action the operator console took (0006): who, when, what, why, and how it ended.
CREATE TABLE IF NOT EXISTS receiver_audit (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL,
    actor      text        NOT NULL,
    action     text        NOT NULL,
    provider   text        NOT NULL,
    webhook_id text        NOT NULL,
    -- the fence of the receipt the operator acted on
    fence      bigint,
    reason     text        NOT NULL,
    -- NULL while the action runs; then how it ended (executed, refused, ...), with a detail
    outcome    text,
    detail     text
);

CREATE INDEX IF NOT EXISTS receiver_audit_at ON receiver_audit (at);

CREATE INDEX IF NOT EXISTS receiver_audit_key ON receiver_audit (provider, webhook_id);

-- The console's server-side state (0007): signed-in sessions, bulk replays and their keys.
CREATE TABLE IF NOT EXISTS receiver_console_sessions (
    id          text        PRIMARY KEY,
    operator    text        NOT NULL,
    role        text        NOT NULL,
    credential  text        NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    notice      text
);

CREATE INDEX IF NOT EXISTS receiver_console_sessions_expires
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

CREATE INDEX IF NOT EXISTS receiver_bulk_jobs_running
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

CREATE INDEX IF NOT EXISTS receiver_bulk_items_todo
    ON receiver_bulk_items (job, seq) WHERE state <> 'done';

-- The live overview's backlog age (0007): the oldest queued or released delivery per provider.
CREATE INDEX IF NOT EXISTS receiver_receipts_backlog
    ON receiver_receipts (provider COLLATE "C", (COALESCE(due_at, claimed_at)))
    WHERE state IN ('queued', 'released');
