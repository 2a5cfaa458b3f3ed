"""The tool of the experiment, the same under every runtime: a refund in the fake payment
service (``payments.py``), then, when the run is to crash, a marker file and a wait for the
SIGKILL, before the runtime records the step.

Two crash points: ``effect`` (the refund answered; the step has not returned: the executor has
not stored the result either) and ``recorded`` (the executor stored the result; the runtime has
not recorded the step). ``alone`` runs the refund straight from the step; ``executor`` runs it
through :class:`receiver.Actions` as an external tool whose ``reconcile`` looks the refund up by
the action's downstream key.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import httpx

from receiver import RUN_AGAIN, Actions, Connection, ToolCall

#: The executor's lease in the experiment: how long a killed attempt holds its key before the
#: recovered run reconciles it (short, so that recovery does not wait a minute).
LEASE = 1.0
CRASH_ENV = "RECEIVER_DURABLE_CRASH"  # "effect:<marker>" or "recorded:<marker>"


def crash_point() -> tuple[str, Path] | None:
    value = os.environ.get(CRASH_ENV)
    if not value:
        return None
    where, _, marker = value.partition(":")
    return where, Path(marker)


async def maybe_crash(where: str, got: Any) -> None:
    """At the crash point the run was started with: say so, then wait to be killed."""
    point = crash_point()
    if point is None or point[0] != where:
        return
    tmp = point[1].with_suffix(".tmp")
    tmp.write_text(repr(got))
    tmp.replace(point[1])
    await asyncio.sleep(120)
    raise SystemExit("not killed in 120 s")


class Payments:
    """The fake payment service's client (one per event loop: runtimes may run a recovered
    workflow on a loop of their own)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = httpx.AsyncClient(base_url=self.url, timeout=10)
        return self._clients[loop]

    async def refund(self, order: str, cents: int, key: str | None = None) -> dict[str, Any]:
        answer = await self._client().post(
            "/refunds", json={"order": order, "cents": cents, "key": key}
        )
        answer.raise_for_status()
        refund: dict[str, Any] = answer.json()
        return refund

    async def find(self, **query: str) -> list[dict[str, Any]]:
        answer = await self._client().get("/refunds", params=query)
        answer.raise_for_status()
        found: list[dict[str, Any]] = answer.json()
        return found


async def refund_alone(payments: Payments, order: str, cents: int) -> dict[str, Any]:
    """The step's body without the executor."""
    refund = await payments.refund(order, cents)
    await maybe_crash("effect", refund)
    return refund


def register(actions: Actions, payments: Payments) -> None:
    """The same refund as an external executor tool."""

    async def find_refund(call: ToolCall) -> Any:
        found = await payments.find(key=call.downstream_key)
        return found[0] if found else RUN_AGAIN

    @actions.tool("refund", effects="external", reconcile=find_refund)
    async def refund(call: ToolCall, tx: Connection) -> dict[str, Any]:
        got = await payments.refund(
            call.request["order"], call.request["cents"], key=call.downstream_key
        )
        await maybe_crash("effect", got)
        return got


class Timer:
    """Step latencies of one process, in seconds."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    def start(self) -> float:
        return time.perf_counter()

    def stop(self, began: float) -> None:
        self.samples.append(time.perf_counter() - began)
