"""A process that executes one agent action, for the crash tests (tests/acceptance).

    python -m tests.apps.actions_worker STORE_URL TOOL ACTION_ID CALLS_FILE [--hang] [--lease S]

Tools: ``book`` is transactional (writes one ``effects`` row through ``tx``); ``pay`` is
external (its "call" is a line appended to ``CALLS_FILE.external``, the outside world's record,
and its reconcile reads that record); ``mail`` is external without reconcile. Every tool
appends one line to ``CALLS_FILE`` per true run, committed or not. With ``--hang`` the tool,
after its effect and before its result can be stored, prints ``HANG`` and waits to be killed.

Prints one JSON line: ``{"result": ..., "replayed": ...}`` or ``{"error": "<class name>"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from receiver import RUN_AGAIN, ActionError, Actions, Connection, ToolCall, store_from_url
from tests.support import EFFECTS_DDL


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("tool")
    parser.add_argument("action_id")
    parser.add_argument("calls")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--lease", type=float, default=1.0)
    args = parser.parse_args()
    calls = Path(args.calls)
    external = Path(args.calls + ".external")

    async def hang() -> None:
        if args.hang:
            print("HANG", flush=True)
            await asyncio.sleep(3600)

    store = store_from_url(args.store)
    async with store:
        async with store.acquire() as conn:
            await conn.execute(EFFECTS_DDL)
        actions = Actions(store, lease=args.lease, wait=0.0, metrics=False)

        @actions.tool("book")
        async def book(call: ToolCall, tx: Connection) -> Any:
            _append(calls, f"{call.action.key} {call.fence} {os.getpid()}")
            await tx.execute(
                "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
                "action",
                call.action.key,
                call.fence,
                "book",
            )
            await hang()  # killed here: the write is in the open transaction, not committed
            return {"booked": call.request["room"], "fence": call.fence}

        async def find_payment(call: ToolCall) -> Any:
            made = _lines(external)
            return {"paid": True, "reconciled": True} if call.downstream_key in made else RUN_AGAIN

        @actions.tool("pay", effects="external", reconcile=find_payment)
        async def pay(call: ToolCall, tx: Connection) -> Any:
            _append(calls, f"{call.action.key} {call.fence} {os.getpid()}")
            _append(external, call.downstream_key)  # the outside world acted
            await hang()  # killed here: the call happened, its result is not stored
            return {"paid": True}

        @actions.tool("mail", effects="external")
        async def mail(call: ToolCall, tx: Connection) -> Any:
            _append(calls, f"{call.action.key} {call.fence} {os.getpid()}")
            await hang()
            return {"mailed": True}

        action = actions.propose(
            args.tool, scope="tenant-1", action_id=args.action_id, request={"room": "12"}
        )
        try:
            result = await actions.execute(action)
        except ActionError as exc:
            print(json.dumps({"error": type(exc).__name__}), flush=True)
            return 0
    print(json.dumps({"result": result.value, "replayed": result.replayed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
