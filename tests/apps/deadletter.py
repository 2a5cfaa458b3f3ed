"""The app of tests/acceptance/test_dead_letter.py, for ``receiver replay --app``.

``order.created`` appends one line per invocation to the file named by
``RECEIVER_TEST_INVOCATIONS`` and fails while the file named by ``RECEIVER_TEST_BROKEN`` exists
(a downstream system that is down, then back).
"""

from __future__ import annotations

import os
from pathlib import Path

from receiver import Connection, Event, Provider, Receiver
from tests.support import EFFECTS_DDL, PROVIDER, SECRET


def _record(event: Event) -> None:
    with open(os.environ["RECEIVER_TEST_INVOCATIONS"], "a") as f:  # outside tx, on purpose
        f.write(f"{event.id} {event.fence}\n")


def _down() -> bool:
    return Path(os.environ["RECEIVER_TEST_BROKEN"]).exists()


def build(store: str) -> Receiver:
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])], sweep_interval=None)

    @rx.on_startup
    async def tables(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> dict[str, int]:
        _record(event)
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )
        if _down():
            raise RuntimeError("downstream is down")
        return {"fence": event.fence}

    return rx


rx = build(os.environ.get("RECEIVER_STORE", "sqlite:///receiver.db"))
