"""The application the external bulk replay tests run, in-process or in a real ``receiver
replay --app tests.console.externalapp:rx`` (its store from EXTERNAL_APP_STORE, its outside
system the directory EXTERNAL_APP_DIR): two ``effects="external"`` handlers whose effect is a
line appended (and fsynced) to ``effects`` in that directory, so that a test counts what
happened outside even when the process that did it was SIGKILLed before its receipt said so.

- ``payment.*`` has a ``reconcile`` that asks the outside system (reads ``effects``) and logs
  each call to ``reconciles``: an effect that happened is answered from it, one that did not
  is run again (RUN_AGAIN);
- ``transfer.*`` has none: an interrupted attempt is held for review.

While the file ``hold`` exists, a handler that has made its effect waits there (it is
"inside its external call", not yet answered): the test kills the process at that moment.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from receiver import RUN_AGAIN, Connection, Event, Provider, Receiver, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Claimed, Key
from receiver._verification.payload import parse
from receiver.testing import Sender, Webhook

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
PROVIDER = "pay"


def lines(outside: Path, name: str) -> list[str]:
    path = outside / name
    return path.read_text().splitlines() if path.exists() else []


def _append(outside: Path, name: str, line: str) -> None:
    with (outside / name).open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def make(store: Store | str, outside: Path) -> Receiver:
    # A short lease, so that an attempt killed with its process is taken over in seconds; no
    # sweeper, so that what reconciles is the bulk replay's takeover itself.
    rx = Receiver(
        store=store,
        providers=[Provider(PROVIDER, secrets=[SECRET], lease=2.0)],
        sweep_interval=None,
    )

    async def act(event: Event, tx: Connection) -> dict[str, Any]:
        _append(outside, "effects", event.id)
        for _ in range(1200):  # inside the external call (a minute at most): killed here
            if not (outside / "hold").exists():
                break
            await asyncio.sleep(0.05)
        return {"paid": event.id}

    async def reconcile(event: Event) -> Any:
        _append(outside, "reconciles", event.id)
        if event.id in lines(outside, "effects"):
            return {"paid": event.id, "reconciled": True}
        return RUN_AGAIN

    rx.add_handler("payment.*", act, effects="external", reconcile=reconcile)
    rx.add_handler("transfer.*", act, effects="external")
    return rx


async def fail_many(rx: Receiver, ids: list[str], event_type: str) -> None:
    """Released receipts, as a failed delivery leaves them (the body kept), written through
    the ledger's own functions."""
    store = rx.store
    async with Sender(rx, PROVIDER, SECRET) as sender, store.acquire() as conn, conn.transaction():
        for webhook_id in ids:
            webhook = sender.event(event_type, {"id": webhook_id}, id=webhook_id)
            digest = parse(webhook.body, event_type).payload_hash
            key = Key(PROVIDER, webhook_id)
            got = await ledger.claim(
                conn, Claim(key, digest, event_type, webhook.body, store.now(), 60, 86400)
            )
            assert isinstance(got, Claimed)
            assert await ledger.release(conn, key, got.fence, "TimeoutError: bank", store.now())


async def redeliver(rx: Receiver, webhook_id: str) -> int | None:
    """The sender's own retry of a stored delivery (the same body bytes, signed anew): its
    status."""
    async with rx.store.acquire() as conn:
        found = await ledger.lookup(conn, Key(PROVIDER, webhook_id))
    assert found is not None
    assert found.request_body is not None
    webhook = Webhook(PROVIDER, webhook_id, found.event_type or "", found.request_body)
    async with Sender(rx, PROVIDER, SECRET) as sender:
        return (await sender.send(webhook)).status


rx = make(
    os.environ.get("EXTERNAL_APP_STORE", "sqlite:///external-test.db"),
    Path(os.environ.get("EXTERNAL_APP_DIR", ".")),
)
