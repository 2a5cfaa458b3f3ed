"""The stores: where the ledger's rows live and how its statements reach them.

``base`` defines the Store and Connection seam every layer above talks to; ``postgres``
(asyncpg) and ``sqlite`` (one writer, group commit in ``group_commit``) implement it;
``url`` picks one from a store URL. The SQL is in ``sql/``, one file per dialect, loaded by
``queries``; ``migrations`` applies the numbered schema files. Imports nothing of the package
but ``_exceptions`` and ``_logging``.
"""
