"""Every entry point has its sweeper (issue 19, item 9), on both stores: an executor built on a
bare store and the Idempotency-Key middleware recover what died and delete what expired in the
background, and ``receiver sweep --store URL`` does the same with no app."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver import Actions, IdempotencyKeyMiddleware, SQLiteStore, Store, ToolCall
from receiver._cli.main import main
from receiver._store.base import Connection
from tests.support import ROW_EXPIRY, Clock, SimulatedCrash, ledger_clock

DAY = 86_400.0


async def states(store: Store, namespace: str) -> list[str]:
    async with store.acquire() as conn:
        rows = await conn.fetch(
            "SELECT state FROM receiver_receipts WHERE provider LIKE $1 ORDER BY webhook_id",
            f"{namespace}:%",
        )
    return [r["state"] for r in rows]


async def eventually(check: Any, seconds: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await check():
        assert loop.time() < deadline, "the background sweeper did not get there in time"
        await asyncio.sleep(0.02)


@pytest.mark.single_layout(ROW_EXPIRY)
async def test_an_executor_on_a_bare_store_sweeps_in_the_background(store: Store) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    actions = Actions(store, registry=CollectorRegistry(), lease=30.0, window=DAY,
                      sweep_interval=0.05)  # fmt: skip
    runs: list[int] = []

    @actions.tool("note")
    async def note(call: ToolCall, tx: Connection) -> Any:
        runs.append(call.fence)
        if len(runs) == 1:
            raise SimulatedCrash("the process died mid-tool")
        return {"fence": call.fence}

    done = actions.propose("note", scope="t", action_id="a-done", request={})
    dead = actions.propose("note", scope="t", action_id="b-dead", request={})
    with pytest.raises(SimulatedCrash):
        await actions.execute(dead)
    await actions.execute(done)
    async with actions:
        clock.advance(31)  # the dead attempt's lease ran out; nobody retries it

        async def recovered() -> bool:
            return await states(store, "action") == ["completed", "completed"]

        await eventually(recovered)
        assert runs == [1, 1, 2]  # the dead one ran again, under the next fence
        clock.advance(2 * DAY)  # both windows ended

        async def deleted() -> bool:
            return await states(store, "action") == []

        await eventually(deleted)


class Endpoint:
    def __init__(self) -> None:
        self.crash = True

    async def pay(self, request: Request) -> Response:
        if self.crash:
            self.crash = False
            raise SimulatedCrash("the process died mid-request")
        return JSONResponse({"ok": True}, 201)


@pytest.mark.single_layout(ROW_EXPIRY)
async def test_the_middleware_sweeps_in_its_apps_lifespan(store: Store) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    endpoint = Endpoint()
    middleware = Middleware(
        IdempotencyKeyMiddleware, store=store, principal=lambda s: "t", lease=30.0, ttl=DAY,
        sweep_interval=0.05,
    )  # fmt: skip
    app = Starlette(routes=[Route("/pay", endpoint.pay, methods=["POST"])], middleware=[middleware])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        with pytest.raises(SimulatedCrash):
            await client.post("/pay", json={}, headers={"idempotency-key": '"k-1"'})
    assert await states(store, "idem") == ["in_flight"]
    startup = asyncio.Queue[dict[str, Any]]()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return await startup.get()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}},
                                       receive, send))  # fmt: skip
    await startup.put({"type": "lifespan.startup"})
    clock.advance(31)

    async def released() -> bool:
        return await states(store, "idem") == ["released"]

    await eventually(released)
    clock.advance(9 * DAY)  # past the window and the dead letters' retention

    async def deleted() -> bool:
        return await states(store, "idem") == []

    await eventually(deleted)
    await startup.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(lifespan, 5)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_receiver_sweep_store_needs_no_app(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.db"

    async def dead_request() -> None:
        async with SQLiteStore(path) as store:
            endpoint = Endpoint()
            app = IdempotencyKeyMiddleware(
                Starlette(routes=[Route("/pay", endpoint.pay, methods=["POST"])]),
                store=store, principal=lambda s: "t", lease=0.1, sweep_interval=None,
            )  # fmt: skip
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                with pytest.raises(SimulatedCrash):
                    await client.post("/pay", json={}, headers={"idempotency-key": '"k"'})
            assert await states(store, "idem") == ["in_flight"]

    asyncio.run(dead_request())
    import time

    time.sleep(0.2)  # the lease ran out
    assert main(["sweep", "--store", f"sqlite:///{path}"]) == 0
    assert "released 1" in capsys.readouterr().out

    async def after() -> list[str]:
        async with SQLiteStore(path) as store:
            return await states(store, "idem")

    assert asyncio.run(after()) == ["released"]
    assert main(["sweep", "--store", f"sqlite:///{path}", "--app", "handlers:rx"]) != 0
    assert "give one of them" in capsys.readouterr().err
