"""Settings and arguments of the wrong shape are refused where they are given, with a
ReceiverError that names them: a string where a list belongs (it would be split into
characters), a name with a trailing newline (``$`` matches before one), text where seconds
belong, NaN where a size belongs. None of them reaches the store."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.responses import PlainTextResponse

from receiver import (
    ActionError,
    Actions,
    ConfigurationError,
    Console,
    IdempotencyKeyMiddleware,
    IdempotencyProxy,
    Provider,
    Receiver,
    ReceiverError,
    SQLiteStore,
    ToolCall,
)
from receiver._store.base import Connection
from tests.support import SECRET


async def tool(call: ToolCall, tx: Connection) -> dict[str, bool]:
    return {"ok": True}


def endpoint() -> Any:
    return PlainTextResponse("ok")


def anyone(scope: Any) -> str:
    return "anyone"


CASES: list[tuple[str, Callable[[SQLiteStore], Any], str]] = [
    (
        "middleware methods as one string",
        lambda s: IdempotencyKeyMiddleware(endpoint, store=s, principal=anyone, methods="POST"),
        "methods= takes a list",
    ),
    (
        "middleware max_body_size NaN",
        lambda s: IdempotencyKeyMiddleware(
            endpoint, store=s, principal=anyone, max_body_size=math.nan
        ),
        "max_body_size must be a positive whole number of bytes",
    ),
    (
        "middleware unstored_statuses a 5xx",
        lambda s: IdempotencyKeyMiddleware(
            endpoint, store=s, principal=anyone, unstored_statuses=[422, 503]
        ),
        "unstored_statuses= takes a list of 4xx statuses",
    ),
    (
        "middleware unstored_statuses a 2xx",
        lambda s: IdempotencyKeyMiddleware(
            endpoint, store=s, principal=anyone, unstored_statuses=[200]
        ),
        "unstored_statuses= takes a list of 4xx statuses",
    ),
    (
        "middleware unstored_statuses one number",
        lambda s: IdempotencyKeyMiddleware(
            endpoint, store=s, principal=anyone, unstored_statuses=422
        ),
        "unstored_statuses= takes a list of 4xx statuses",
    ),
    (
        "middleware unstored_statuses text and True",
        lambda s: IdempotencyKeyMiddleware(
            endpoint, store=s, principal=anyone, unstored_statuses=["422", True]
        ),
        "unstored_statuses= takes a list of 4xx statuses",
    ),
    (
        "proxy methods as one string",
        lambda s: IdempotencyProxy("http://api.test", store=s, methods="POST"),
        "methods= takes a list",
    ),
    (
        "proxy max_response_size NaN",
        lambda s: IdempotencyProxy("http://api.test", store=s, max_response_size=math.nan),
        "max_response_size must be a positive whole number",
    ),
    ("a provider name ending in a newline", lambda s: Provider("acme\n", [SECRET]), "acme"),
    (
        "executor lease as text",
        lambda s: Actions(s, lease="5"),
        "lease is a finite number of seconds",
    ),
    (
        "executor wait NaN",
        lambda s: Actions(s, wait=math.nan),
        "wait is a finite number of seconds",
    ),
    (
        "executor wait inf",
        lambda s: Actions(s, wait=math.inf),
        "wait is a finite number of seconds",
    ),
    # An infinite window overflowed the stored expiry timestamps.
    (
        "executor window inf",
        lambda s: Actions(s, window=math.inf),
        "window is a finite number of seconds",
    ),
    ("executor window huge", lambda s: Actions(s, window=1e12), "at most 63158400"),
    (
        "executor window True",
        lambda s: Actions(s, window=True),
        "window is a finite number of seconds",
    ),
    ("executor replay_cache True", lambda s: Actions(s, replay_cache=True), "replay_cache"),
    ("executor sweep_interval inf", lambda s: Actions(s, sweep_interval=math.inf), "sweep"),
    # Past two years: a sleep no process outlives, and a typo for milliseconds.
    (
        "executor sweep_interval huge",
        lambda s: Actions(s, sweep_interval=1e12),
        "sweep_interval must be above 0 and at most 63158400",
    ),
    (
        "receiver sweep_interval huge",
        lambda s: Receiver(s, [Provider("acme", [SECRET])], sweep_interval=1e12),
        "sweep_interval must be above 0 and at most 63158400",
    ),
    # Past two years, PostgreSQL's timestamps overflowed on every sweep: nothing expired.
    (
        "receiver dead_letter_retention huge",
        lambda s: Receiver(s, [Provider("acme", [SECRET])], dead_letter_retention=1e12),
        "dead_letter_retention must be 0 or more and at most 63158400",
    ),
    (
        "receiver audit_retention inf",
        lambda s: Receiver(s, [Provider("acme", [SECRET])], audit_retention=math.inf),
        "audit_retention is a finite number of seconds",
    ),
    (
        "executor dead_letter_retention huge",
        lambda s: Actions(s, dead_letter_retention=1e300),
        "dead_letter_retention must be 0 or more and at most 63158400",
    ),
    (
        "worker concurrency past 32 bits",
        lambda s: Receiver(s, [Provider("acme", [SECRET])]).worker(concurrency=2**63),
        "concurrency must be a whole number from 1 to 2147483647",
    ),
    (
        "worker concurrency 2.5",
        lambda s: Receiver(s, [Provider("acme", [SECRET])]).worker(concurrency=2.5),
        "concurrency must be a whole number",
    ),
    (
        "worker poll_interval NaN",
        lambda s: Receiver(s, [Provider("acme", [SECRET])]).worker(poll_interval=math.nan),
        "poll_interval is a finite number of seconds",
    ),
    (
        "worker grace negative",
        lambda s: Receiver(s, [Provider("acme", [SECRET])]).worker(grace=-1),
        "grace must be 0 or more",
    ),
    ("console bulk_rate as text", lambda s: Console(s, bulk_rate="5"), "bulk_rate is between"),
    ("console bulk_rate True", lambda s: Console(s, bulk_rate=True), "bulk_rate is between"),
    ("console bulk_rate NaN", lambda s: Console(s, bulk_rate=math.nan), "bulk_rate is between"),
    (
        "receiver sweep_interval 0",
        lambda s: Receiver(s, [Provider("acme", [SECRET])], sweep_interval=0),
        "sweep_interval must be above 0",
    ),
    (
        "volatile as one string",
        lambda s: Actions(s).add_tool("refund", tool, volatile="reason"),
        "takes a list of field names",
    ),
    ("a tool name ending in a newline", lambda s: Actions(s).add_tool("refund\n", tool), "name"),
    ("a tool lease True", lambda s: Actions(s).add_tool("refund", tool, lease=True), "lease"),
    ("a tool lease NaN", lambda s: Actions(s).add_tool("refund", tool, lease=math.nan), "lease"),
]


@pytest.mark.parametrize(("make", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_setting_of_the_wrong_shape_is_refused(
    tmp_path: Path, make: Callable[[SQLiteStore], Any], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        make(SQLiteStore(tmp_path / "ledger.db"))
    assert not (tmp_path / "ledger.db").exists()


def test_an_event_pattern_ending_in_a_newline_is_refused(tmp_path: Path) -> None:
    rx = Receiver(SQLiteStore(tmp_path / "ledger.db"), [Provider("acme", [SECRET])])
    with pytest.raises(ConfigurationError):

        @rx.on("order.created\n")
        async def created(event: Any, tx: Connection) -> None:
            pass


PROPOSALS: list[tuple[str, dict[str, Any], str]] = [
    ("a lone surrogate in the scope", {"scope": "\ud800"}, "scope must be printable"),
    ("a newline in the action id", {"action_id": "a-1\n"}, "action_id must be printable"),
    ("a tool named by a list", {"tool": []}, "named by a string, not a list"),
    ("a version given as text", {"version": "2"}, "version must be a whole number"),
    ("a version of 0", {"version": 0}, "version must be a whole number"),
    ("a version given as True", {"version": True}, "version must be a whole number"),
    ("a request nested too deeply", {"request": "deep"}, "nested too deeply"),
    ("a request with a number key", {"request": {1: "a", "1": "b"}}, "has a int key at the"),
    ("a nested tuple key", {"request": {"m": {(1, 2): 1}}}, "has a tuple key at m"),
]


@pytest.mark.parametrize(
    ("changed", "says"), [p[1:] for p in PROPOSALS], ids=[p[0] for p in PROPOSALS]
)
def test_a_proposal_of_the_wrong_shape_is_an_action_error(
    tmp_path: Path, changed: dict[str, Any], says: str
) -> None:
    actions = Actions(SQLiteStore(tmp_path / "ledger.db"))
    actions.add_tool("refund", tool)
    if changed.get("request") == "deep":
        deep: dict[str, Any] = {}
        for _ in range(5_000):
            deep = {"a": deep}
        changed = {"request": deep}
    asked = {"scope": "tenant-1", "action_id": "a-1", "request": {}, "tool": "refund", **changed}
    with pytest.raises(ActionError, match=says):
        actions.propose(asked.pop("tool"), **asked)


async def test_execute_takes_an_action_not_its_name(tmp_path: Path) -> None:
    actions = Actions(SQLiteStore(tmp_path / "ledger.db"))
    actions.add_tool("refund", tool)
    with pytest.raises(ReceiverError, match="takes the Action propose"):
        await actions.execute("refund")  # type: ignore[arg-type]
    assert not (tmp_path / "ledger.db").exists()


@pytest.mark.parametrize("turn", [["conv-7"], 3])
async def test_a_turn_that_is_not_a_string_is_refused(tmp_path: Path, turn: Any) -> None:
    actions = Actions(SQLiteStore(tmp_path / "ledger.db"))
    actions.add_tool("refund", tool)
    action = actions.propose("refund", scope="t", action_id="a-1", request={})
    with pytest.raises(ActionError, match="turn names a conversation turn: a string"):
        await actions.execute(action, turn=turn)
    assert not (tmp_path / "ledger.db").exists()


def test_a_generator_of_methods_is_read_once_and_empty_methods_are_refused(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ledger.db")
    mw = IdempotencyKeyMiddleware(
        endpoint, store=store, principal=anyone, methods=(m for m in ["post"])
    )
    assert mw.methods == frozenset({"POST"})
    with pytest.raises(ConfigurationError, match="methods= takes a list"):
        IdempotencyKeyMiddleware(endpoint, store=store, principal=anyone, methods=[])
    actions = Actions(store)
    tool_ = actions.add_tool("refund", tool, volatile=(f for f in ["reason"]))
    assert tool_.volatile == frozenset({"reason"})


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"key_header": "Idem Key"}, "key_header must be a header name"),
        ({"principal": "tenant-1"}, "principal= must be a function"),
        ({"sweep_interval": -1}, "sweep_interval must be above 0"),
        ({"sweep_interval": math.nan}, "sweep_interval is a finite number"),
        ({"namespace": "a\x00b"}, "namespace must be 1-64 printable"),
        ({"required": ["payments"]}, "required= takes a list of path patterns"),
        # A non-UTF-8 command-line argument (surrogate-escaped) or a control character: a
        # pattern no request path can match, so nothing would be keyed there.
        ({"paths": ["/pay\udcff"]}, "paths= takes a list of path patterns"),
        ({"paths": ["/pay\n"]}, "paths= takes a list of path patterns"),
        ({"ttl": math.inf}, "ttl is a finite number"),
        ({"retry_statuses": (s for s in [503, 200])}, "retry_statuses holds"),
    ],
)
def test_a_proxy_setting_it_cannot_use_is_refused(
    tmp_path: Path, options: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        IdempotencyProxy("http://api.test", store=SQLiteStore(tmp_path / "l.db"), **options)


def test_console_redact_fields_as_one_string_is_refused(tmp_path: Path) -> None:
    from receiver import Console

    with pytest.raises(ConfigurationError, match="redact_fields= takes a list"):
        Console(SQLiteStore(tmp_path / "l.db"), redact_fields="diagnosis")


def test_a_handler_lease_is_checked_against_a_provider_added_after_it(tmp_path: Path) -> None:
    rx = Receiver(SQLiteStore(tmp_path / "l.db"), [])
    rx.add_handler("order.created", tool_handler, lease=10**6)
    with pytest.raises(ConfigurationError, match="outlasts the dedup window"):
        rx.add_provider(Provider("acme", [SECRET]))


async def tool_handler(event: Any, tx: Connection) -> None:
    pass


def test_a_proposal_keeps_the_request_as_it_was_proposed(tmp_path: Path) -> None:
    actions = Actions(SQLiteStore(tmp_path / "l.db"))
    actions.add_tool("refund", tool)
    request = {"amount": 100, "items": [1]}
    proposed = actions.propose("refund", scope="t", action_id="a-1", request=request)
    request["amount"] = 999
    request["items"].append(2)  # type: ignore[attr-defined]
    assert proposed.request == {"amount": 100, "items": [1]}


@pytest.mark.parametrize("batch", [0, 2**63, 1.5, True])
async def test_a_sweep_batch_of_the_wrong_shape_is_refused(tmp_path: Path, batch: Any) -> None:
    """A LIMIT past 64 bits failed in the driver (DataError) on PostgreSQL; 0 or a fraction
    made no sense: refused by every entry point's sweep() before any statement."""
    store = SQLiteStore(tmp_path / "ledger.db")
    async with Receiver(store, [Provider("acme", [SECRET])]) as rx:
        with pytest.raises(ConfigurationError, match="batch must be a whole number"):
            await rx.sweep(batch=batch)
        with pytest.raises(ConfigurationError, match="batch must be a whole number"):
            await Actions(store).sweep(batch=batch)
