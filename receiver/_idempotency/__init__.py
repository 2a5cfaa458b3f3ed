"""The Idempotency-Key entry point: the ASGI middleware (``middleware``) that gives any POST
or PATCH endpoint the IETF draft's semantics on the same ledger, and the header's parser
(``key``). Imports the shared layers, never another entry point.
"""
