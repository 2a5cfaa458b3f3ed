-- The handler's other response headers, a JSON list of [name, value] pairs, replayed with the
-- stored answer.
ALTER TABLE receiver_receipts ADD COLUMN response_headers BLOB;
