"""An MCP server whose tools take effect once, and a client that retries across reconnects.

    python -m examples.agents.mcp_server                     # the demo, a SQLite file in a temp dir
    python -m examples.agents.mcp_server --store postgresql://localhost/app
    python -m examples.agents.mcp_server serve --store URL --tenant tenant-42   # the stdio server

The server (:func:`build_server`) is a FastMCP server with three keyed tools,
``refund_order`` (transactional: its row commits with the stored result), ``send_email``
(external: the mail provider dedups on the executor's downstream key, and ``reconcile`` asks it
what happened after a crash) and ``create_ticket``. Each call runs through
:class:`receiver.Actions` via :class:`receiver.contrib.mcp.MCPActions`.

Where the key comes from. Its scope is the principal: over stdio, the tenant the server process
was launched for (``--tenant``); over HTTP it would be the bearer token's subject
(``authenticated_principal``). Its action id is the *client application's*: the host assigns
one per logical action when it decides to make the call, stores it with the conversation
(here: a JSON file) before sending, and sends it in ``params._meta["io.receiver/action-id"]`` on
the first call and on every retry. None of the runtime's own ids would do:

- the model's tool-call id is new whenever the model regenerates its answer;
- the MCP session (``Mcp-Session-Id`` over HTTP, the process over stdio) is new after every
  reconnect, so a retry after a dropped connection would get a new key and run again;
- the JSON-RPC request id is a counter of one connection that starts again at 0: a retry in a
  new session gets whatever number comes next, and two different actions in two sessions get
  the same number (the demo prints them).

The demo: the client calls the tools, loses every answer (the connection drops; the host
records nothing), reconnects to a new server process and retries from its stored state while
the model rewords the prose: every retry is answered from the ledger (``replayed``). A call
without an action id, and a reused action id with another amount, are refused with tool
errors. At the end each effect is there once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.server.fastmcp import FastMCP
from mcp.types import CallToolResult
from pydantic import BaseModel

from receiver import RUN_AGAIN, Actions, Connection, Store, ToolCall, store_from_url
from receiver.contrib.mcp import ACTION_ID, REPLAYED, MCPActions, ScopeFunc

from .tools import create_tables


class Refund(BaseModel):
    order_id: str
    refunded_cents: int


class Email(BaseModel):
    sent_to: str
    message_id: str


def build_server(store: Store, *, scope: str | ScopeFunc) -> FastMCP:
    """The MCP server, its tools keyed by ``scope`` and the client's action id."""
    server = FastMCP("shop-support", log_level="WARNING")
    actions = Actions(store, lease=30.0, wait=10.0)
    keyed = MCPActions(server, actions, scope=scope)

    # The model's explanation and the email's wording are volatile: a regenerated call that
    # rewords them is the same action. The amount is not: another amount under the same
    # action id is refused as a conflict.
    @keyed.tool(volatile=("reason",), destructive=True)
    async def refund_order(
        call: ToolCall, tx: Connection, order_id: str, amount_cents: int, reason: str = ""
    ) -> Refund:
        """Refund an order, in full or in part."""
        await tx.execute(
            "INSERT INTO example_refunds (order_id, amount_cents, action_key) VALUES ($1, $2, $3)",
            order_id,
            amount_cents,
            call.action.key,
        )
        return Refund(order_id=order_id, refunded_cents=amount_cents)

    async def find_email(call: ToolCall) -> Any:
        async with store.acquire() as conn:
            sent = await conn.fetchval(
                "SELECT recipient FROM example_outbox WHERE downstream_key = $1",
                call.downstream_key,
            )
        return RUN_AGAIN if sent is None else Email(sent_to=sent, message_id=call.downstream_key)

    @keyed.tool(effects="external", reconcile=find_email, volatile=("body",), destructive=False)
    async def send_email(call: ToolCall, tx: Connection, to: str, subject: str, body: str) -> Email:
        """Email the customer."""
        # The provider's own dedup on our downstream key (as Stripe's Idempotency-Key).
        async with store.acquire() as conn:
            await conn.execute(
                "INSERT INTO example_outbox (downstream_key, recipient, subject) "
                "VALUES ($1, $2, $3) ON CONFLICT (downstream_key) DO NOTHING",
                call.downstream_key,
                to,
                subject,
            )
        return Email(sent_to=to, message_id=call.downstream_key)

    @keyed.tool(volatile=("details",), destructive=False)
    async def create_ticket(call: ToolCall, tx: Connection, subject: str, details: str = "") -> str:
        """Open a support ticket."""
        await tx.execute(
            "INSERT INTO example_tickets (subject, action_key) VALUES ($1, $2)",
            subject,
            call.action.key,
        )
        return f"T-{call.action.action_id[:8]}"

    return server


async def serve(url: str, tenant: str) -> None:
    """The stdio server: one process per client, for the one tenant it was launched for."""
    async with store_from_url(url) as store:
        await create_tables(store)
        await build_server(store, scope=tenant).run_stdio_async()


# -- the client application (the "host" that runs the model and calls the server) -----------

TENANT = "tenant-42"

#: What the (scripted) model asks for, with prose it words differently on every attempt.
PLAN: list[tuple[str, dict[str, Any]]] = [
    ("refund_order", {"order_id": "A-1001", "amount_cents": 2599, "reason": "{prose}"}),
    ("send_email", {"to": "ada@example.com", "subject": "Your refund", "body": "{prose}"}),
    ("create_ticket", {"subject": "Courier complaint A-1001", "details": "{prose}"}),
]
PROSE = ("Refunding per policy; the parcel arrived broken.", "Sorry! Taking care of it now.")


def worded(arguments: dict[str, Any], attempt: int) -> dict[str, Any]:
    return {
        k: v.format(prose=PROSE[attempt]) if isinstance(v, str) else v for k, v in arguments.items()
    }


class Conversation:
    """The host's stored conversation: each planned call with the action id assigned to it
    before it was first sent, and its answer once one arrived."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state: dict[str, Any] = (
            json.loads(path.read_text()) if path.exists() else {"calls": []}
        )

    def plan(self) -> None:
        for tool, arguments in PLAN:
            # Assigned once, saved before the first send: every retry reuses it.
            self.state["calls"].append(
                {
                    "tool": tool,
                    "arguments": arguments,
                    "action_id": str(uuid.uuid4()),
                    "answer": None,
                }
            )
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.state, indent=1))


def server_process(url: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "examples.agents.mcp_server", "serve", "--store", url, "--tenant", TENANT],
        cwd=str(Path(__file__).resolve().parents[2]),
    )


def show(result: CallToolResult) -> str:
    if result.isError:
        return "tool error: " + " ".join(c.text for c in result.content if c.type == "text")
    replayed = (result.meta or {}).get(REPLAYED)
    return f"{json.dumps(result.structuredContent)} (replayed: {json.dumps(replayed)})"


async def session(url: str, conversation: Conversation, attempt: int, *, record: bool) -> None:
    async with (
        stdio_client(server_process(url)) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        if attempt == 0:
            for tool in (await client.list_tools()).tools:
                hints = tool.annotations
                assert hints is not None
                print(
                    f"  {tool.name}: idempotentHint={hints.idempotentHint} "
                    f"destructiveHint={hints.destructiveHint} openWorldHint={hints.openWorldHint}"
                )
        for call in conversation.state["calls"]:
            if call["answer"] is not None:
                continue
            result = await client.call_tool(
                call["tool"],
                worded(call["arguments"], attempt),
                meta={ACTION_ID: call["action_id"]},
            )
            print(f"  {call['tool']} [{call['action_id'][:8]}]: {show(result)}")
            if record and not result.isError:
                call["answer"] = result.structuredContent
        conversation.save()
        if attempt == 1:
            print("-- a call with no action id, then a reused action id with another amount --")
            refused = await client.call_tool(
                "refund_order", {"order_id": "A-1001", "amount_cents": 1}
            )
            print("  ", show(refused))
            first = conversation.state["calls"][0]
            other = dict(first["arguments"], amount_cents=9999)
            conflict = await client.call_tool(
                "refund_order", worded(other, 1), meta={ACTION_ID: first["action_id"]}
            )
            print("  ", show(conflict))


async def counts(store: Store) -> dict[str, int]:
    async with store.acquire() as conn:
        return {
            table: int(await conn.fetchval(f"SELECT count(*) FROM example_{table}"))  # noqa: S608
            for table in ("refunds", "outbox", "tickets")
        }


async def demo(url: str, tmp: Path) -> int:
    async with store_from_url(url) as store:
        await create_tables(store)
        before = await counts(store)
    conversation = Conversation(tmp / "conversation.json")
    conversation.plan()
    print("session 1 (a server process over stdio): the calls run, but every answer is lost")
    await session(url, conversation, 0, record=False)
    print(
        "-- the connection dropped; the host reconnects: a new process, a new session whose "
        "JSON-RPC ids start again at 0; only the stored action ids are the same --"
    )
    print("session 2: the same calls, the same action ids, reworded by the model")
    await session(url, conversation, 1, record=True)
    async with store_from_url(url) as store:
        after = await counts(store)
    effects = {table: after[table] - before[table] for table in after}
    print("effects:", json.dumps(effects))
    if effects != {"refunds": 1, "outbox": 1, "tickets": 1}:
        print(f"UNEXPECTED: {effects}", file=sys.stderr)
        return 1
    if any(call["answer"] is None for call in conversation.state["calls"]):
        print("UNEXPECTED: a retry got no answer", file=sys.stderr)
        return 1
    print("every action took effect once")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.agents.mcp_server")
    parser.add_argument("command", nargs="?", choices=["demo", "serve"], default="demo")
    parser.add_argument("--store", help="postgresql://... or sqlite:///path (default: temp)")
    parser.add_argument("--tenant", default=TENANT, help="serve: the principal of this process")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.store or f"sqlite:///{Path(tmp) / 'agents.db'}"
        if args.command == "serve":
            if not args.store:
                parser.error("serve needs --store: the ledger must outlive the process")
            asyncio.run(serve(url, args.tenant))
            return 0
        return asyncio.run(demo(url, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
