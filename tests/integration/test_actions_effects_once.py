"""Once an external tool has acted, nothing runs it again (issue 19, items 1, 3, 6 and 11), on
both stores: results that are not plain JSON are stored exactly, what cannot be stored is a
needs-review outcome every retry sees, an unfinished attempt past its window is reconciled,
a failing reconcile() keeps the key unresolved, and a cancelled attempt is released at once
(transactional) or left for reconcile (external)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import enum
import logging
import math
import uuid
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from receiver import (
    RUN_AGAIN,
    ActionError,
    ActionFailed,
    ActionInProgress,
    ActionNeedsReview,
    Actions,
    Store,
    ToolCall,
)
from receiver._ledger import keyed
from receiver._ledger.receipts import Claimed, Key, State, StoredResponse
from receiver._store.base import Connection
from tests.support import EFFECTS_DDL, Clock, SimulatedCrash, ledger_clock

TENANT = "tenant-7"
WEEK = 7 * 86_400.0


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Receipt:
    amount: decimal.Decimal
    at: dt.datetime
    id: uuid.UUID
    color: Color


class SdkResponse:
    """What the OpenAI and Anthropic SDKs return: a Pydantic model (duck-typed here, as the
    executor sees it: ``model_dump(mode="json")``)."""

    def __init__(self, id: str, total: decimal.Decimal) -> None:
        self.id, self.total = id, total

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        assert mode == "json"
        return {"id": self.id, "total": str(self.total)}


class Opaque:
    """An SDK object with no JSON form."""

    def __repr__(self) -> str:
        return "Opaque(card=4111111111111111)"  # a value that must never reach a log


async def executor(store: Store, **options: Any) -> Actions:
    async with store.acquire() as conn:
        await conn.execute(EFFECTS_DDL)
    return Actions(store, registry=CollectorRegistry(), **options)


async def state_of(store: Store, tool: str, key: str) -> tuple[State, str | None]:
    receipt = await keyed.lookup(store, Key(f"action:{tool}", key))
    assert receipt is not None
    return receipt.state, receipt.last_error


@pytest.mark.parametrize(
    ("returned", "stored"),
    [
        (decimal.Decimal("10000000000000001.10"), b"10000000000000001.10"),
        ({"total": decimal.Decimal("0.1")}, b'{"total":0.1}'),
        (SdkResponse("resp_1", decimal.Decimal("2.50")), b'{"id":"resp_1","total":"2.50"}'),
        (
            Receipt(
                decimal.Decimal("12.30"),
                dt.datetime(2026, 12, 4, tzinfo=dt.UTC),
                uuid.UUID(int=7),
                Color.RED,
            ),
            b'{"amount":12.30,"at":"2026-12-04T00:00:00+00:00",'
            b'"id":"00000000-0000-0000-0000-000000000007","color":"red"}',
        ),
        (
            {"order": 2**64, "ids": [-(2**70)]},
            b'{"order":18446744073709551616,"ids":[-1180591620717411303424]}',
        ),
    ],
    ids=["decimal", "nested-decimal", "pydantic-like", "dataclass", "beyond-64-bits"],
)
async def test_an_external_tools_result_is_stored_exactly_and_never_rerun(
    store: Store, returned: Any, stored: bytes
) -> None:
    actions = await executor(store)
    calls: list[int] = []

    @actions.tool("pay", effects="external")
    async def pay(call: ToolCall, tx: Connection) -> Any:
        calls.append(call.fence)
        return returned

    action = actions.propose("pay", scope=TENANT, action_id="p-1", request={"amount": 1})
    first = await actions.execute(action)
    assert first.body == stored
    again = Actions(store, registry=CollectorRegistry())  # another process: from the ledger
    again.add_tool("pay", pay, effects="external")
    replayed = await again.execute(action)
    assert (replayed.body, replayed.replayed) == (stored, True)
    if isinstance(returned, dict) and "order" in returned:  # exact, not a float
        assert replayed.value == first.value == returned
    assert calls == [1]


async def test_an_external_tool_whose_result_cannot_be_stored_needs_review_once(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    actions = await executor(store)
    calls: list[int] = []

    @actions.tool("pay", effects="external")
    async def pay(call: ToolCall, tx: Connection) -> Any:
        calls.append(call.fence)
        return {"charge": Opaque()}

    action = actions.propose("pay", scope=TENANT, action_id="p-2", request={"amount": 1})
    with caplog.at_level(logging.ERROR), pytest.raises(ActionNeedsReview):
        await actions.execute(action)
    for _ in range(3):  # every retry sees the stored outcome; the tool never runs again
        with pytest.raises(ActionNeedsReview, match="Opaque"):
            await actions.execute(action)
    assert calls == [1]
    assert (await state_of(store, "pay", action.key))[0] is State.FAILED
    alerts = [r.getMessage() for r in caplog.records if "ALERT:" in r.getMessage()]
    assert alerts
    assert "Opaque" in alerts[0]
    assert "4111" not in caplog.text


async def test_an_encoder_hook_stores_what_else_could_not_be(store: Store) -> None:
    actions = await executor(store, encoder=lambda obj: {"opaque": type(obj).__name__})

    @actions.tool("pay", effects="external")
    async def pay(call: ToolCall, tx: Connection) -> Any:
        return Opaque()

    action = actions.propose("pay", scope=TENANT, action_id="p-3", request={"amount": 1})
    assert (await actions.execute(action)).value == {"opaque": "Opaque"}


async def test_a_transactional_tools_unstorable_result_releases_its_rolled_back_attempt(
    store: Store,
) -> None:
    actions = await executor(store)
    answers: list[Any] = [Opaque(), {"ok": True}]

    @actions.tool("note")
    async def note(call: ToolCall, tx: Connection) -> Any:
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            "note",
            call.action.key,
            call.fence,
        )
        return answers.pop(0)

    action = actions.propose("note", scope=TENANT, action_id="n-1", request={})
    with pytest.raises(ActionError, match="Opaque"):
        await actions.execute(action)
    assert (await actions.execute(action)).value == {"ok": True}  # nothing of it committed
    async with store.acquire() as conn:
        rows = await conn.fetchval("SELECT count(*) FROM effects WHERE webhook_id = $1", action.key)
    assert rows == 1


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
async def test_nan_or_an_infinity_is_refused_never_stored_as_null(
    store: Store, number: float
) -> None:
    """JSON has no NaN or infinity; written as null, the replay would differ from the call."""
    actions = await executor(store)
    calls: list[int] = []

    @actions.tool("rate")
    async def rate(call: ToolCall, tx: Connection) -> Any:
        calls.append(call.fence)
        return {"ratio": number} if call.action.request.get("ok") else {"ratio": 0.5}

    with pytest.raises(ActionError, match=r"NaN or an infinity at x"):
        actions.propose("rate", scope=TENANT, action_id="r-1", request={"x": [1, number]})
    async with store.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM receiver_receipts") == 0
    answered = actions.propose("rate", scope=TENANT, action_id="r-2", request={"ok": True})
    with pytest.raises(ActionError, match=r"float \(NaN or infinite\)"):
        await actions.execute(answered)
    assert (await state_of(store, "rate", answered.key))[0] is not State.COMPLETED

    @actions.tool("charge", effects="external")
    async def charge(call: ToolCall, tx: Connection) -> Any:
        calls.append(call.fence)
        return [number]

    charged = actions.propose("charge", scope=TENANT, action_id="c-9", request={})
    for _ in range(2):  # acted: a person looks; the tool is never run again
        with pytest.raises(ActionNeedsReview, match=r"float \(NaN or infinite\)"):
            await actions.execute(charged)
    assert calls == [1, 1]


@pytest.mark.parametrize("reconcile", [True, False])
async def test_an_unfinished_external_attempt_past_its_window_is_never_rerun(
    store: Store, reconcile: bool
) -> None:
    """A stalled task resumed a week later: the dead attempt's receipt expired long ago, but
    it is unfinished, so it is reconciled (or marked for review), not reclaimed and re-run."""
    clock = Clock()
    ledger_clock(store, clock)
    actions = await executor(store, lease=30.0)
    calls: list[int] = []
    reconciled: list[int] = []
    crash = [True]

    async def find(call: ToolCall) -> Any:
        reconciled.append(call.fence)
        return {"charge": "ch_1", "reconciled": True}

    @actions.tool("charge", effects="external", reconcile=find if reconcile else None)
    async def charge(call: ToolCall, tx: Connection) -> Any:
        calls.append(call.fence)
        if crash.pop():
            raise SimulatedCrash("the process died after the charge")
        return {"charge": "ch_1"}

    action = actions.propose("charge", scope=TENANT, action_id="c-1", request={"amount": 5})
    with pytest.raises(SimulatedCrash):
        await actions.execute(action)
    clock.advance(WEEK + 3600)
    if reconcile:
        assert (await actions.execute(action)).value == {"charge": "ch_1", "reconciled": True}
        assert reconciled == [2]
    else:
        with pytest.raises(ActionNeedsReview):
            await actions.execute(action)
    assert calls == [1]


async def test_a_failing_reconcile_keeps_the_key_unresolved_never_released(
    store: Store,
) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    actions = await executor(store, lease=30.0, wait=0.0)
    calls: list[int] = []
    outside_is_down = [True, True, False]

    async def find(call: ToolCall) -> Any:
        if outside_is_down.pop(0):
            raise ConnectionError("the payment API is down")
        return RUN_AGAIN

    @actions.tool("charge", effects="external", reconcile=find)
    async def charge(call: ToolCall, tx: Connection) -> Any:
        calls.append(call.fence)
        if len(calls) == 1:
            raise SimulatedCrash("died mid-call")
        return {"charge": "ch_1"}

    action = actions.propose("charge", scope=TENANT, action_id="c-2", request={"amount": 5})
    with pytest.raises(SimulatedCrash):
        await actions.execute(action)
    clock.advance(31)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            await actions.execute(action)
        state, error = await state_of(store, "charge", action.key)
        assert state is State.IN_FLIGHT  # not released: a retry must not call the tool
        assert error is not None
        assert error.startswith("reconcile: ConnectionError")
    assert calls == [1]
    # The outside system answers at last: it never saw the call, so it runs once more.
    assert (await actions.execute(action)).value == {"charge": "ch_1"}
    assert len(calls) == 2


async def test_a_cancelled_transactional_attempt_is_released_at_once(store: Store) -> None:
    actions = await executor(store, lease=60.0, wait=0.0)
    started = asyncio.Event()
    slow = [True, False]

    @actions.tool("note")
    async def note(call: ToolCall, tx: Connection) -> Any:
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            "note",
            call.action.key,
            call.fence,
        )
        if slow.pop(0):
            started.set()
            await asyncio.sleep(30)
        return {"fence": call.fence}

    action = actions.propose("note", scope=TENANT, action_id="n-2", request={})
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(actions.execute(action), 0.3)
    assert started.is_set()
    state, error = await state_of(store, "note", action.key)
    assert state is State.RELEASED
    assert error == "CancelledError: "
    # The retry runs at once: no "in progress" for the rest of the 60 s lease.
    assert (await actions.execute(action)).value == {"fence": 2}
    async with store.acquire() as conn:
        rows = await conn.fetchval("SELECT count(*) FROM effects WHERE webhook_id = $1", action.key)
    assert rows == 1


async def test_a_cancelled_external_attempt_is_left_for_reconcile(store: Store) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    actions = await executor(store, lease=30.0, wait=0.0)
    calls: list[int] = []
    reconciled: list[int] = []

    async def find(call: ToolCall) -> Any:
        reconciled.append(call.fence)
        return {"charge": "ch_1", "reconciled": True}

    @actions.tool("charge", effects="external", reconcile=find)
    async def charge(call: ToolCall, tx: Connection) -> Any:
        calls.append(call.fence)
        await asyncio.sleep(30)  # the API call hangs; the agent's timeout cuts it off
        return {"charge": "ch_1"}

    action = actions.propose("charge", scope=TENANT, action_id="c-3", request={"amount": 5})
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(actions.execute(action), 0.3)
    assert (await state_of(store, "charge", action.key))[0] is State.IN_FLIGHT
    with pytest.raises(ActionInProgress):  # ambiguous: nobody may call it again yet
        await actions.execute(action)
    clock.advance(31)
    assert (await actions.execute(action)).value == {"charge": "ch_1", "reconciled": True}
    assert (calls, reconciled) == ([1], [2])


async def test_a_failed_attempts_stored_error_carries_no_payload_value(store: Store) -> None:
    actions = await executor(store)

    @actions.tool("signup")
    async def signup(call: ToolCall, tx: Connection) -> Any:
        await tx.execute("CREATE TABLE IF NOT EXISTS people (email TEXT PRIMARY KEY)")
        await tx.execute("INSERT INTO people (email) VALUES ($1)", call.request["email"])
        await tx.execute("INSERT INTO people (email) VALUES ($1)", call.request["email"])
        return {}

    action = actions.propose(
        "signup", scope=TENANT, action_id="s-1", request={"email": "alice@example.com"}
    )
    with pytest.raises(Exception, match=r"(?i)unique"):
        await actions.execute(action)
    state, error = await state_of(store, "signup", action.key)
    assert state is State.RELEASED
    assert error is not None
    assert "alice" not in error


def test_needs_review_is_not_an_action_failure() -> None:
    """Issue 19 item 12: an agent loop's ``except ActionFailed`` (hand the error to the model)
    must not swallow a case that needs a person."""
    assert not issubclass(ActionNeedsReview, ActionFailed)
    caught = "none"
    try:
        raise ActionNeedsReview("an external tool may have acted")
    except ActionFailed:
        caught = "as an ordinary failure"
    except ActionNeedsReview:
        caught = "as needing a person"
    assert caught == "as needing a person"


async def test_the_examples_function_tool_stops_the_run_on_needs_review(store: Store) -> None:
    from examples.agents.tools import Bank, NeedsPerson, create_tables, function_tools, register

    await create_tables(store)
    actions = Actions(store, registry=CollectorRegistry())
    register(actions, Bank())
    tools = function_tools(actions, scope=TENANT)
    arguments = {"to": "a@b", "subject": "refund", "body": "done"}
    action = actions.propose("send_email", scope=TENANT, action_id="m-1", request=arguments)
    # The ledger says a person must look (an attempt died and nothing could say what it did).
    claim = actions._claim(actions._tool("send_email"), action, b"{}")
    claimed = await keyed.claim(store, claim)
    assert isinstance(claimed, Claimed)
    body = b'{"error":"needs_review","detail":"interrupted"}'
    await keyed.complete(
        store,
        None,
        claim.key,
        claimed.fence,
        StoredResponse(409, "application/json", body),
        State.FAILED,
    )
    with pytest.raises(NeedsPerson, match="needs a person"):
        await tools["send_email"].invoke(orjson.dumps(arguments).decode(), "m-1", None)


async def test_retry_after_is_when_the_first_attempt_likely_ends(store: Store) -> None:
    actions = await executor(store, lease=60.0, wait=0.0)
    gate = asyncio.Event()
    gate.set()
    started = asyncio.Event()

    @actions.tool("quick")
    async def quick(call: ToolCall, tx: Connection) -> Any:
        started.set()
        await gate.wait()
        return {}

    await actions.execute(actions.propose("quick", scope=TENANT, action_id="q-1", request={}))
    gate.clear()
    started.clear()
    slow = actions.propose("quick", scope=TENANT, action_id="q-2", request={})
    first = asyncio.create_task(actions.execute(slow))
    await started.wait()
    with pytest.raises(ActionInProgress) as caught:
        await actions.execute(slow)
    gate.set()
    await first
    assert caught.value.retry_after == 1.0  # not the 60 s the lease still has
