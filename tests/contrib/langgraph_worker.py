"""A graph process the LangGraph tests kill: a node refunds an order through the executor and
then (with ``--hang``) says so in a file and waits to be killed, before LangGraph can checkpoint
the node's result. Without ``--hang`` it resumes the thread from its checkpoint and prints what
the node got, as JSON.

    python -m tests.contrib.langgraph_worker --store URL --checkpoints PATH --thread T [--hang F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from receiver import Actions, Connection, Store, ToolCall, store_from_url
from receiver.contrib.langgraph import GraphActions
from tests.support import EFFECTS_DDL


class Refund(TypedDict, total=False):
    order: str
    amount: int
    results: Annotated[list[dict[str, Any]], operator.add]


ORDER: Refund = {"order": "A-1001", "amount": 2599}


async def refund(call: ToolCall, tx: Connection) -> Any:
    """A refund whose effect is a row in ``effects``, committed with the ledger (``tx``)."""
    await tx.execute(
        "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
        "langgraph",
        call.action.key,
        call.fence,
        call.request["order"],
    )
    return {"refunded": call.request["amount"], "order": call.request["order"]}


def register(actions: Actions) -> None:
    actions.add_tool("refund", refund, volatile=("reason",))


async def effects(store: Store) -> list[str]:
    """The action keys of the refunds that took effect, one per row."""
    async with store.acquire() as conn:
        await conn.execute(EFFECTS_DDL)
        rows = await conn.fetch(
            "SELECT webhook_id FROM effects WHERE provider = $1 ORDER BY webhook_id", "langgraph"
        )
    return [r["webhook_id"] for r in rows]


def settle_graph(
    graph_actions: GraphActions,
    checkpointer: BaseCheckpointSaver[Any],
    hang: Path | None = None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    @graph_actions.node
    async def settle(state: Refund) -> dict[str, Any]:
        result = await graph_actions.run(
            "refund", {"order": state["order"], "amount": state["amount"]}
        )
        got = {"value": result.value, "replayed": result.replayed, "key": result.key}
        if hang is not None:
            # The refund committed with the ledger; LangGraph has not yet seen this node end.
            await asyncio.to_thread(hang.write_text, json.dumps(got))
            await asyncio.sleep(60)
        return {"results": [got]}

    builder = StateGraph(Refund)
    builder.add_node("settle", settle)
    builder.add_edge(START, "settle")
    return builder.compile(checkpointer=checkpointer)


async def main(url: str, checkpoints: Path, thread: str, hang: Path | None) -> None:
    config: Any = {"configurable": {"thread_id": thread}}
    async with (
        store_from_url(url) as store,
        AsyncSqliteSaver.from_conn_string(str(checkpoints)) as saver,
    ):
        await effects(store)
        actions = Actions(store)
        register(actions)
        graph = settle_graph(GraphActions(actions, tenant="t-1"), saver, hang)
        if hang is not None:
            await graph.ainvoke(ORDER.copy(), config, durability="sync")
            return
        final = await graph.ainvoke(None, config, durability="sync")
        print(json.dumps(final["results"]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--checkpoints", type=Path, required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--hang", type=Path)
    args = parser.parse_args()
    asyncio.run(main(args.store, args.checkpoints, args.thread, args.hang))
    sys.exit(0)
