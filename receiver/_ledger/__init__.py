"""The ledger: one row per key (a webhook-id, an action key, an Idempotency-Key), claimed,
completed, released and replayed with one statement each, under a lease and a fence.

``receipts`` holds the statements and the state machine; ``keyed`` the same for the executor's
and the middleware's keys; ``batcher`` and ``shared`` coalesce concurrent claims and
completions into one round trip; ``cache`` keeps completed answers per process; ``results``
and ``responses`` turn results into the stored bytes that are replayed. Imports only
``_store`` (and ``_exceptions``, ``_logging``).
"""
