"""The idempotency proxy: the Idempotency-Key middleware's semantics in front of an upstream
that accepts no key (``app``), the upstream calls and which headers cross (``forward``), what
is kept of a request and handed to reconcile (``attempt``), and its metrics. Builds on the
shared layers and on the middleware's key parsing and answers (``_idempotency``).
"""
