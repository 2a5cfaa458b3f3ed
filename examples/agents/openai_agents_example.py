"""An OpenAI Agents SDK agent whose tools take effect once, run by the SDK's own loop with a
scripted model (no network, no API key).

    python -m examples.agents.openai_agents_example                 # a SQLite file in a temp dir
    python -m examples.agents.openai_agents_example --store postgresql://localhost/app

Two turns of a support conversation, each hit by what happens to real agents:

1. The model refunds an order and emails the customer; then the model API fails, and the
   application runs the turn again. The model regenerates its answer: new call ids, other words
   in the ``reason`` and ``body`` fields. The call ids are printed: had they been the key, the
   customer would have been refunded twice. The key is the turn and the call's ordinal in it,
   so the regenerated calls get the stored results.
2. A large refund needs a person's approval: the run stops and its state is saved as JSON (as an
   application saves it in its database). Approved, the run resumes and refunds; then the
   process dies before the turn ends. Restarted from the same saved JSON and approved again,
   the SDK runs the call again: it gets the stored result, and the refund stays one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent, ModelResponse, RunConfig, Runner, RunState, Usage
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseStreamEvent,
)

from receiver import RUN_AGAIN, Actions, Connection, Store, ToolCall, store_from_url
from receiver.contrib.openai_agents import TURN_KEY, AgentTurn, action_tool

DDL = (
    "CREATE TABLE IF NOT EXISTS oa_refunds ("
    " order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL, action_key TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS oa_outbox ("
    " message_id TEXT PRIMARY KEY, recipient TEXT NOT NULL, subject TEXT NOT NULL)",
)
TENANT, CONVERSATION = "tenant-42", "conv-7"
QUIET = RunConfig(tracing_disabled=True)  # no trace export: nothing leaves the machine


def build(actions: Actions) -> list[Any]:
    """The agent's two tools, registered on ``actions``."""

    async def large(ctx: Any, arguments: dict[str, Any], call_id: str) -> bool:
        return int(arguments.get("amount_cents", 0)) > 10_000

    @action_tool(actions, volatile=("reason",), needs_approval=large)
    async def refund_order(
        call: ToolCall, tx: Connection, order_id: str, amount_cents: int, reason: str
    ) -> dict[str, Any]:
        """Refund an order.

        Args:
            order_id: The order to refund.
            amount_cents: How much, in cents.
            reason: Why, in the model's words.
        """
        await tx.execute(
            "INSERT INTO oa_refunds (order_id, amount_cents, action_key) VALUES ($1, $2, $3)",
            order_id,
            amount_cents,
            call.action.key,
        )
        return {"order_id": order_id, "refunded_cents": amount_cents}

    async def find_email(call: ToolCall) -> Any:
        async with actions.store.acquire() as conn:
            sent = await conn.fetchval(
                "SELECT recipient FROM oa_outbox WHERE message_id = $1", call.downstream_key
            )
        return RUN_AGAIN if sent is None else {"sent_to": sent, "message_id": call.downstream_key}

    @action_tool(actions, effects="external", reconcile=find_email, volatile=("body",))
    async def send_email(
        call: ToolCall, tx: Connection, to: str, subject: str, body: str
    ) -> dict[str, Any]:
        """Email the customer."""
        # The mail provider dedups on the key the executor derives for this action.
        async with actions.store.acquire() as conn:
            await conn.execute(
                "INSERT INTO oa_outbox (message_id, recipient, subject) VALUES ($1, $2, $3) "
                "ON CONFLICT (message_id) DO NOTHING",
                call.downstream_key,
                to,
                subject,
            )
        return {"sent_to": to, "message_id": call.downstream_key}

    return [refund_order, send_email]


class ScriptedModel(Model):
    """Stands in for the LLM: answers each request with the next scripted step (output items,
    or an exception: the API failing, the process dying)."""

    def __init__(self, *steps: list[Any] | BaseException) -> None:
        self.steps = list(steps)
        self.inputs: list[Any] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.inputs.append(args[1] if len(args) > 1 else kwargs.get("input"))
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        return ModelResponse(output=step, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[ResponseStreamEvent]:
        raise NotImplementedError("this example does not stream")


def call(call_id: str, tool: str, **arguments: Any) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", call_id=call_id, name=tool, arguments=json.dumps(arguments)
    )


def say(text: str) -> ResponseOutputMessage:
    content: list[ResponseOutputText | ResponseOutputRefusal] = [
        ResponseOutputText(type="output_text", text=text, annotations=[])
    ]
    return ResponseOutputMessage(
        id="msg", type="message", role="assistant", status="completed", content=content
    )


class ProcessDied(Exception):
    """The process running the agent went away mid-turn."""


def attempt(turn: int) -> dict[str, Any]:
    """The context of one attempt of ``turn``: a new AgentTurn every time (see AgentTurn)."""
    return {TURN_KEY: AgentTurn.start(tenant=TENANT, conversation=CONVERSATION, turn=turn)}


async def counts(store: Store) -> dict[str, int]:
    async with store.acquire() as conn:
        return {
            table: int(await conn.fetchval(f"SELECT count(*) FROM oa_{table}"))  # noqa: S608
            for table in ("refunds", "outbox")
        }


async def turn_one(store: Store, tools: list[Any]) -> None:
    refund = {"order_id": "A-1001", "amount_cents": 2599}
    email = {"to": "ada@example.com", "subject": "Your refund"}
    model = ScriptedModel(
        [
            call("call_a1", "refund_order", **refund, reason="Arrived broken."),
            call("call_a2", "send_email", **email, body="Sorry! Refunded."),
        ],
        ConnectionError("the model API went away"),
        # The application runs the turn again; the model words everything differently.
        [
            call("call_b7", "refund_order", **refund, reason="Customer reports damage."),
            call("call_b8", "send_email", **email, body="We have refunded your order."),
        ],
        [say("Refunded A-1001 and emailed you.")],
    )
    agent = Agent(name="support", model=model, tools=tools)
    try:
        await Runner.run(agent, "A-1001 arrived broken", context=attempt(1), run_config=QUIET)
    except ConnectionError as exc:
        print(f"turn 1, attempt 1: the model API failed ({exc}); effects so far:", end=" ")
        print(json.dumps(await counts(store)))
    result = await Runner.run(agent, "A-1001 arrived broken", context=attempt(1), run_config=QUIET)
    outputs = [i for i in model.inputs[-1] if i.get("type") == "function_call_output"]
    async with store.acquire() as conn:
        key = await conn.fetchval("SELECT action_key FROM oa_refunds WHERE order_id = 'A-1001'")
    print(
        "turn 1, attempt 2: the model regenerated its calls: call_a1 -> call_b7, call_a2 -> call_b8"
    )
    print(f"   one action key for both refund calls, built from the turn: {key}")
    print("   the regenerated calls got the stored results:", [o["output"] for o in outputs])
    print("  ", result.final_output)


async def turn_two(store: Store, tools: list[Any]) -> None:
    big = {"order_id": "B-2002", "amount_cents": 48_000, "reason": "Lost in transit."}
    model = ScriptedModel(
        [call("call_c1", "refund_order", **big)],
        ProcessDied("SIGKILL"),  # after the refund, before the turn ends
        [say("Refunded B-2002.")],
    )
    agent = Agent(name="support", model=model, tools=tools)
    first = await Runner.run(agent, "Refund B-2002", context=attempt(2), run_config=QUIET)
    saved = first.to_state().to_string()  # the application stores this, waiting for a person
    print("turn 2: the refund waits for approval; run state saved")
    for _ in range(2):  # the second time: a new process, from the same saved state
        state = await RunState.from_string(agent, saved)
        for pending in state.get_interruptions():
            state.approve(pending)
        try:
            result = await Runner.run(agent, state, run_config=QUIET)
        except ProcessDied:
            print("   approved and resumed: refunded, then the process died; effects:", end=" ")
            print(json.dumps(await counts(store)))
        else:
            print("   restarted from the same saved state, approved again:", result.final_output)


async def demo(url: str) -> int:
    store = store_from_url(url)
    async with store:
        await store.migrate()
        async with store.acquire() as conn:
            for statement in DDL:
                await conn.execute(statement)
        tools = build(Actions(store, wait=10.0))
        await turn_one(store, tools)
        await turn_two(store, tools)
        effects = await counts(store)
    print("effects:", json.dumps(effects))
    if effects != {"refunds": 2, "outbox": 1}:
        print(f"UNEXPECTED: {effects}", file=sys.stderr)
        return 1
    print("every action took effect once")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.agents.openai_agents_example")
    parser.add_argument("--store", help="postgresql://... or sqlite:///path (default: temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(demo(args.store or f"sqlite:///{Path(tmp) / 'agents.db'}"))


if __name__ == "__main__":
    sys.exit(main())
