"""A Pydantic AI support agent whose tools take effect once: regenerated, restarted, still once.

    python -m examples.agents.pydantic_ai_example                 # a SQLite file in a temp dir
    python -m examples.agents.pydantic_ai_example --store postgresql://localhost/app

No network and no model: Pydantic AI's own ``FunctionModel`` plays a model that words its
arguments differently on every answer and gets a new ``tool_call_id`` each time, as real models
do. The run shows three things:

1. A turn is answered: a refund (written through ``tx``, committed with the ledger) and an email
   (an outside provider that dedups on the executor's downstream key).
2. The user presses "regenerate": the same turn runs again from the history before it. The
   model's tool_call_ids are new, so keyed on them the refund would happen twice; keyed on the
   turn the application named (``Turn(scope, turn)`` in the deps) and the call's ordinal in it,
   the same actions come back with their stored results.
3. The process dies after a tool's effect, before the run finished; the application restarts
   the run from the message history it saved: the stored result, no second refund.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from receiver import RUN_AGAIN, Actions, Connection, Store, ToolCall, store_from_url
from receiver.contrib.pydantic_ai import METADATA_KEY, ActionTools, Turn

DDL = (
    "CREATE TABLE IF NOT EXISTS pai_refunds (conversation TEXT NOT NULL, order_id TEXT NOT NULL,"
    " amount_cents INTEGER NOT NULL, action_key TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS pai_outbox (downstream_key TEXT PRIMARY KEY,"
    " conversation TEXT NOT NULL, recipient TEXT NOT NULL, subject TEXT NOT NULL)",
)

PHRASINGS = itertools.cycle(
    (
        "The customer reports damage on arrival; refunding per policy.",
        "Sorry about that! Processing it right away.",
        "As requested, refunding the order now.",
    )
)

Say = Callable[[str], None]


def support_tools(actions: Actions) -> ActionTools[Turn]:
    """The agent's two tools, each registered on the executor and as a Pydantic AI tool."""
    tools: ActionTools[Turn] = ActionTools(actions)

    @tools.tool(volatile=("reason",))
    async def refund_order(
        call: ToolCall, tx: Connection, order_id: str, amount_cents: int, reason: str = ""
    ) -> dict[str, Any]:
        """Refund an order, in full or in part.

        Args:
            order_id: The order to refund.
            amount_cents: How much, in cents.
            reason: Why, in the model's words (not part of what the action is).
        """
        await tx.execute(
            "INSERT INTO pai_refunds (conversation, order_id, amount_cents, action_key) "
            "VALUES ($1, $2, $3, $4)",
            call.action.scope,
            order_id,
            amount_cents,
            call.action.key,
        )
        return {"refunded_cents": amount_cents, "order_id": order_id}

    async def find_email(call: ToolCall) -> Any:
        # After a crash mid-send: ask the provider whether it has this downstream key.
        async with actions.store.acquire() as conn:
            sent = await conn.fetchval(
                "SELECT recipient FROM pai_outbox WHERE downstream_key = $1", call.downstream_key
            )
        return RUN_AGAIN if sent is None else {"sent_to": sent, "message_id": call.downstream_key}

    @tools.tool(effects="external", reconcile=find_email, volatile=("body",))
    async def send_email(
        call: ToolCall, tx: Connection, to: str, subject: str, body: str
    ) -> dict[str, Any]:
        """Email the customer."""
        # The provider's own dedup on the executor's downstream key (as Stripe's
        # Idempotency-Key), on a connection of its own: outside the ledger's transaction.
        async with actions.store.acquire() as conn:
            await conn.execute(
                "INSERT INTO pai_outbox (downstream_key, conversation, recipient, subject) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT (downstream_key) DO NOTHING",
                call.downstream_key,
                call.action.scope,
                to,
                subject,
            )
        return {"sent_to": to, "message_id": call.downstream_key}

    return tools


def scripted_model(order_id: str, cents: int, *, email: bool) -> FunctionModel:
    """A model that asks for the refund (and the email) in one answer, then replies; each
    answer is worded anew and its tool calls get fresh ids."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if isinstance(messages[-1], ModelRequest) and any(
            isinstance(p, ToolReturnPart) for p in messages[-1].parts
        ):
            return ModelResponse(parts=[TextPart(f"Done: {order_id} is refunded.")])
        prose = next(PHRASINGS)
        parts = [
            ToolCallPart(
                "refund_order", {"order_id": order_id, "amount_cents": cents, "reason": prose}
            )
        ]
        if email:
            args = {"to": "ada@example.com", "subject": "Your refund", "body": prose}
            parts.append(ToolCallPart("send_email", args))
        return ModelResponse(parts=parts)

    return FunctionModel(answer)


def answers(messages: list[ModelMessage]) -> list[tuple[str, str, bool]]:
    """(tool_call_id, action key, replayed) of each tool answer in ``messages``."""
    return [
        (
            p.tool_call_id,
            p.metadata[METADATA_KEY]["key"],
            p.metadata[METADATA_KEY].get("replayed", False),
        )
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart) and isinstance(p.metadata, dict)
    ]


async def counts(store: Store, scope: str) -> dict[str, int]:
    async with store.acquire() as conn:
        refunds = await conn.fetchval(
            "SELECT count(*) FROM pai_refunds WHERE conversation = $1", scope
        )
        emails = await conn.fetchval(
            "SELECT count(*) FROM pai_outbox WHERE conversation = $1", scope
        )
    return {"refunds": int(refunds), "emails": int(emails)}


async def demo(store: Store, conversation: str = "conv-1", say: Say = print) -> dict[str, int]:
    """The three scenes of the module docstring, on ``store``; the effects in the end."""
    async with store.acquire() as conn:
        for statement in DDL:
            await conn.execute(statement)
    scope = f"tenant-42/{conversation}"
    tools = support_tools(Actions(store, metrics=False))
    agent: Agent[Turn, str] = Agent(deps_type=Turn, toolsets=[tools.toolset])

    say("1. turn 1: the customer asks for a refund")
    prompt = "Order A-1001 arrived broken. Please refund it and let me know."
    first = await agent.run(
        prompt, deps=Turn(scope, 1), model=scripted_model("A-1001", 2599, email=True)
    )
    for call_id, key, replayed in answers(first.all_messages()):
        say(f"   tool_call_id {call_id} -> action {key} (replayed: {replayed})")

    say("2. the user presses 'regenerate': turn 1 again, from the history before it")
    again = await agent.run(
        prompt, deps=Turn(scope, 1), model=scripted_model("A-1001", 2599, email=True)
    )
    for call_id, key, replayed in answers(again.all_messages()):
        say(f"   tool_call_id {call_id} -> action {key} (replayed: {replayed})")
    say("   new tool_call_ids, reworded arguments: the same actions, their stored results")

    say("3. turn 2: the process dies after the refund, before the run finished")
    history = first.all_messages()
    saved: list[ModelMessage] = []
    model = scripted_model("A-1002", 1250, email=False)

    def dies_after_the_tool(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if isinstance(messages[-1], ModelRequest) and any(
            isinstance(p, ToolReturnPart) for p in messages[-1].parts
        ):
            raise ConnectionResetError("killed")
        response = ModelResponse(
            parts=[ToolCallPart("refund_order", {"order_id": "A-1002", "amount_cents": 1250})]
        )
        saved[:] = [*messages, response]  # what the app persisted after the model answered
        return response

    try:
        await agent.run(
            "And A-1002 never came.",
            deps=Turn(scope, 2),
            message_history=history,
            model=FunctionModel(dies_after_the_tool),
        )
    except ConnectionResetError:
        say("   ... died; restarting the run from the saved message history")
    resumed = await agent.run(None, deps=Turn(scope, 2), message_history=saved, model=model)
    for call_id, key, replayed in answers(resumed.new_messages()):
        say(f"   tool_call_id {call_id} -> action {key} (replayed: {replayed})")
    effects = await counts(store, scope)
    say(f"effects: {json.dumps(effects)}")
    return effects


async def _main(url: str) -> int:
    store = store_from_url(url)
    async with store:
        effects = await demo(store)
    if effects != {"refunds": 2, "emails": 1}:
        print(f"UNEXPECTED: {effects}", file=sys.stderr)
        return 1
    print("every action took effect once")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.agents.pydantic_ai_example")
    parser.add_argument("--store", help="postgresql://... or sqlite:///path (default: temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(_main(args.store or f"sqlite:///{Path(tmp) / 'agent.db'}"))


if __name__ == "__main__":
    sys.exit(main())
