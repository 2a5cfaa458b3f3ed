-- receiver: no-transaction
-- The operator console (README "Operator console"): every action it takes is a row of
-- receiver_audit (who, when, what, why, and how it ended), and its lists read through indexes,
-- never the whole ledger: the newest receipts of a provider, failed attempts by time.
-- The receipts' index is in the "C" collation, and the console's statements ask for it by name
-- (provider COLLATE "C" = $1): the keyed statements (provider = $1 AND webhook_id = $2) can
-- then never take it for the primary key, which a plan made on an empty table otherwise might
-- (walking every receipt of the provider for each delivery: issue 15).
-- No transaction: the index builds on the live receipts table run CONCURRENTLY, so that
-- deliveries go on while they build; every statement can run again after an interruption.
CREATE TABLE IF NOT EXISTS receiver_audit (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL,
    actor      text        NOT NULL,
    action     text        NOT NULL,
    provider   text        NOT NULL,
    webhook_id text        NOT NULL,
    fence      bigint,
    reason     text        NOT NULL,
    outcome    text,
    detail     text
);
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_audit_at ON receiver_audit (at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_audit_key
    ON receiver_audit (provider, webhook_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_receipts_provider_claimed
    ON receiver_receipts (provider COLLATE "C", claimed_at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_attempts_failed_at
    ON receiver_attempts (failed_at);
