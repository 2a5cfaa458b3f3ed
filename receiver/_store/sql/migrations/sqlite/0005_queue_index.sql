-- Queued mode: the workers' fetch reads only due rows, oldest first, however large the table.
CREATE INDEX IF NOT EXISTS receiver_receipts_due
    ON receiver_receipts (due_at) WHERE state = 'queued';
