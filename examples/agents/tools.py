"""The agent's tools, registered on the executor, and the function-tool shape agent SDKs use.

Three tools, each of one kind:

- ``refund_order`` is transactional: its business row is written through ``tx`` and commits
  with the stored result, or not at all. After a crash it simply runs again.
- ``send_email`` is external: the "mail provider" (the ``example_outbox`` table, written on a
  connection of its own, outside the ledger's transaction) dedups on the downstream key the
  executor derives, and ``reconcile`` asks it what happened after a crash.
- ``create_ticket`` is transactional too.

``function_tools`` exposes them in the shape OpenAI's, Anthropic's and most agent frameworks'
function tools have: a name, a description, a JSON schema of the arguments, and a plain async
function taking the arguments as JSON text and returning the result as JSON text. The one
addition is ``action_id``: the *system* names each call (here: conversation, turn, tool and
its ordinal in the turn). A model's own tool-call id changes when the model regenerates, so it
must never be the key. No SDK is imported: adapt ``FunctionTool`` to yours in a few lines.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from receiver import (
    RUN_AGAIN,
    ActionFailed,
    ActionNeedsReview,
    Actions,
    Connection,
    Store,
    ToolCall,
)

DDL = (
    "CREATE TABLE IF NOT EXISTS example_refunds ("
    " order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL, action_key TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS example_tickets ( subject TEXT NOT NULL, action_key TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS example_outbox ("
    " downstream_key TEXT PRIMARY KEY, recipient TEXT NOT NULL, subject TEXT NOT NULL)",
)

SCHEMAS: dict[str, dict[str, Any]] = {
    "refund_order": {
        "description": "Refund an order, in full or in part.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "amount_cents": {"type": "integer", "minimum": 1},
                "reason": {"type": "string", "description": "Why, in the model's words."},
            },
            "required": ["order_id", "amount_cents"],
        },
    },
    "send_email": {
        "description": "Email the customer.",
        "parameters": {
            "type": "object",
            "properties": {
                "to": {"type": "string"},
                "subject": {"type": "string"},
                "body": {"type": "string"},
            },
            "required": ["to", "subject", "body"],
        },
    },
    "create_ticket": {
        "description": "Open a support ticket.",
        "parameters": {
            "type": "object",
            "properties": {"subject": {"type": "string"}, "details": {"type": "string"}},
            "required": ["subject"],
        },
    },
}


async def create_tables(store: Store) -> None:
    async with store.acquire() as conn:
        for statement in DDL:
            await conn.execute(statement)


class Bank:
    """Fails the first ``flaky`` refunds with a timeout, as real payment APIs sometimes do."""

    def __init__(self, flaky: int = 0) -> None:
        self.flaky = flaky
        self.calls: collections.Counter[str] = collections.Counter()


def register(actions: Actions, bank: Bank) -> None:
    """Register the three tools on ``actions``. Prose fields (the model's explanation, the
    email's wording) are volatile: rephrasing them on a retry is the same action."""

    @actions.tool("refund_order", volatile=("reason",))
    async def refund_order(call: ToolCall, tx: Connection) -> Any:
        bank.calls[call.action.key] += 1
        if bank.flaky:
            bank.flaky -= 1
            raise TimeoutError("the bank did not answer")  # transient: released, retried
        amount = int(call.request["amount_cents"])
        if amount <= 0:
            raise ActionFailed("a refund must be positive")  # final: stored as failed
        await tx.execute(
            "INSERT INTO example_refunds (order_id, amount_cents, action_key) VALUES ($1, $2, $3)",
            call.request["order_id"],
            amount,
            call.action.key,
        )
        return {"refunded_cents": amount, "order_id": call.request["order_id"]}

    async def find_email(call: ToolCall) -> Any:
        async with actions.store.acquire() as conn:
            sent = await conn.fetchval(
                "SELECT recipient FROM example_outbox WHERE downstream_key = $1",
                call.downstream_key,
            )
        return RUN_AGAIN if sent is None else {"sent_to": sent, "message_id": call.downstream_key}

    @actions.tool("send_email", effects="external", reconcile=find_email, volatile=("body",))
    async def send_email(call: ToolCall, tx: Connection) -> Any:
        # The provider's own dedup on our downstream key (as Stripe's Idempotency-Key): a
        # re-run after a crash cannot send twice.
        async with actions.store.acquire() as conn:
            await conn.execute(
                "INSERT INTO example_outbox (downstream_key, recipient, subject) "
                "VALUES ($1, $2, $3) ON CONFLICT (downstream_key) DO NOTHING",
                call.downstream_key,
                call.request["to"],
                call.request["subject"],
            )
        return {"sent_to": call.request["to"], "message_id": call.downstream_key}

    @actions.tool("create_ticket", volatile=("details",))
    async def create_ticket(call: ToolCall, tx: Connection) -> Any:
        await tx.execute(
            "INSERT INTO example_tickets (subject, action_key) VALUES ($1, $2)",
            call.request["subject"],
            call.action.key,
        )
        return {"ticket": f"T-{call.action.action_id}"}


class NeedsPerson(Exception):
    """An action needs a person (``ActionNeedsReview``): the agent loop stops here instead of
    showing the model an error it might retry around."""

    def __init__(self, tool: str, key: str, detail: str) -> None:
        super().__init__(f"action {key} of tool {tool} needs a person: {detail}")
        self.tool, self.key = tool, key


@dataclass(frozen=True)
class FunctionTool:
    """The function-tool shape: name, description, JSON schema, and an async callable."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    invoke: Callable[[str, str, str | None], Awaitable[str]]  # (arguments JSON, action id, turn)


def function_tools(actions: Actions, *, scope: str) -> dict[str, FunctionTool]:
    """Each registered tool as a function tool whose calls go through the executor."""

    def bind(name: str) -> FunctionTool:
        async def invoke(arguments: str, action_id: str, turn: str | None = None) -> str:
            action = actions.propose(
                name, scope=scope, action_id=action_id, request=json.loads(arguments)
            )
            try:
                result = await actions.execute(action, turn=turn)
            except ActionNeedsReview as exc:
                # Not the model's business: the tool may have acted and nothing can say. Stop
                # the run and tell a person (NeedsPerson reaches the planner's caller).
                raise NeedsPerson(name, action.key, str(exc)) from exc
            except ActionFailed as exc:  # a final answer the model should see
                return json.dumps({"error": str(exc)})
            return result.body.decode()

        schema = SCHEMAS[name]
        return FunctionTool(name, schema["description"], schema["parameters"], invoke)

    return {name: bind(name) for name in SCHEMAS}
