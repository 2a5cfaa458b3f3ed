"""The commands that read or act on stored receipts: ``receiver inspect``, ``receiver
failed`` and ``receiver replay``."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import socket
import sys
from typing import Any

import orjson

from .._console import actions
from .._console.receipt import attempts_line
from .._console.redaction import error_line
from .._exceptions import ReceiverError
from .._ledger import keyed
from .._ledger import receipts as ledger
from .._ledger.receipts import Key, Receipt
from .._queue import receipts as queue
from .._store.base import Row
from .._webhooks.replay import failed_keys
from .bulk import bulk_command, wants_bulk
from .loading import (
    config_receiver,
    existing_store,
    load_receiver,
    read,
    store_url,
    text_argument,
    when,
)
from .output import emit, instant


def inspect_command(args: argparse.Namespace) -> int:
    provider = text_argument("provider", args.provider)
    webhook_id = text_argument("webhook id", args.webhook_id)
    if args.principal is not None:
        if keyed.namespace(provider) != keyed.IDEMPOTENCY:
            raise ReceiverError("--principal is for Idempotency-Keys: PROVIDER idem:NAMESPACE")
        principal = text_argument("--principal", args.principal)
        webhook_id = orjson.dumps([principal, webhook_id]).decode()
    store = existing_store(store_url(args))

    async def run() -> tuple[Receipt | None, list[Row]]:
        async with store, store.acquire() as conn:
            receipt = await ledger.lookup(conn, Key(provider, webhook_id))
            attempts = await conn.run_all("list_attempts", provider, webhook_id)
            return receipt, attempts

    receipt, attempts = read(store, run)
    if receipt is None:
        print(f"no receipt for {args.provider}/{args.webhook_id}", file=sys.stderr)
        if args.json:
            emit({"receipt": None})
        return 1
    status = queue.rejected_status(receipt.state, receipt.last_error)
    if args.json:
        emit({"receipt": _receipt(args, provider, webhook_id, receipt, attempts, status)})
        return 0
    print(f"receipt      {args.provider}/{args.webhook_id}")
    print(f"kind         {_kind(provider, webhook_id)}")
    review = " - NEEDS REVIEW by a person" if keyed.needs_review(receipt) else ""
    if status is not None:
        review = f" - REJECTED BY ITS HANDLER (HTTP {status}; not retried)"
    print(f"state        {receipt.state.value} (fence {receipt.fence}){review}")
    print(f"event type   {receipt.event_type or '-'}")
    print(f"claimed at   {when(receipt.claimed_at)}")
    print(f"lease until  {when(receipt.lease_until)}")
    print(f"completed at {when(receipt.completed_at)}")
    print(f"expires at   {when(receipt.expires_at)}")
    print(f"payload hash {receipt.payload_hash.hex()}")
    print(f"attempts     {attempts_line(receipt.attempts, len(attempts))} failed")
    for attempt in attempts:
        error = error_line(attempt["error"], None)
        print(f"  fence {attempt['fence']} at {when(attempt['failed_at'])}: {error}")
    if receipt.response is not None:
        r = receipt.response
        sent = " - the sender's answer, given before its handler finished" if status else ""
        print(f"response     {r.status} {r.content_type} ({len(r.body)} bytes){sent}")
        print("  " + r.body[:2000].decode("utf-8", "replace"))
    return 0


def failed_command(args: argparse.Namespace) -> int:
    provider = text_argument("--provider", args.provider)
    store = existing_store(store_url(args))

    async def run() -> list[Row]:
        async with store, store.acquire() as conn:
            return await conn.run_all("list_failed", provider, args.limit)

    rows = read(store, run)
    if args.json:
        emit({"receipts": [_failed(row) for row in rows]})
        return 0
    if not rows:
        print("no failed receipts")
        return 0
    for row in rows:
        error = error_line(row["last_error"], 80) or "-"
        kind = _row_kind(row["provider"])
        state = row["state"]
        status = queue.rejected_status(state, row["last_error"])
        if status is not None:
            state = f"{state} (rejected by its handler: HTTP {status})"
        print(
            f"{row['provider']}/{row['webhook_id']}  {state}  kind={kind}  "
            f"type={row['event_type']}  attempts={row['attempts']}  "
            f"claimed={when(row['claimed_at'])}  {error}"
        )
    # The handlers a replay needs come from where this project names them.
    handlers = f"--config {args.config}" if args.config else "--app mod:attr"
    print(
        f"webhooks: replay one with receiver replay PROVIDER WEBHOOK_ID {handlers}, all of "
        f"them with receiver replay --all-failed {handlers}; actions and Idempotency-Keys "
        "run again when their caller retries (receiver inspect PROVIDER KEY for details)",
        file=sys.stderr,
    )
    return 0


def _receipt(
    args: argparse.Namespace,
    provider: str,
    webhook_id: str,
    receipt: Receipt,
    attempts: list[Row],
    status: int | None,
) -> dict[str, Any]:
    """``inspect --json``: the text's facts, errors masked as the text masks them."""
    response = None
    if receipt.response is not None:
        r = receipt.response
        response = {
            "status": r.status,
            "content_type": r.content_type,
            "bytes": len(r.body),
            "body": r.body[:2000].decode("utf-8", "replace"),
        }
    return {
        "provider": args.provider,
        "webhook_id": args.webhook_id,
        "kind": _kind(provider, webhook_id),
        "state": receipt.state.value,
        "fence": receipt.fence,
        "needs_review": keyed.needs_review(receipt),
        "rejected_status": status,
        "event_type": receipt.event_type,
        "claimed_at": instant(receipt.claimed_at),
        "lease_until": instant(receipt.lease_until),
        "completed_at": instant(receipt.completed_at),
        "expires_at": instant(receipt.expires_at),
        "payload_hash": receipt.payload_hash.hex(),
        "attempts": receipt.attempts,
        "failed_attempts": [
            {
                "fence": attempt["fence"],
                "failed_at": instant(attempt["failed_at"]),
                "error": error_line(attempt["error"], None),
            }
            for attempt in attempts
        ],
        "response": response,
    }


def _failed(row: Row) -> dict[str, Any]:
    """One line of ``failed --json``: the text's fields, the error masked as the text's."""
    return {
        "provider": row["provider"],
        "webhook_id": row["webhook_id"],
        "state": row["state"],
        "rejected_status": queue.rejected_status(row["state"], row["last_error"]),
        "kind": _row_kind(row["provider"]),
        "event_type": row["event_type"],
        "attempts": row["attempts"],
        "claimed_at": instant(row["claimed_at"]),
        "error": error_line(row["last_error"], 80) or None,
    }


def _row_kind(provider: str) -> str:
    return {keyed.ACTION: "action", keyed.IDEMPOTENCY: "idempotency-key"}.get(
        keyed.namespace(provider) or "", "webhook"
    )


def _kind(provider: str, webhook_id: str) -> str:
    """What a ledger row is, for people: a webhook delivery, an agent action or a keyed
    request (their rows share the ledger under a namespaced provider)."""
    namespace = keyed.namespace(provider)
    if namespace == keyed.ACTION:
        return f"agent action of tool {provider.partition(':')[2]} (actions.inspect(key) in code)"
    if namespace == keyed.IDEMPOTENCY:
        try:
            principal, key = orjson.loads(webhook_id)
        except (orjson.JSONDecodeError, ValueError, TypeError):
            return "Idempotency-Key request"
        return (
            f"Idempotency-Key request of {provider.partition(':')[2]}: principal {principal!r}, "
            f"key {key!r}"
        )
    return "webhook delivery"


def replay_command(args: argparse.Namespace) -> int:
    actor = _actor(args.actor)
    if wants_bulk(args):
        return bulk_command(args, actor, text_argument("--reason", args.reason))
    if args.all_failed == bool(args.target) or len(args.target) not in (0, 2):
        raise ReceiverError(
            "replay takes PROVIDER WEBHOOK_ID, or --all-failed [--provider P] [--limit N]"
        )
    for index, value in enumerate(args.target):
        text_argument("provider" if index == 0 else "webhook id", value)
    text_argument("--provider", args.provider)
    reason = actions.reason_of(text_argument("--reason", args.reason))
    rx = config_receiver(args) if args.config else load_receiver(args.app)

    async def run() -> int:
        async with rx:
            if args.target:
                keys = [Key(*args.target)]
            else:
                keys = await failed_keys(rx, args.provider, args.limit)
                if not keys:
                    print("no failed receipts to replay")
                    return 0
            progress = _Progress(len(keys)) if args.all_failed and sys.stderr.isatty() else None
            done: dict[str, int] = {}
            failed = False
            for key in keys:
                name = f"{key.provider}/{key.webhook_id}"
                # The console's own replay: one audit row per replay, with its outcome.
                result: actions.Done | None = None
                try:
                    result = await actions.replay(rx.store, rx.replay, actor, key, None, reason)
                except actions.ActionRefused as exc:
                    outcome, line, failed = "refused", f"refused: {exc}", True
                else:
                    outcome, line = result.outcome, f"{name}: {result.outcome} ({result.detail})"
                    failed = failed or not result.ok
                done[outcome] = done.get(outcome, 0) + 1
                if progress is not None:
                    progress.step(f"{name} {outcome}")
                else:
                    print(line, file=sys.stderr if outcome == "refused" else sys.stdout)
                if args.target and result is not None and result.reply is not None:
                    body = bytes(result.reply.response.body)
                    print(body[:2000].decode("utf-8", "replace"))
            if progress is not None:
                progress.close()
            if args.all_failed:
                summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(done.items()))
                print(f"replayed {len(keys)}: {summary}")
            return 1 if failed else 0

    return asyncio.run(run())


def _actor(given: str) -> str:
    """Who the audit records: --actor with its whitespace collapsed, else (empty, or only
    spaces) the OS user."""
    actor = " ".join(text_argument("--actor", given).split())[:100]
    return actor or default_actor()


def default_actor(command: str = "receiver replay") -> str:
    """Who acts from a command line: the OS user, as the audit records it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()} ({command})"


class _Progress:
    """A one-line progress bar on a terminal (stderr)."""

    def __init__(self, total: int, width: int = 30) -> None:
        self.total, self.width, self.count = total, width, 0

    def step(self, label: str) -> None:
        self.count += 1
        filled = self.width * self.count // self.total
        bar = "#" * filled + "." * (self.width - filled)
        sys.stderr.write(f"\r[{bar}] {self.count}/{self.total} {label[:60]:<60}")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()
