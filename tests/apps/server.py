"""The app that acceptance tests run in a real ``receiver serve`` process.

Its ``order.*`` handler appends one line per invocation to the file named by
``RECEIVER_TEST_INVOCATIONS`` (outside any transaction: a true count of executions, committed
or not) and writes one ``effects`` row through ``tx``. ``RECEIVER_TEST_CRASH`` makes the process
SIGKILL itself at a hook point, once per webhook-id listed in ``RECEIVER_TEST_CRASH_IDS``:

- ``before_commit``: after the handler's write, before the transaction commits;
- ``after_commit``: after the receipt committed, before the HTTP answer is sent.

With ``RECEIVER_TEST_EXTERNAL`` set, a ``payment.created`` handler declared
``effects="external"`` is registered too: it appends its invocation line (its "external
effect") and obeys the same crash hooks. ``RECEIVER_TEST_RECONCILE`` chooses its reconcile:
``none`` (registered without one), ``done`` (answers ``{"reconciled": true}``) or ``again``
(answers ``RUN_AGAIN``).

Only this test app reads these variables; the library knows nothing of them.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from receiver import RUN_AGAIN, Connection, Event, Provider, Receiver
from tests.support import EFFECTS_DDL, PROVIDER

STORE = os.environ["RECEIVER_STORE"]
SECRETS = os.environ["RECEIVER_SECRET"].split(",")
INVOCATIONS = os.environ.get("RECEIVER_TEST_INVOCATIONS")
CRASH = os.environ.get("RECEIVER_TEST_CRASH", "")
CRASH_IDS = set(filter(None, os.environ.get("RECEIVER_TEST_CRASH_IDS", "").split(",")))
SLOW = float(os.environ.get("RECEIVER_TEST_SLOW", "0"))
EXTERNAL = bool(os.environ.get("RECEIVER_TEST_EXTERNAL"))
RECONCILE = os.environ.get("RECEIVER_TEST_RECONCILE", "none")

# Handoff (tests/acceptance/test_handoff_crash.py): RECEIVER_TEST_TIMEOUT is the provider's
# time limit, RECEIVER_TEST_HANDOFF turns handoff on, RECEIVER_TEST_SWEEP the sweep interval.
TIMEOUT = os.environ.get("RECEIVER_TEST_TIMEOUT")
rx = Receiver(
    STORE,
    [
        Provider(
            PROVIDER,
            SECRETS,
            lease=float(os.environ.get("RECEIVER_TEST_LEASE", "60")),
            timeout=float(TIMEOUT) if TIMEOUT else "preset",
            handoff=bool(os.environ.get("RECEIVER_TEST_HANDOFF")),
        )
    ],
    sweep_interval=float(os.environ.get("RECEIVER_TEST_SWEEP", "60")),
)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@rx.on_startup
async def create_effects(conn: Connection) -> None:
    await conn.execute(EFFECTS_DDL)


def _count(event: Event) -> None:
    if INVOCATIONS:
        with open(INVOCATIONS, "a") as f:  # one tiny append, on purpose outside tx
            f.write(f"{event.id} {event.fence} {os.getpid()}\n")


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
    if CRASH == "before_commit" and event.id in CRASH_IDS:
        _die()
    return {"order": event.payload.get("data", {}).get("order"), "fence": event.fence}


async def reconcile_payment(event: Event) -> Any:
    if RECONCILE == "again":
        return RUN_AGAIN
    return {"reconciled": True}


if EXTERNAL:
    if RECONCILE not in ("none", "done", "again"):
        raise ValueError(f"RECEIVER_TEST_RECONCILE must be none, done or again: {RECONCILE!r}")

    @rx.on(
        "payment.created",
        effects="external",
        reconcile=None if RECONCILE == "none" else reconcile_payment,
    )
    async def pay(event: Event, tx: Connection) -> Any:
        _count(event)  # the "outside world" this handler acts on
        if SLOW:
            await asyncio.sleep(SLOW)
        if CRASH == "before_commit" and event.id in CRASH_IDS:
            _die()
        return {"payment": event.payload.get("data", {}).get("payment"), "fence": event.fence}


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """The receiver, wrapped so that the after_commit hook can die before the answer is sent."""
    if CRASH != "after_commit" or scope["type"] != "http":
        await rx(scope, receive, send)
        return
    webhook_id = next((v.decode() for k, v in scope["headers"] if k == b"webhook-id"), None)

    async def guarded_send(message: Message) -> None:
        if message["type"] == "http.response.start" and webhook_id in CRASH_IDS:
            _die()  # the receipt is committed: the pipeline answers only after completing
        await send(message)

    await rx(scope, receive, guarded_send)


# -- behind a proxy (tests/acceptance/test_proxy.py) ---------------------------------------------
# RECEIVER_TEST_TRUSTED_PROXIES: the Receiver's trusted_proxies (comma-separated).
# RECEIVER_TEST_LOG: a file that gets one JSON line per "receiver" log record, with its extras
# (provider, webhook_id, outcome, request_id, ...), so that a test can read what was logged.
# The "echo.request" handler answers what it saw of the request, for byte-for-byte checks.

if os.environ.get("RECEIVER_TEST_TRUSTED_PROXIES"):
    from receiver._ops.forwarded import TrustedProxies

    rx.trusted_proxies = TrustedProxies(os.environ["RECEIVER_TEST_TRUSTED_PROXIES"])


@rx.on("echo.request")
async def echo(event: Event, tx: Connection) -> Any:
    import hashlib

    _count(event)
    return {
        "client": event.client,
        "size": len(event.body),
        "sha256": hashlib.sha256(event.body).hexdigest(),
        "request_id": event.headers.get("x-kong-request-id"),
    }


if os.environ.get("RECEIVER_TEST_LOG"):
    import json
    import logging

    class _JSONLines(logging.FileHandler):
        _PLAIN = frozenset(vars(logging.makeLogRecord({})))

        def format(self, record: logging.LogRecord) -> str:
            extras = {k: v for k, v in vars(record).items() if k not in self._PLAIN}
            return json.dumps({"message": record.getMessage(), **extras}, default=str)

    _log = logging.getLogger("receiver")
    _log.addHandler(_JSONLines(os.environ["RECEIVER_TEST_LOG"]))
    _log.setLevel(logging.INFO)
