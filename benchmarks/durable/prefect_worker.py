"""The experiment under Prefect 3 (a local API server on loopback, its database a SQLite file):
a flow whose task refunds an order, alone or through the executor (``receiver.contrib.prefect``),
in a process the runner kills; recovery is Prefect's retry of the flow run.

    python -m benchmarks.durable.prefect_worker --db URL --payments URL start SIDE RUN
    python -m benchmarks.durable.prefect_worker --db URL --payments URL recover RUN
    python -m benchmarks.durable.prefect_worker --db URL --payments URL latency N

``start`` runs a flow run named RUN; ``recover`` marks that flow run crashed (what Prefect's
server does to a run whose process stopped sending heartbeats) and retries it as
``prefect flow-run retry RUN --entrypoint ...`` does: the same flow run, scheduled again and run
here with its stored parameters. The task keeps its result in Prefect's result cache
(``persist_result=True``) and retries (``retries=``) while a killed attempt still holds its
action.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
from prefect.flow_engine import run_flow
from prefect.states import Crashed, Scheduled

from receiver import Actions, PostgresStore
from receiver.contrib.prefect import PrefectActions

from .refunds import LEASE, Payments, maybe_crash, refund_alone, register

CENTS = 2599
RETRY: dict[str, Any] = {"persist_result": True, "retries": 20, "retry_delay_seconds": 0.5}


async def main(args: argparse.Namespace) -> None:
    payments = Payments(args.payments)
    store = PostgresStore(args.db, max_size=4)
    await store.open()
    actions = Actions(store, metrics=False, lease=LEASE, wait=10.0, sweep_interval=None)
    register(actions, payments)
    prefect_actions = PrefectActions(actions)

    @task(**RETRY)
    async def refund_task(order: str) -> dict[str, Any]:
        return await refund_alone(payments, order, CENTS)

    @prefect_actions.task(**RETRY)
    async def refund_through_executor(order: str) -> dict[str, Any]:
        result = await prefect_actions.run("refund", {"order": order, "cents": CENTS})
        await maybe_crash("recorded", result.value)
        value: dict[str, Any] = result.value
        return value

    @flow(name="settle", persist_result=True)
    async def settle(side: str, order: str) -> dict[str, Any]:
        began = time.perf_counter()
        if side == "alone":
            refund = await refund_task(order)
        else:
            refund = await refund_through_executor(order)
        return {"refund": refund, "step_seconds": time.perf_counter() - began}

    try:
        if args.command == "start":
            named = settle.with_options(flow_run_name=args.run)
            print(json.dumps(await named(args.side, args.run)))
        elif args.command == "recover":
            async with get_client() as client:
                (flow_run,) = await client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[args.run]))
                )
                await client.set_flow_run_state(flow_run.id, Crashed(), force=True)
                await client.set_flow_run_state(flow_run.id, Scheduled(), force=True)
                flow_run = await client.read_flow_run(flow_run.id)
            got = await run_flow(settle, flow_run=flow_run, parameters=flow_run.parameters)  # type: ignore[misc]
            print(json.dumps(got))
        else:
            samples: dict[str, list[float]] = {"alone": [], "executor": []}
            stamp = f"{os.getpid()}-{time.time_ns()}"
            for n in range(args.count + 2):
                for side in ("alone", "executor") if n % 2 else ("executor", "alone"):
                    got = await settle(side, f"lat-{stamp}-{n}")
                    if n >= 2:  # the first two rounds warm the client and the pool up
                        samples[side].append(got["step_seconds"])
            print(json.dumps(samples))
    finally:
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--payments", required=True)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start")
    start.add_argument("side", choices=("alone", "executor"))
    start.add_argument("run")
    recover = sub.add_parser("recover")
    recover.add_argument("run")
    latency = sub.add_parser("latency")
    latency.add_argument("count", type=int)
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
