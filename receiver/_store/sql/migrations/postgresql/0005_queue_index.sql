-- receiver: no-transaction
-- Queued mode: the workers' fetch reads only due rows, oldest first, however large the table.
-- CONCURRENTLY: the table is live and may be large; deliveries go on while the index builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS receiver_receipts_due
    ON receiver_receipts (due_at) WHERE state = 'queued';
