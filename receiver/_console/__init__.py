"""The operator console: server-rendered pages over the ledger, and the few actions an operator
takes on it (replay, a confirmed re-run, settling what needs review, bulk replay), each an audit
record.

It holds the ASGI app and its routes (``app``), token sign-in and CSRF (``auth``), sessions and
notices kept in the ledger (``sessions``), the read side (``queries``: bounded, index-backed
lists) and the write side (``actions``, with their routes in ``operate``), bulk replay jobs
(``bulk``, pages in ``bulk_pages``), the live overview and its event stream (``live``), the
pages (``pages``, ``html`` and the ``*.html`` templates, ``console.css``), server-rendered SVG
charts (``charts``) and the redaction of what it shows (``redaction``). It loads nothing from
the internet; its one script (``live.js``) only updates the live overview, and every page works
without it.

It imports the shared layers only (the store, the ledger, operations, verification) and the
Receiver structurally (``actions.ReceiverLike``), so the entry points may mount it without a cycle.
"""

from __future__ import annotations

from .app import Console

__all__ = ["Console"]
