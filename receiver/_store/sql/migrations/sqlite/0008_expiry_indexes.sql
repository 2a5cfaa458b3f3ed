-- Expiry by state, each read from an index of its own: see the PostgreSQL migration.
CREATE INDEX IF NOT EXISTS receiver_receipts_completed_expiry
    ON receiver_receipts (expires_at) WHERE state = 'completed' AND expires_at < 9e999;
CREATE INDEX IF NOT EXISTS receiver_receipts_dead_letter_expiry
    ON receiver_receipts (expires_at)
    WHERE state IN ('failed', 'released') AND expires_at < 9e999;
DROP INDEX IF EXISTS receiver_receipts_expires_at;
