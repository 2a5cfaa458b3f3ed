"""Reading an action's or an Idempotency-Key's state without acting on it (issue 19, item 17):
``actions.inspect``, the middleware's ``inspect``, and ``receiver inspect`` / ``receiver
failed`` showing their rows, on both stores."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver import (
    ActionNeedsReview,
    Actions,
    IdempotencyKeyMiddleware,
    SQLiteStore,
    State,
    Store,
    ToolCall,
)
from receiver._cli.main import main
from receiver._store.base import Connection
from tests.support import Clock, SimulatedCrash, ledger_clock


async def test_an_actions_state_is_read_without_acting(store: Store) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    actions = Actions(store, registry=CollectorRegistry(), lease=30.0, sweep_interval=None)
    calls: list[int] = []

    @actions.tool("email", effects="external")
    async def email(call: ToolCall, tx: Connection) -> Any:
        calls.append(call.fence)
        if len(calls) == 1:
            raise SimulatedCrash("died after sending")
        return {"sent": True}

    action = actions.propose("email", scope="t", action_id="m-1", request={"to": "a@b"})
    assert await actions.inspect(action) is None  # never claimed
    with pytest.raises(SimulatedCrash):
        await actions.execute(action)
    clock.advance(31)
    state = await actions.inspect(action.key)  # by key: reading recovers nothing
    assert state is not None
    assert (state.state, state.fence, state.needs_review) == (State.IN_FLIGHT, 1, False)
    assert calls == [1]
    with pytest.raises(ActionNeedsReview):
        await actions.execute(action)  # no reconcile: a person must look
    state = await actions.inspect(action)
    assert state is not None
    assert (state.state, state.fence, state.needs_review) == (State.FAILED, 2, True)
    assert state.result is not None
    assert b"needs_review" in state.result
    assert state.attempts
    assert "reconcile" in state.attempts[-1].error


async def test_a_keyed_requests_state_is_read_without_acting(store: Store) -> None:
    async def pay(request: Request) -> Response:
        return JSONResponse({"paid": True}, 201)

    middleware = IdempotencyKeyMiddleware(
        Starlette(routes=[Route("/pay", pay, methods=["POST"])]),
        store=store, principal=lambda s: "tenant-1", sweep_interval=None,
    )  # fmt: skip
    transport = httpx.ASGITransport(app=middleware)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        await client.post("/pay", json={}, headers={"idempotency-key": '"k-7"'})
    state = await middleware.inspect("tenant-1", "k-7")
    assert state is not None
    assert (state.state, state.status, state.result) == (State.COMPLETED, 201, b'{"paid":true}')
    assert await middleware.inspect("tenant-2", "k-7") is None


def test_receiver_inspect_and_failed_show_action_and_key_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.db"

    async def fill() -> str:
        async with SQLiteStore(path) as store:
            actions = Actions(store, registry=CollectorRegistry(), sweep_interval=None)

            @actions.tool("refund")
            async def refund(call: ToolCall, tx: Connection) -> Any:
                raise RuntimeError("the bank timed out")

            action = actions.propose("refund", scope="t", action_id="o-1", request={"n": 1})
            with pytest.raises(RuntimeError):
                await actions.execute(action)

            async def pay(request: Request) -> Response:
                return JSONResponse({}, 201)

            app = IdempotencyKeyMiddleware(
                Starlette(routes=[Route("/pay", pay, methods=["POST"])]),
                store=store, principal=lambda s: "tenant-1", sweep_interval=None,
            )  # fmt: skip
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                await client.post("/pay", json={}, headers={"idempotency-key": '"k-1"'})
            return action.key

    key = asyncio.run(fill())
    url = f"sqlite:///{path}"
    assert main(["inspect", "action:refund", key, "--store", url]) == 0
    out = capsys.readouterr().out
    assert "agent action of tool refund" in out
    assert "released" in out
    assert "RuntimeError" in out
    assert main(["inspect", "idem:api", "k-1", "--principal", "tenant-1", "--store", url]) == 0
    out = capsys.readouterr().out
    assert "Idempotency-Key request of api: principal 'tenant-1', key 'k-1'" in out
    assert "completed" in out
    assert main(["failed", "--store", url]) == 0
    captured = capsys.readouterr()
    assert f"action:refund/{key}  released  kind=action" in captured.out
    assert "actions and Idempotency-Keys run again when their caller retries" in captured.err
