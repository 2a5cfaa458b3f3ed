-- receiver: no-transaction
-- Expiry by state, each read from an index of its own (receiver/_ops/sweeper.py): completed
-- receipts by the end of their window, dead letters (failed, or released after failed attempts)
-- by theirs. A sweep batch then reads the rows it deletes and nothing else; with one index over
-- every receipt's expiry, each batch of completed receipts first walked past every dead letter
-- still within its retention, fetching each one's row to read its state. Receipts in flight or
-- queued are in neither index (a claim writes one index entry fewer than before). The
-- predicates name expires_at < 'infinity' (true of every receipt they hold), which no keyed
-- statement states: a statement that reads one key with state = 'failed' can then never take
-- these small indexes for the primary key (issue 15's hazard; tests/integration/test_plans.py).
-- No transaction: the indexes are built and the old one dropped CONCURRENTLY on the live
-- table, so deliveries go on; every statement can run again after an interruption.
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_receipts_completed_expiry
    ON receiver_receipts (expires_at) WHERE state = 'completed' AND expires_at < 'infinity';
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_receipts_dead_letter_expiry
    ON receiver_receipts (expires_at)
    WHERE state IN ('failed', 'released') AND expires_at < 'infinity';
DROP INDEX CONCURRENTLY IF EXISTS receiver_receipts_expires_at;
