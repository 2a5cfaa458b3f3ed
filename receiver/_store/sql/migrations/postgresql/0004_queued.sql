-- Queued mode (README "Queued mode"): a delivery can be recorded with its raw body, answered
-- 202, and processed later by workers. A queued receipt waits in state 'queued' until its
-- due_at; due_at stays set afterwards and marks the receipt as a queued one. (The workers'
-- index is built by 0005, concurrently.)
ALTER TABLE receiver_receipts DROP CONSTRAINT IF EXISTS receiver_receipts_state_check;
ALTER TABLE receiver_receipts ADD CONSTRAINT receiver_receipts_state_check
    CHECK (state IN ('in_flight', 'completed', 'failed', 'released', 'queued'));
ALTER TABLE receiver_receipts ADD COLUMN IF NOT EXISTS due_at timestamptz;
