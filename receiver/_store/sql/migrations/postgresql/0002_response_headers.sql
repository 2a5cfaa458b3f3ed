-- The handler's other response headers, a JSON list of [name, value] pairs, replayed with the
-- stored answer. Nullable without a default, so PostgreSQL adds it without rewriting the table;
-- the lock it takes is brief, and lock_timeout keeps it from queueing behind a long transaction
-- (with every delivery queued behind it). If it times out, run `receiver migrate` again.
SET LOCAL lock_timeout = '5s';
ALTER TABLE receiver_receipts ADD COLUMN IF NOT EXISTS response_headers bytea;
