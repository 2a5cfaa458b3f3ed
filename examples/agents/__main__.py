"""Run the scripted agent conversation against a real store, with no network and no model.

    python -m examples.agents                              # a SQLite file in a temp directory
    python -m examples.agents --store postgresql://localhost/app
    python -m examples.agents --store URL --queue          # one planner of several (see below)

The default run shows the three things an agent developer needs to see: a transient failure is
retried (the model rephrases; same action, one refund), the planner is thrown away after the
first turn and started again from the beginning (everything already done is answered from the
ledger), and the final state has exactly one effect per action.

``--queue`` runs the whole conversation once as one of several planner processes consuming
the same conversation (the multi-agent test starts two): it prints the results as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from receiver import Actions, Store, store_from_url

from .planner import FakeModel, Planner
from .tools import Bank, create_tables, function_tools, register

SCOPE = "tenant-42"


def executor(store: Store, bank: Bank) -> Actions:
    actions = Actions(store, lease=30.0, wait=10.0)
    register(actions, bank)
    return actions


async def counts(store: Store) -> dict[str, int]:
    async with store.acquire() as conn:
        return {
            table: int(await conn.fetchval(f"SELECT count(*) FROM example_{table}"))  # noqa: S608
            for table in ("refunds", "outbox", "tickets")
        }


async def demo(url: str) -> int:
    store = store_from_url(url)
    async with store:
        await create_tables(store)
        bank = Bank(flaky=1)  # the first refund times out once
        first = Planner("conv-1", function_tools(executor(store, bank), scope=SCOPE), FakeModel())
        print("turn 0 (the bank times out once; the planner retries, the model rephrases)")
        print("  ", json.dumps(await first.run_turn(0)))
        print("-- the planner process restarts and replays the conversation from the start --")
        again = Planner("conv-1", function_tools(executor(store, bank), scope=SCOPE), FakeModel())
        again.model.requests = 7  # a new process: the model words everything differently
        results = await again.run()
        for turn, result in enumerate(results):
            print(f"turn {turn}:", json.dumps(result))
        effects = await counts(store)
        print("effects:", json.dumps(effects))
    expected = {"refunds": 2, "outbox": 1, "tickets": 1}
    if effects != expected:
        print(f"UNEXPECTED: {effects} != {expected}", file=sys.stderr)
        return 1
    print("every action took effect once")
    return 0


async def queue(url: str, orders: int, reverse: bool) -> int:
    """The conversation, then ``orders`` queued refunds (in reverse order with ``reverse``, so
    that two planners meet in the middle of the queue)."""
    store = store_from_url(url)
    async with store:
        await create_tables(store)
        tools = function_tools(executor(store, Bank()), scope=SCOPE)
        results: list[object] = list(await Planner("conv-q", tools, FakeModel()).run())
        queued = sorted(range(orders), reverse=reverse)
        done = {}
        for n in queued:
            arguments = {"order_id": f"Q-{n}", "amount_cents": 100 + n, "reason": f"pid {n}"}
            done[n] = json.loads(
                await tools["refund_order"].invoke(json.dumps(arguments), f"queue.{n}", None)
            )
        results.extend(done[n] for n in range(orders))
    print(json.dumps(results, sort_keys=True))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.agents")
    parser.add_argument("--store", help="postgresql://... or sqlite:///path (default: temp)")
    parser.add_argument("--queue", action="store_true", help="run as one of several planners")
    parser.add_argument("--orders", type=int, default=0, help="queued refunds (with --queue)")
    parser.add_argument("--reverse", action="store_true", help="take the queue from its end")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.store or f"sqlite:///{Path(tmp) / 'agents.db'}"
        if args.queue:
            return asyncio.run(queue(url, args.orders, args.reverse))
        return asyncio.run(demo(url))


sys.exit(main())
