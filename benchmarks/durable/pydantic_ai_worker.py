"""The experiment under Pydantic AI's durable agents on DBOS (``DBOSDurability``): an agent run
inside a DBOS workflow, its model a scripted FunctionModel (no network) that asks for one refund;
the refund tool alone (a plain function tool, as Pydantic AI runs it: in workflow code) or
through the executor (``receiver.contrib.pydantic_ai.ActionTools`` keyed by the durable run).
The runner kills the process after the refund, before the run records the tool's result; DBOS's
launch recovers the workflow, whose recorded model response asks for the same call again.

    python -m benchmarks.durable.pydantic_ai_worker --db URL --payments URL start SIDE WORKFLOW_ID
    python -m benchmarks.durable.pydantic_ai_worker --db URL --payments URL recover WORKFLOW_ID
    python -m benchmarks.durable.pydantic_ai_worker --db URL --payments URL latency N

``latency`` times the whole agent run (a model step, the tool, a model step) of each side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from dbos import DBOS, SetWorkflowID
from pydantic_ai import Agent, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from receiver import RUN_AGAIN, Actions, Connection, PostgresStore, ToolCall
from receiver.contrib.pydantic_ai import ActionTools

from .dbos_worker import local_only
from .refunds import LEASE, Payments, maybe_crash, refund_alone

CENTS = 2599


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model: refund the order named in the prompt, then say it is done."""
    returned = [
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]
    if returned:
        return ModelResponse(parts=[TextPart(json.dumps(returned[-1].content))])
    prompt = next(
        p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
    )
    return ModelResponse(parts=[ToolCallPart("refund", {"order": str(prompt), "cents": CENTS})])


async def main(args: argparse.Namespace) -> None:
    local_only()
    DBOS(
        config={
            "name": "receiver-durable-agent",
            "system_database_url": args.db,
            "sys_db_pool_size": 4,
            "log_level": "ERROR",
            "enable_otlp": False,
        }
    )
    payments = Payments(args.payments)
    store = PostgresStore(args.db, max_size=4)
    await store.open()
    actions = Actions(store, metrics=False, lease=LEASE, wait=10.0, sweep_interval=None)

    alone: Agent[None, str] = Agent(
        FunctionModel(script), name="refunds_alone", capabilities=[DBOSDurability()]
    )

    @alone.tool_plain
    async def refund(order: str, cents: int) -> dict[str, Any]:
        """Refund an order."""
        return await refund_alone(payments, order, cents)

    async def find_refund(call: ToolCall) -> Any:
        found = await payments.find(key=call.downstream_key)
        return found[0] if found else RUN_AGAIN

    tools: ActionTools[None] = ActionTools(actions, durable_scope="shop")

    @tools.tool(name="refund", effects="external", reconcile=find_refund)
    async def refund_once(call: ToolCall, tx: Connection, order: str, cents: int) -> Any:
        """Refund an order."""
        got = await payments.refund(order, cents, key=call.downstream_key)
        await maybe_crash("effect", got)
        return got

    keyed: Agent[None, str] = Agent(
        FunctionModel(script),
        name="refunds_keyed",
        toolsets=[tools.toolset],
        capabilities=[DBOSDurability()],
    )

    @DBOS.workflow(name="agent_settle")
    async def settle(side: str, order: str) -> dict[str, Any]:
        began = time.perf_counter()
        result = await (alone if side == "alone" else keyed).run(order)
        return {"refund": json.loads(result.output), "run_seconds": time.perf_counter() - began}

    DBOS.launch()
    try:
        if args.command == "start":
            with SetWorkflowID(args.workflow):
                print(json.dumps(await settle(args.side, args.workflow)))
        elif args.command == "recover":
            handle = await DBOS.retrieve_workflow_async(args.workflow)
            print(json.dumps(await asyncio.wait_for(handle.get_result(), 60)))
        else:
            samples: dict[str, list[float]] = {"alone": [], "executor": []}
            stamp = f"{os.getpid()}-{time.time_ns()}"
            for n in range(args.count + 2):
                for side in ("alone", "executor") if n % 2 else ("executor", "alone"):
                    with SetWorkflowID(f"lat-{stamp}-{side}-{n}"):
                        got = await settle(side, f"lat-{stamp}-{n}")
                    if n >= 2:
                        samples[side].append(got["run_seconds"])
            print(json.dumps(samples))
    finally:
        DBOS.destroy(destroy_registry=True)
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--payments", required=True)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start")
    start.add_argument("side", choices=("alone", "executor"))
    start.add_argument("workflow")
    recover = sub.add_parser("recover")
    recover.add_argument("workflow")
    latency = sub.add_parser("latency")
    latency.add_argument("count", type=int)
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
