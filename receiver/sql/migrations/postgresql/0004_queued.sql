-- Queued mode (README "Queued mode"): a delivery can be recorded with its raw body, answered
-- 202, and processed later by workers. A queued receipt waits in state 'queued' until its
-- due_at; due_at stays set afterwards and marks the receipt as a queued one.
ALTER TABLE receiver_receipts DROP CONSTRAINT IF EXISTS receiver_receipts_state_check;
ALTER TABLE receiver_receipts ADD CONSTRAINT receiver_receipts_state_check
    CHECK (state IN ('in_flight', 'completed', 'failed', 'released', 'queued'));
ALTER TABLE receiver_receipts ADD COLUMN IF NOT EXISTS due_at timestamptz;
-- The workers' fetch reads only due rows, oldest first, however large the table. No row is
-- queued before this migration, so the partial index is empty when built.
CREATE INDEX IF NOT EXISTS receiver_receipts_due
    ON receiver_receipts (due_at) WHERE state = 'queued';
