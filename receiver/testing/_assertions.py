"""Assertions that read well in a failing test: each failure names the deliveries involved."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from .._store.base import Connection, Store

# Far enough in the future that every in-flight receipt's lease has run out by then: the
# sweeper's own "stale" statement then lists every in-flight receipt.
_END_OF_TIME = 253_402_300_799.0  # 9999-12-31T23:59:59Z
_LIST_LIMIT = 1000


class Attempted(Protocol):
    """One attempt as the kit saw it: a webhook `Delivery`, a tool's `Attempt`
    or an HTTP `Answer`; the assertions below take any of them."""

    @property
    def outcome(self) -> str: ...
    @property
    def replayed(self) -> bool: ...
    @property
    def answer(self) -> object: ...


A = TypeVar("A", bound=Attempted)


def _table(deliveries: Sequence[Attempted]) -> str:
    return "\n".join(f"  #{n} {d!r}" for n, d in enumerate(deliveries, 1))


def assert_executed_once(deliveries: Sequence[A]) -> A:
    """Exactly one of ``deliveries`` (all of one event) ran the handlers to a stored answer;
    every other was refused as in flight (409), failed and was retried (5xx), died, or was a
    byte-identical replay of that answer. Returns the executed one."""
    executed = [d for d in deliveries if d.outcome == "executed"]
    if len(executed) != 1:
        raise AssertionError(
            f"expected the handlers to run to a stored answer exactly once, "
            f"got {len(executed)} times:\n{_table(deliveries)}"
        )
    assert_replayed(executed[0], [d for d in deliveries if d.outcome == "replayed"])
    return executed[0]


def assert_replayed(first: Attempted, replays: Sequence[Attempted]) -> None:
    """Each of ``replays`` is marked ``Idempotent-Replayed: true`` and repeats ``first``'s
    status, content type and body byte for byte."""
    for replay in replays:
        if not replay.replayed:
            raise AssertionError(f"not a replay: {replay!r} (the first answer: {first!r})")
        if replay.answer != first.answer:
            raise AssertionError(
                "a replay differs from the first answer:\n"
                f"  first:  {first.answer!r}\n  replay: {replay.answer!r}"
            )


async def in_flight(store: Store, provider: str | None = None) -> list[str]:
    """``provider/webhook-id`` of every receipt still in flight (claimed, never finished)."""
    async with store.acquire() as conn:
        # Inline claims, and queued deliveries a worker took (and perhaps died on): the
        # sweeper's query leaves those to the workers' own.
        rows = await conn.run_all("stale", _END_OF_TIME, _LIST_LIMIT)
        rows += await conn.run_all("queue_stale", _END_OF_TIME, _LIST_LIMIT)
    return [
        f"{r['provider']}/{r['webhook_id']} (fence {r['fence']})"
        for r in rows
        if provider is None or r["provider"] == provider
    ]


async def assert_nothing_in_flight(store: Store, provider: str | None = None) -> None:
    """No receipt is left in flight: every claim was completed, released or failed. Run it
    after the recovery (a redelivery or ``await rx.sweep()`` once the leases expired)."""
    left = await in_flight(store, provider)
    if left:
        raise AssertionError(f"{len(left)} receipt(s) left in flight: " + ", ".join(left[:20]))


async def count(store: Store | Connection, query: str, *args: Any) -> int:
    """The integer a ``SELECT count(*) ...`` query of the user's own tables returns
    (``$1, $2`` placeholders on every store)."""
    if isinstance(store, Connection):
        return int(await store.fetchval(query, *args) or 0)
    async with store.acquire() as conn:
        return int(await conn.fetchval(query, *args) or 0)


async def assert_count(store: Store | Connection, expected: int, query: str, *args: Any) -> None:
    """The user's own count query returns ``expected``, e.g. one row per order:

    ```python
    await assert_count(store, 1, "SELECT count(*) FROM orders WHERE id = $1", "o-1")
    ```
    """
    found = await count(store, query, *args)
    if found != expected:
        raise AssertionError(f"expected {expected}, counted {found}: {query} {list(args)!r}")
