"""The queued mode's storage: deliveries recorded at ingest and answered 202 (``ingest``
batches them into one statement), then fetched, completed or retried with backoff
(``receipts``, ``backoff``). The worker that runs handlers on it is a webhook concern
(``_webhooks.worker``). Imports ``_store`` and ``_ledger``.
"""
