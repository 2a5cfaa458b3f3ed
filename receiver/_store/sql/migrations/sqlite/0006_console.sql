-- The operator console (README "Operator console"): every action it takes is a row of
-- receiver_audit (who, when, what, why, and how it ended), and its lists read through indexes,
-- never the whole ledger: the newest receipts of a provider, failed attempts by time.
CREATE TABLE IF NOT EXISTS receiver_audit (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         REAL    NOT NULL,
    actor      TEXT    NOT NULL,
    action     TEXT    NOT NULL,
    provider   TEXT    NOT NULL,
    webhook_id TEXT    NOT NULL,
    fence      INTEGER,
    reason     TEXT    NOT NULL,
    outcome    TEXT,
    detail     TEXT
);
CREATE INDEX IF NOT EXISTS receiver_audit_at ON receiver_audit (at);
CREATE INDEX IF NOT EXISTS receiver_audit_key ON receiver_audit (provider, webhook_id);
CREATE INDEX IF NOT EXISTS receiver_receipts_provider_claimed
    ON receiver_receipts (provider, claimed_at);
CREATE INDEX IF NOT EXISTS receiver_attempts_failed_at ON receiver_attempts (failed_at);
