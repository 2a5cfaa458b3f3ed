"""The app of tests/acceptance/test_worker_logs.py: a queued provider whose ``order.*`` handler
executes, fails (webhook-ids ``fail-*``: retried once, then a dead letter) or rejects the
delivery with a final 422 (``reject-*``), so that one worker run logs every kind of attempt.
Its failure's message carries a ``password=`` pair, which the logs must mask."""

from __future__ import annotations

import os
from typing import Any

from starlette.responses import JSONResponse

from receiver import Backoff, Connection, Event, Provider, Receiver
from tests.support import PROVIDER, SECRET


def build(store: str) -> Receiver:
    rx = Receiver(
        store,
        [
            Provider(
                PROVIDER,
                [SECRET],
                mode="queued",
                retry=Backoff(attempts=2, base=0.2, cap=0.2),
            )
        ],
        sweep_interval=None,
    )

    @rx.on("order.*")
    async def order(event: Event, tx: Connection) -> Any:
        if event.id.startswith("fail-"):
            raise RuntimeError("downstream refused: password=hunter2-in-a-log")
        if event.id.startswith("reject-"):
            return JSONResponse({"error": "unknown customer"}, status_code=422)
        return {"ok": True}

    return rx


rx = build(os.environ.get("RECEIVER_STORE", "sqlite:///receiver.db"))
