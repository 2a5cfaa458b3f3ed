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
        "max_body_size positive bytes",
    ),
    (
        "proxy methods as one string",
        lambda s: IdempotencyProxy("http://api.test", store=s, methods="POST"),
        "methods= takes a list",
    ),
    (
        "proxy max_response_size NaN",
        lambda s: IdempotencyProxy("http://api.test", store=s, max_response_size=math.nan),
        "sizes whole bytes",
    ),
    ("a provider name ending in a newline", lambda s: Provider("acme\n", [SECRET]), "acme"),
    ("executor lease as text", lambda s: Actions(s, lease="5"), "lease is seconds"),
    ("executor wait NaN", lambda s: Actions(s, wait=math.nan), "wait must be >= 0"),
    (
        "volatile as one string",
        lambda s: Actions(s).add_tool("refund", tool, volatile="reason"),
        "takes a list of field names",
    ),
    ("a tool name ending in a newline", lambda s: Actions(s).add_tool("refund\n", tool), "name"),
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
