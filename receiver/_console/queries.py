"""What the console reads, at a cost that does not grow with the ledger.

Every list walks an index from a keyset cursor and stops after a bounded number of entries
(``SCAN``): a provider's newest receipts through ``receiver_receipts_provider_claimed``, the
small states through their partial indexes, the audit records by id. A filter that matches
rarely therefore never reads the whole table: the page says how far back it looked, and the
next page goes on from there. Counts per state are the metrics' (exact for the small states,
an estimate of the completed ones on a large PostgreSQL table: receiver/_ops/counts.py), and
each chart bucket counts at most ``SCAN`` entries, extrapolating a full bucket from the span
those entries cover.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._exceptions import ReceiverError
from .._ledger import keyed
from .._store.base import Connection, Row

#: Index entries one list walk (or one chart bucket) reads at most.
SCAN = 2_000
PAGE = 50


#: The ledger's integers (PostgreSQL's bigint marks, SQLite's integers, the audit's ids).
INT64_MAX = 2**63 - 1


class BadCursor(ReceiverError):
    """A page's cursor that the console did not write: answered 400, never sent to the
    database (a mark beyond 64 bits, or text with a NUL, is the driver's error there)."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page starts: strictly older than this (mark, provider, webhook-id)."""

    mark: int | float
    provider: str
    webhook_id: str

    def encode(self) -> str:
        return f"{self.mark!r}|{self.provider}|{self.webhook_id}"

    @classmethod
    def decode(cls, text: str, dialect: str) -> Cursor | None:
        """None for an empty cursor (the first page); :class:`BadCursor` for one that is not
        what :meth:`encode` writes for this store: a mark within 64 bits (PostgreSQL's integer
        microseconds, SQLite's seconds as a finite number), and two texts without a NUL."""
        if not text:
            return None
        mark, sep, rest = text.partition("|")
        provider, sep2, webhook_id = rest.partition("|")
        if not (sep and sep2) or "\x00" in rest:
            raise BadCursor(f"not a page cursor of this console: {text[:100]!r}")
        value: int | float
        if dialect == "postgresql":
            value = _integer(mark, -INT64_MAX - 1, "the cursor's mark")
        else:
            try:
                value = float(mark)
            except ValueError:
                raise BadCursor(f"the cursor's mark is not a number: {mark[:40]!r}") from None
            if not (math.isfinite(value) and abs(value) <= INT64_MAX):
                raise BadCursor(f"the cursor's mark is out of range: {mark[:40]!r}")
        return cls(value, provider, webhook_id)


def audit_cursor(text: str) -> int | None:
    """The audit page's ``before``: None for the newest page, else an id (1 to 2**63-1)."""
    if not text:
        return None
    return _integer(text, 1, "the audit's cursor")


def _integer(text: str, lowest: int, what: str) -> int:
    # Digits only: int() also takes "1_000", " 7 " and other spellings encode() never writes.
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
        raise BadCursor(f"{what} is not an integer: {text[:40]!r}")
    value = int(text)
    if not lowest <= value <= INT64_MAX:
        raise BadCursor(f"{what} is out of range: {text[:40]!r}")
    return value


@dataclass(frozen=True, slots=True)
class ReceiptRow:
    """One line of a list: a receipt without its bodies."""

    provider: str
    webhook_id: str
    state: str
    fence: int
    event_type: str | None
    attempts: int
    last_error: str | None
    claimed_at: float
    lease_until: float
    expires_at: float
    completed_at: float | None
    response_status: int | None
    queued: bool
    needs_review: bool
    mark: int | float
    now: float

    @classmethod
    def from_row(cls, row: Row) -> ReceiptRow:
        return cls(
            provider=row["provider"],
            webhook_id=row["webhook_id"],
            state=row["state"],
            fence=int(row["fence"]),
            event_type=row["event_type"],
            attempts=int(row["attempts"]),
            last_error=row["last_error"],
            claimed_at=float(row["claimed_at"]),
            lease_until=float(row["lease_until"]),
            expires_at=float(row["expires_at"]),
            completed_at=None if row["completed_at"] is None else float(row["completed_at"]),
            response_status=row["response_status"],
            queued=bool(row["queued"]),
            needs_review=bool(row["needs_review"]),
            mark=row["mark"],
            now=float(row["now"]),
        )

    @property
    def stale(self) -> bool:
        """In flight with its lease run out: the attempt died or stalled."""
        return self.state == "in_flight" and self.lease_until <= self.now

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.mark, self.provider, self.webhook_id)


@dataclass(frozen=True, slots=True)
class Filters:
    """A receipts list's filters; empty strings and None mean "any"."""

    kind: str = "webhook"  # webhook, action or idem: which providers are listed
    provider: str = ""
    state: str = ""
    event_type: str = ""
    prefix: str = ""  # of the webhook-id (for Idempotency-Keys: the principal's JSON prefix)
    since: float | None = None

    @property
    def narrowing(self) -> bool:
        """Filters applied to the walk's entries (the walk itself is by provider and time)."""
        return bool(self.state or self.event_type or self.prefix)


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[ReceiptRow]
    #: The next page's cursor, None at the end.
    next: Cursor | None
    #: Set when a filtered walk stopped before filling the page: how far back it looked.
    searched_to: float | None = None


def kind_of(provider: str) -> str:
    """``webhook``, ``action`` or ``idem`` (the idempotency proxy's keys too: the same
    principal and key, in front of an upstream)."""
    kind = keyed.namespace(provider) or "webhook"
    return "idem" if kind == "proxy" else kind


async def providers(conn: Connection) -> list[str]:
    """Every provider and namespace in the ledger (a loose index scan)."""
    return [r["provider"] for r in await conn.run_all("console_providers")]


async def list_receipts(
    conn: Connection,
    known: Sequence[str],
    filters: Filters,
    cursor: Cursor | None,
    now: float | None,
    *,
    page: int = PAGE,
    scan: int = SCAN,
) -> Page:
    """Receipts newest first, merged over the listed providers, each walked at most ``scan``
    entries below the cursor.

    Order: (claimed_at, provider, webhook-id), descending; ties within one provider keep the
    database's order of webhook-ids, so that the cursor means the same on both sides. A
    provider whose walk stopped short (its page full, or ``scan`` entries read) is complete
    only down to where it stopped: rows older than the highest such point wait for the next
    page, which starts there.
    """
    names = sorted(
        p
        for p in known
        if kind_of(p) == filters.kind and (not filters.provider or p == filters.provider)
    )
    per_provider: list[list[ReceiptRow]] = []
    # The highest point down to which every provider has been read: ((mark, provider), id).
    limit: tuple[tuple[int | float, str], str] | None = None
    for name in names:
        mark, before = _bound(cursor, name)
        rows = [
            ReceiptRow.from_row(r)
            for r in await conn.run_all(
                "console_receipts",
                name,
                mark,
                before,
                filters.since,
                filters.state,
                filters.event_type,
                filters.prefix,
                scan,
                page,
                now,
            )
        ]
        per_provider.append(rows)
        stop: tuple[tuple[int | float, str], str] | None = None
        if len(rows) == page:
            stop = ((rows[-1].mark, name), rows[-1].webhook_id)
        elif filters.narrowing:
            edge = await conn.run("console_horizon", name, mark, before, filters.since, scan)
            if edge is not None and int(edge["read"]) >= scan:
                stop = ((edge["mark"], name), edge["webhook_id"])
        if stop is not None and (limit is None or stop[0] > limit[0]):
            limit = stop
    merged = heapq.merge(*per_provider, key=lambda r: (r.mark, r.provider), reverse=True)
    shown: list[ReceiptRow] = []
    for row in merged:
        if limit is not None and (row.mark, row.provider) < limit[0]:
            break
        shown.append(row)
        if len(shown) == page:
            return Page(shown, shown[-1].cursor)
    if limit is None:
        return Page(shown, None)
    (mark, provider), webhook_id = limit
    searched = _seconds(mark, conn.dialect) if filters.narrowing else None
    return Page(shown, Cursor(mark, provider, webhook_id), searched_to=searched)


def _bound(cursor: Cursor | None, provider: str) -> tuple[Any, str | None]:
    """The walk's start for ``provider`` below the cursor: at the cursor's mark, a provider
    ordered after the cursor's (descending: shown before it) has nothing left there, the
    cursor's own provider continues below its webhook-id, and one ordered before it has all
    of its entries at that mark still to show."""
    if cursor is None:
        return None, None
    if provider == cursor.provider:
        return cursor.mark, cursor.webhook_id
    if provider > cursor.provider:
        return cursor.mark, ""
    return cursor.mark, None


def _seconds(mark: int | float, dialect: str) -> float:
    return mark / 1_000_000 if dialect == "postgresql" else float(mark)


async def attention(
    conn: Connection,
    which: str,
    provider: str,
    cursor: Cursor | None,
    now: float | None,
    page: int = PAGE,
) -> Page:
    """``failed``, ``needs_review`` and ``released`` receipts (the partial index of released
    and failed ones), or ``stale`` and ``in_flight`` ones (the in-flight partial index)."""
    mark, cursor_provider, cursor_id = (
        (None, None, None) if cursor is None else (cursor.mark, cursor.provider, cursor.webhook_id)
    )
    if which in ("stale", "in_flight"):
        statement = "console_in_flight"
        second: Any = which == "stale"
    else:
        statement, second = "console_dead_letters", which
    rows = [
        ReceiptRow.from_row(r)
        for r in await conn.run_all(
            statement, provider, second, mark, cursor_provider, cursor_id, page, now
        )
    ]
    return Page(rows, rows[-1].cursor if len(rows) == page else None)


@dataclass(frozen=True, slots=True)
class Bucket:
    start: float
    count: int
    #: True when the count is extrapolated from a partial read of a full bucket.
    estimated: bool


async def chart(
    conn: Connection,
    statement: str,
    prefix: Sequence[Any],
    start: float,
    step: float,
    buckets: int,
    cap: int = SCAN,
) -> list[Bucket]:
    """Counts per bucket from one chart statement (``prefix``: its leading parameters)."""
    rows = await conn.run_all(statement, *prefix, start, step, buckets, cap)
    found: list[Bucket] = []
    for row in rows:
        i, n, earliest = int(row["i"]), int(row["n"] or 0), row["earliest"]
        lo = start + i * step
        if n >= cap and earliest is not None:
            # The newest ``cap`` entries span [earliest, hi): the bucket's rate, extrapolated.
            covered = max(lo + step - float(earliest), step / 10_000)
            found.append(Bucket(lo, max(n, math.ceil(n * step / covered)), True))
        else:
            found.append(Bucket(lo, n, False))
    return found


def add(series: list[list[Bucket]]) -> list[Bucket]:
    """Bucket-wise sums of several series over the same buckets."""
    if not series:
        return []
    return [
        Bucket(parts[0].start, sum(b.count for b in parts), any(b.estimated for b in parts))
        for parts in zip(*series, strict=True)
    ]


@dataclass(frozen=True, slots=True)
class AuditRow:
    id: int
    at: float
    actor: str
    action: str
    provider: str
    webhook_id: str
    fence: int | None
    reason: str
    outcome: str | None
    detail: str | None

    @classmethod
    def from_row(cls, row: Row) -> AuditRow:
        return cls(
            id=int(row["id"]),
            at=float(row["at"]),
            actor=row["actor"],
            action=row["action"],
            provider=row["provider"],
            webhook_id=row["webhook_id"],
            fence=None if row["fence"] is None else int(row["fence"]),
            reason=row["reason"],
            outcome=row["outcome"],
            detail=row["detail"],
        )


async def audit(conn: Connection, before: int | None, page: int = PAGE) -> list[AuditRow]:
    return [AuditRow.from_row(r) for r in await conn.run_all("console_audit_list", before, page)]


async def audit_of(
    conn: Connection, provider: str, webhook_id: str, page: int = PAGE
) -> list[AuditRow]:
    rows = await conn.run_all("console_audit_of", provider, webhook_id, page)
    return [AuditRow.from_row(r) for r in rows]
