-- receiver: no-transaction
-- The metrics count receipts per provider and state after every sweeper pass. The in-flight
-- ones are read through receiver_receipts_in_flight; released and failed ones through this
-- index; the large completed state is estimated from the planner's statistics
-- (receiver/_ops/counts.py), so the cost no longer grows with the table.
-- CONCURRENTLY: the table is live and may be large; deliveries go on while the index builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_receipts_released_failed
    ON receiver_receipts (provider, state, webhook_id) WHERE state IN ('released', 'failed');
