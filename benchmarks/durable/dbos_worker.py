"""The experiment under DBOS: a workflow whose step refunds an order, alone or through the
executor (``receiver.contrib.dbos``), in a process the runner kills and DBOS recovers.

    python -m benchmarks.durable.dbos_worker --db URL --payments URL start SIDE WORKFLOW_ID
    python -m benchmarks.durable.dbos_worker --db URL --payments URL recover WORKFLOW_ID
    python -m benchmarks.durable.dbos_worker --db URL --payments URL latency N

``start`` runs the workflow (the runner sets the crash point in the environment and kills the
process there); ``recover`` launches DBOS, which recovers the workflows the killed process left
pending, and prints the workflow's result as JSON; ``latency`` runs N workflows of each side,
interleaved, and prints the step's latencies.
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

from receiver import Actions, PostgresStore
from receiver.contrib.dbos import DBOSActions

from .refunds import LEASE, Payments, maybe_crash, refund_alone, register

CENTS = 2599


def local_only() -> None:
    """DBOS talks to nothing but the local PostgreSQL: no Conductor, no cloud mode, no OTLP."""
    for name in list(os.environ):
        if name.startswith(("DBOS_", "DBOS__", "OTEL_")):
            del os.environ[name]


async def main(args: argparse.Namespace) -> None:
    local_only()
    DBOS(
        config={
            "name": "receiver-durable",
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
    register(actions, payments)
    dbos_actions = DBOSActions(actions)

    # The same retry policy on both sides: DBOS retries a step whose action is still held by the
    # killed attempt (ActionInProgress) until its lease has run out.
    retry: dict[str, Any] = {
        "retries_allowed": True,
        "max_attempts": 20,
        "interval_seconds": 0.5,
        "backoff_rate": 1.0,
    }

    @DBOS.step(**retry)
    async def refund_step(order: str) -> dict[str, Any]:
        return await refund_alone(payments, order, CENTS)

    @dbos_actions.step(**retry)
    async def refund_through_executor(order: str) -> dict[str, Any]:
        result = await dbos_actions.run("refund", {"order": order, "cents": CENTS})
        await maybe_crash("recorded", result.value)
        value: dict[str, Any] = result.value
        return value

    @DBOS.workflow(name="settle")
    async def settle(side: str, order: str) -> dict[str, Any]:
        began = time.perf_counter()
        if side == "alone":
            refund = await refund_step(order)
        else:
            refund = await refund_through_executor(order)
        return {"refund": refund, "step_seconds": time.perf_counter() - began}

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
                    if n >= 2:  # the first two rounds warm pools and DBOS up
                        samples[side].append(got["step_seconds"])
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
