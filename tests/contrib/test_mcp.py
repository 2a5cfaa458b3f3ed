"""MCP tools through the executor, driven by the MCP SDK's own client: over stdio (a real
server process), over streamable HTTP (a real uvicorn server on a loopback port) and over the
SDK's in-memory transport, on PostgreSQL and SQLite.

A connection dropped after the tool took effect, then a retry from a new session with the same
action id: one effect, the first attempt's result. Two sessions of one principal calling one
action at once: one effect. A call without an action id: a tool error, nothing run.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.fastmcp import Context, FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.types import CallToolResult

from receiver import (
    ActionFailed,
    Actions,
    ConfigurationError,
    Connection,
    SQLiteStore,
    Store,
    ToolCall,
    action_key,
)
from receiver.contrib.mcp import ACTION_ID, REPLAYED, MCPActions
from tests.contrib import mcp_server_app as app

ROOT = Path(__file__).resolve().parents[2]


def text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if c.type == "text")


def replayed(result: CallToolResult) -> bool:
    return bool((result.meta or {})[REPLAYED])


async def rows(store: Store, kind: str = app.KIND) -> list[tuple[str, str]]:
    async with store.acquire() as conn:
        found = await conn.fetch(
            "SELECT webhook_id, note FROM effects WHERE provider = $1 ORDER BY webhook_id", kind
        )
    return [(r["webhook_id"], r["note"]) for r in found]


async def receipts(store: Store) -> int:
    async with store.acquire() as conn:
        return int(await conn.fetchval("SELECT count(*) FROM receiver_receipts"))


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await check():
        assert loop.time() < deadline, "the server did not get there in time"
        await asyncio.sleep(0.02)


def refund_key(scope: str, action_id: str) -> str:
    return action_key(scope, "refund", action_id)


async def drop_mid_call(
    connect: Callable[[], contextlib.AbstractAsyncContextManager[ClientSession]],
    store: Store,
    action_id: str,
) -> None:
    """Call ``refund`` and drop the connection once its effect is committed, before the tool
    returns (it holds a while after acting): the client never sees the answer."""
    async with connect() as session:
        call = asyncio.create_task(
            session.call_tool("refund", {"order": "A-1", "cents": 500}, meta={ACTION_ID: action_id})
        )
        await until(lambda: _has_rows(store))
        assert not call.done()  # the answer has not arrived
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call


async def _has_rows(store: Store) -> bool:
    return bool(await rows(store))


async def at_once(*calls: Callable[[], Awaitable[CallToolResult]]) -> list[CallToolResult]:
    """Run ``calls`` released through one barrier."""
    barrier = asyncio.Barrier(len(calls))

    async def released(call: Callable[[], Awaitable[CallToolResult]]) -> CallToolResult:
        await barrier.wait()
        return await call()

    return list(await asyncio.gather(*(released(c) for c in calls)))


def refund_call(session: ClientSession, action_id: str, reason: str = "") -> Callable[[], Any]:
    arguments = {"order": "A-9", "cents": 900, "reason": reason}
    return lambda: session.call_tool("refund", arguments, meta={ACTION_ID: action_id})


# -- streamable HTTP: a real uvicorn server on a loopback port, bearer tokens as principals ----


@contextlib.asynccontextmanager
async def http_server(store: Store, *, hold: float) -> AsyncIterator[str]:
    await app.prepare(store)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app.http_app(store, port, hold=hold), log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await until(lambda: asyncio.sleep(0, server.started))
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextlib.asynccontextmanager
async def http_connection(
    url: str, token: str, *, drop: bool = False
) -> AsyncIterator[tuple[ClientSession, Callable[[], str | None]]]:
    """A client session and its Mcp-Session-Id; ``drop``: the connection goes away without a
    goodbye (no DELETE of the session), as when a network drops."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(10, read=30)) as http,
        streamable_http_client(url, http_client=http, terminate_on_close=not drop) as (
            read,
            write,
            session_id,
        ),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session, session_id


@contextlib.asynccontextmanager
async def http_client(url: str, token: str, *, drop: bool = False) -> AsyncIterator[ClientSession]:
    async with http_connection(url, token, drop=drop) as (session, _):
        yield session


async def test_http_dropped_connection_then_retry_from_a_new_session(store: Store) -> None:
    async with http_server(store, hold=1.0) as url:
        async with http_connection(url, "token-ada-laptop") as (refused, refused_id):
            before = await receipts(store)
            missing = await refused.call_tool("refund", {"order": "A-1", "cents": 500})
            assert missing.isError
            assert "missing action id" in text(missing)
            assert await rows(store) == []
            assert await receipts(store) == before
            first_session = refused_id()

        await drop_mid_call(lambda: http_client(url, "token-ada-laptop", drop=True), store, "r-1")

        # The same person on another device: another client, another MCP session.
        async with http_connection(url, "token-ada-phone") as (retry, retry_id):
            # Not the session that failed to answer: a session id cannot name the action.
            assert retry_id() != first_session
            result = await retry.call_tool(
                "refund",
                {"order": "A-1", "cents": 500, "reason": "the model reworded this"},
                meta={ACTION_ID: "r-1"},
            )
            again = await retry.call_tool(
                "refund", {"order": "A-1", "cents": 500}, meta={ACTION_ID: "r-1"}
            )
        effects = await rows(store)
        assert [key for key, _ in effects] == [refund_key("sub:ada", "r-1")]
        assert not result.isError, text(result)
        # The server went on and stored the result the dropped client never read: replayed.
        assert replayed(result)
        # The first attempt's result: its token is the one only that attempt knew.
        assert result.structuredContent is not None
        assert result.structuredContent["token"] == effects[0][1]
        assert again.structuredContent == result.structuredContent
        assert replayed(again)

        # Another principal's "r-1" is another action: the scope keeps them apart.
        async with http_client(url, "token-bob") as bob:
            theirs = await bob.call_tool(
                "refund", {"order": "B-1", "cents": 100}, meta={ACTION_ID: "r-1"}
            )
        assert not theirs.isError
        assert not replayed(theirs)
        assert len(await rows(store)) == 2


async def test_no_subject_spells_another_issuers_principal(store: Store) -> None:
    """A subject without an issuer that contains "|" is not the principal of the issuer it
    spells: the same action id from each is two actions."""
    async with http_server(store, hold=0.0) as url:
        results = []
        for token in ("token-idp-ada", "token-spelled"):
            async with http_client(url, token) as session:
                results.append(await refund_call(session, "same-id")())
    assert not any(r.isError for r in results), [text(r) for r in results]
    assert [replayed(r) for r in results] == [False, False]
    assert [k for k, _ in await rows(store)] == sorted(
        [
            refund_key("sub:https://idp.example|ada", "same-id"),
            refund_key("sub:https://idp.example%7Cada", "same-id"),
        ]
    )


async def test_http_one_action_at_once_from_two_sessions_and_within_one(store: Store) -> None:
    async with (
        http_server(store, hold=0.3) as url,
        http_client(url, "token-ada-laptop") as laptop,
        http_client(url, "token-ada-phone") as phone,
    ):
        results = await at_once(
            refund_call(laptop, "twin"), refund_call(phone, "twin", "other words")
        )
        within = await at_once(refund_call(laptop, "twin-2"), refund_call(laptop, "twin-2"))
    for pair in (results, within):
        assert not any(r.isError for r in pair), [text(r) for r in pair]
        assert pair[0].structuredContent == pair[1].structuredContent
        assert sorted(replayed(r) for r in pair) == [False, True]
    effects = await rows(store)
    assert [k for k, _ in effects] == sorted(
        [refund_key("sub:ada", "twin"), refund_key("sub:ada", "twin-2")]
    )


# -- stdio: the SDK's stdio_client starting a real server process -----------------------------


def stdio_params(url: str, hold: float) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "tests.contrib.mcp_server_app",
            "--store",
            url,
            "--scope",
            "tenant-7",
            "--hold",
            str(hold),
        ],
        cwd=str(ROOT),
    )


@contextlib.asynccontextmanager
async def stdio_session(url: str, hold: float) -> AsyncIterator[ClientSession]:
    async with (
        stdio_client(stdio_params(url, hold)) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def test_stdio_dropped_connection_then_retry_from_a_new_process(
    store: Store, store_url: str
) -> None:
    await app.prepare(store)
    url = store_url
    async with stdio_session(url, hold=3.0) as refused:
        missing = await refused.call_tool(
            "refund", {"order": "A-1", "cents": 500}, meta={ACTION_ID: "  "}
        )
        assert missing.isError
        assert "missing action id" in text(missing)

    # The client goes away mid-call: the server's stdin closes and it cancels the call in
    # flight, after the tool's effect and before its result. An external tool is never
    # released once called: the claim stays in flight until its lease ends, and the retry
    # from a new process reconciles it (finds the effect) instead of refunding again.
    await drop_mid_call(lambda: stdio_session(url, hold=3.0), store, "r-1")

    async with stdio_session(url, hold=0.0) as retry:
        result = await retry.call_tool(
            "refund", {"order": "A-1", "cents": 500}, meta={ACTION_ID: "r-1"}
        )
        again = await retry.call_tool(
            "refund", {"order": "A-1", "cents": 500}, meta={ACTION_ID: "r-1"}
        )
    effects = await rows(store)
    assert [key for key, _ in effects] == [refund_key("tenant-7", "r-1")]
    assert not result.isError, text(result)
    assert not replayed(result)  # reconciled now, stored, and replayed from then on
    assert result.structuredContent is not None
    assert result.structuredContent["token"] == effects[0][1]
    assert again.structuredContent == result.structuredContent
    assert replayed(again)


async def test_stdio_two_clients_of_one_principal_at_once(store: Store, store_url: str) -> None:
    await app.prepare(store)
    url = store_url
    async with stdio_session(url, hold=0.3) as one, stdio_session(url, hold=0.3) as two:
        results = await at_once(refund_call(one, "twin"), refund_call(two, "twin", "reworded"))
        tickets = await at_once(
            *(
                lambda s=s: s.call_tool("ticket", {"subject": "late"}, meta={ACTION_ID: "t-1"})
                for s in (one, two)
            )
        )
    assert not any(r.isError for r in results + tickets), [text(r) for r in results + tickets]
    assert results[0].structuredContent == results[1].structuredContent
    assert tickets[0].structuredContent == tickets[1].structuredContent
    assert [k for k, _ in await rows(store)] == [refund_key("tenant-7", "twin")]
    assert len(await rows(store, "mcp-ticket")) == 1


# -- the worked example, as its users run it -------------------------------------------------


async def test_example_server_and_client(store: Store, store_url: str) -> None:
    """As its users run it, on each store."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.agents.mcp_server",
        "--store",
        store_url,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    printed = out.decode()
    assert process.returncode == 0, printed + err.decode()
    assert '"refunds": 1, "outbox": 1, "tickets": 1' in printed
    assert printed.count("(replayed: true)") == 3, printed
    assert "missing action id" in printed
    assert "conflict" in printed


# -- what the client reads for each outcome (the SDK's in-memory transport) -------------------


class Outcomes:
    """Tools that fail in each way the executor knows, on one server."""

    def __init__(self, store: Store, *, wait: float = 5.0) -> None:
        self.server = FastMCP("outcomes", log_level="WARNING")
        self.actions = Actions(store, lease=5.0, wait=wait, sweep_interval=None)
        self.runs = 0
        self.gate = asyncio.Event()
        self.flaky = 0
        keyed = MCPActions(self.server, self.actions, scope="tenant-1")

        @keyed.tool(effects="external")
        async def unstorable(call: ToolCall, tx: Connection) -> Any:
            self.runs += 1
            return object()  # it acted, and its answer cannot be stored

        @keyed.tool()
        async def refuse(call: ToolCall, tx: Connection, cents: int) -> int:
            self.runs += 1
            raise ActionFailed(f"{cents} is over the limit")

        @keyed.tool()
        async def slow(call: ToolCall, tx: Connection, n: int) -> list[int]:
            self.runs += 1
            await self.gate.wait()
            return [n, n]

        @keyed.tool()
        async def flaky_tool(call: ToolCall, tx: Connection, card: str) -> str:
            self.runs += 1
            if self.flaky:
                self.flaky -= 1
                raise RuntimeError(f"bank down while charging {card}")
            return "charged"

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[ClientSession]:
        async with create_connected_server_and_client_session(self.server) as session:
            yield session


async def test_needs_review_is_an_error_on_every_retry(store: Store) -> None:
    outcomes = Outcomes(store)
    async with outcomes.session() as client:
        first = await client.call_tool("unstorable", {}, meta={ACTION_ID: "u-1"})
        again = await client.call_tool("unstorable", {}, meta={ACTION_ID: "u-1"})
    for result in (first, again):
        assert result.isError
        assert "needs review" in text(result)
        assert "A person must review it" in text(result)
        facts = result.structuredContent
        assert facts is not None
        assert (facts["error"], facts["action_id"]) == ("needs_review", "u-1")
    assert outcomes.runs == 1


async def test_failed_is_stored_and_answered_again(store: Store) -> None:
    outcomes = Outcomes(store)
    async with outcomes.session() as client:
        results = [
            await client.call_tool("refuse", {"cents": 7}, meta={ACTION_ID: "f-1"})
            for _ in range(2)
        ]
    assert [r.isError for r in results] == [True, True]
    assert all(
        "failed: action 'f-1' failed for good: 7 is over the limit" in text(r) for r in results
    )
    assert outcomes.runs == 1


async def test_in_progress_says_when_to_retry(store: Store) -> None:
    outcomes = Outcomes(store, wait=0.0)
    async with outcomes.session() as client:
        first = asyncio.create_task(client.call_tool("slow", {"n": 3}, meta={ACTION_ID: "s-1"}))
        await until(lambda: asyncio.sleep(0, outcomes.runs == 1))
        busy = await client.call_tool("slow", {"n": 3}, meta={ACTION_ID: "s-1"})
        outcomes.gate.set()
        done = await first
        later = await client.call_tool("slow", {"n": 3}, meta={ACTION_ID: "s-1"})
    assert busy.isError
    assert "in progress" in text(busy)
    assert "retry this same call" in text(busy)
    # The seconds to wait, for the client application as well as in the model's text (slow
    # has an output schema: an error's structured content is the error's all the same).
    facts = busy.structuredContent
    assert facts is not None
    seconds = facts["retry_after"]
    assert isinstance(seconds, int)
    assert seconds >= 1
    assert f"after {seconds} s for its result" in text(busy)
    assert (facts["error"], facts["action_id"]) == ("in_progress", "s-1")
    assert done.structuredContent == {"result": [3, 3]}
    assert not replayed(done)
    assert later.structuredContent == done.structuredContent
    assert replayed(later)
    assert outcomes.runs == 1


async def test_conflict_and_bad_action_ids_run_nothing(store: Store) -> None:
    outcomes = Outcomes(store)
    outcomes.gate.set()
    async with outcomes.session() as client:
        await client.call_tool("slow", {"n": 1}, meta={ACTION_ID: "c-1"})
        before = await receipts(store)
        conflict = await client.call_tool("slow", {"n": 2}, meta={ACTION_ID: "c-1"})
        wrong_type = await client.call_tool("slow", {"n": 2}, meta={ACTION_ID: 12})
        too_long = await client.call_tool("slow", {"n": 2}, meta={ACTION_ID: "x" * 201})
    assert conflict.isError
    assert "conflict: action id 'c-1'" in text(conflict)
    assert conflict.structuredContent is not None
    assert conflict.structuredContent["error"] == "conflict"
    assert "retry_after" not in conflict.structuredContent
    assert wrong_type.isError
    assert "missing action id" in text(wrong_type)
    assert too_long.isError
    assert "refused" in text(too_long)
    assert outcomes.runs == 1
    assert await receipts(store) == before


async def test_a_tool_error_is_retried_and_its_text_kept_from_the_client(store: Store) -> None:
    outcomes = Outcomes(store)
    outcomes.flaky = 1
    async with outcomes.session() as client:
        failed = await client.call_tool(
            "flaky_tool", {"card": "4242-secret"}, meta={ACTION_ID: "k-1"}
        )
        retried = await client.call_tool(
            "flaky_tool", {"card": "4242-secret"}, meta={ACTION_ID: "k-1"}
        )
    assert failed.isError
    assert "RuntimeError" in text(failed)
    assert "4242-secret" not in text(failed)
    assert retried.structuredContent == {"result": "charged"}
    assert not replayed(retried)
    assert outcomes.runs == 2


async def test_annotations_and_schemas_as_clients_see_them(sqlite_store: Store) -> None:
    await app.prepare(sqlite_store)
    server = app.build(sqlite_store, "tenant-1")
    async with create_connected_server_and_client_session(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    refund, ticket = tools["refund"], tools["ticket"]
    assert refund.annotations is not None
    assert ticket.annotations is not None
    assert refund.annotations.idempotentHint
    assert ticket.annotations.idempotentHint
    assert refund.annotations.destructiveHint
    assert not ticket.annotations.destructiveHint
    assert refund.annotations.openWorldHint
    assert not ticket.annotations.openWorldHint
    assert not refund.annotations.readOnlyHint
    assert refund.meta == {ACTION_ID: "required"}
    assert set(refund.inputSchema["properties"]) == {"order", "cents", "reason"}
    assert refund.outputSchema is not None
    assert set(refund.outputSchema["properties"]) == {"refund", "order", "cents", "token"}


def test_registration_refuses_what_cannot_be_keyed(tmp_path: Path) -> None:
    keyed = MCPActions(FastMCP("x"), Actions(SQLiteStore(tmp_path / "x.db")), scope="t")

    async def no_call(order: str) -> None: ...
    async def with_context(call: ToolCall, tx: Connection, ctx: Context[Any, Any, Any]) -> None: ...
    def not_async(call: ToolCall, tx: Connection) -> None: ...

    for fn, message in (
        (no_call, r"take \(call, tx\) first"),
        (with_context, "takes no MCP Context"),
        (not_async, "'async def'"),
    ):
        with pytest.raises(ConfigurationError, match=message):
            keyed.add_tool(fn)
    with pytest.raises(ConfigurationError, match="non-empty"):
        MCPActions(FastMCP("y"), keyed.actions, scope="")
