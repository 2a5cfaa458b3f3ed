"""A proxy process that SIGKILLs itself after the upstream answered and before the answer is
stored: its forwarding step (``proxy.app``) is wrapped so that the process dies the moment the
whole answer has been read. ``RECEIVER_STORE`` and ``RECEIVER_TEST_UPSTREAM`` configure it;
``RECEIVER_TEST_LEASE`` its lease (its timeout is half of it)."""

from __future__ import annotations

import os
import signal

from starlette.types import Message, Receive, Scope, Send

from receiver import IdempotencyProxy, store_from_url

LEASE = float(os.environ.get("RECEIVER_TEST_LEASE", "3"))

app = IdempotencyProxy(
    os.environ["RECEIVER_TEST_UPSTREAM"],
    store=store_from_url(os.environ["RECEIVER_STORE"]),
    store_owned=True,
    lease=LEASE,
    timeout=LEASE / 2,
)
_forward = app.app


async def _dies_after_the_answer(scope: Scope, receive: Receive, send: Send) -> None:
    async def swallow(message: Message) -> None:
        if message["type"] == "http.response.body":
            os.kill(os.getpid(), signal.SIGKILL)  # the answer is read, not stored

    await _forward(scope, receive, swallow)


app.app = _dies_after_the_answer
