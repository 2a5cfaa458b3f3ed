"""Inline group transactions on and off, alternately, in one run: ``python -m
benchmarks.inline_groups`` (``--pg-url``, ``--count``, ``--rounds``).

The receiver as ``benchmarks/app.py`` builds it, once with inline deliveries sharing group
transactions (the default) and once with every delivery alone (``inline_slots = 0``), each on a
freshly created database, ``--count`` fresh signed ~1 KiB deliveries 64 at a time straight to
the ASGI app (no HTTP), for a no-op handler and a handler that inserts one row through ``tx``.
Prints deliveries per second and Python CPU microseconds per delivery, per round.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from receiver import Connection, Event, PostgresStore, Provider, Receiver

from .business import EVENT_TYPE, INSERT, PROVIDER
from .costs import SECRET, _drive, _prepare_pg

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_costs"


async def _run(url: str, handler: str, groups: bool, count: int) -> tuple[int, int]:
    await _prepare_pg(url)
    rx = Receiver(PostgresStore(url), [Provider(PROVIDER, [SECRET])])

    async def noop(event: Event, tx: Connection) -> Any:
        return {"id": event.id}

    async def insert(event: Event, tx: Connection) -> Any:
        await tx.execute(INSERT, event.id, event.fence, 1)
        return {"id": event.id}

    rx.add_handler(EVENT_TYPE, noop if handler == "noop" else insert)
    if not groups:
        rx.pipeline.groups.inline_slots = 0
    async with rx:
        await _drive(rx, 200, 64, "w")
        started = time.perf_counter()
        ok, cpu = await _drive(rx, count, 64, "m")
        wall = time.perf_counter() - started
    return round(ok / wall), round(cpu / ok * 1e6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.inline_groups")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="dropped and created again")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for handler in ("noop", "insert"):
        for n in range(1, args.rounds + 1):
            alone = asyncio.run(_run(args.pg_url, handler, False, args.count))
            grouped = asyncio.run(_run(args.pg_url, handler, True, args.count))
            print(
                f"{handler:<6} round {n}: alone {alone[0]:>5,}/s {alone[1]:>4} us"
                f"  |  groups {grouped[0]:>5,}/s {grouped[1]:>4} us",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
