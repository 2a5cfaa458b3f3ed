-- Released and failed receipts per provider, for the metrics, without reading the whole table.
CREATE INDEX IF NOT EXISTS receiver_receipts_released_failed
    ON receiver_receipts (provider, state, webhook_id) WHERE state IN ('released', 'failed');
