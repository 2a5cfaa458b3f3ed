"""The webhook entry point: the ``Receiver`` ASGI app (``app``), one delivery's steps from
verification to the stored answer (``pipeline``; ``jobs`` is a delivery between steps,
``outcomes`` how it ends), the registered handlers and the events they get, providers with
their retry schedules and dedup windows, forwarded headers from trusted proxies, tracing, the
operator's replay, the recovery of stale receipts, and the queued mode's worker. Imports the
shared layers (``_store``, ``_ledger``, ``_verification``, ``_ops``, ``_queue``), never
another entry point.
"""
