"""A queued-mode app for acceptance tests: ``receiver serve --app tests.apps.queued:rx`` takes
deliveries (202), ``receiver worker --app tests.apps.queued:rx`` runs them.

Its ``order.*`` handler appends one line per invocation (``id fence pid``) to the file named
by ``RECEIVER_TEST_INVOCATIONS`` (outside any transaction: a true count of executions,
committed or not), writes one ``effects`` row through ``tx``, sleeps ``RECEIVER_TEST_SLOW``
seconds, then SIGKILLs its own process if the webhook-id is listed in
``RECEIVER_TEST_CRASH_IDS`` and has not crashed a process yet (a marker file next to the
invocations file remembers it across processes). ``RECEIVER_TEST_FAIL=1`` makes it raise.
Only this test app reads these variables.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from receiver import Backoff, Connection, Event, Provider, Receiver
from tests.support import EFFECTS_DDL, PROVIDER

INVOCATIONS = os.environ.get("RECEIVER_TEST_INVOCATIONS")
SLOW = float(os.environ.get("RECEIVER_TEST_SLOW", "0"))
CRASH_IDS = set(filter(None, os.environ.get("RECEIVER_TEST_CRASH_IDS", "").split(",")))
FAIL = bool(os.environ.get("RECEIVER_TEST_FAIL"))

rx = Receiver(
    os.environ["RECEIVER_STORE"],
    [
        Provider(
            PROVIDER,
            os.environ["RECEIVER_SECRET"].split(","),
            mode="queued",
            lease=float(os.environ.get("RECEIVER_TEST_LEASE", "60")),
            retry=Backoff(attempts=3, base=0.5, cap=1.0),
        )
    ],
    sweep_interval=None,
)


@rx.on_startup
async def create_effects(conn: Connection) -> None:
    await conn.execute(EFFECTS_DDL)


def _count(event: Event) -> None:
    if INVOCATIONS:
        with open(INVOCATIONS, "a") as f:  # one tiny append, on purpose outside tx
            f.write(f"{event.id} {event.fence} {os.getpid()}\n")


def _crash_once(event: Event) -> None:
    if event.id in CRASH_IDS and INVOCATIONS:
        marker = Path(f"{INVOCATIONS}.crashed.{event.id}")
        if not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)


@rx.on("order.*")
async def record(event: Event, tx: Connection) -> Any:
    _count(event)
    await tx.execute(
        "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
        event.provider,
        event.id,
        event.fence,
        f"pid {os.getpid()}",
    )
    if SLOW:
        await asyncio.sleep(SLOW)
    _crash_once(event)
    if FAIL:
        raise RuntimeError("failing on purpose")
    return {"order": event.payload.get("data", {}).get("order")}
