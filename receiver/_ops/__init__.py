"""Operating the ledger, shared by the four entry points: metrics and receipt counts,
redaction of what may be logged, the needs-review outcome, how long work takes (retry hints),
health and readiness, the client's address behind trusted proxies, and the sweeper that
recovers stale claims and deletes expired rows.

Imports ``_store`` and ``_ledger``, never an entry point: an entry point hands the sweeper its
own recovery as a function.
"""
