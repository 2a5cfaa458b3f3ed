"""Bulk replay: every failed or released delivery that a filter matches, run again as one job
that the ledger owns.

- **Dry run**: :func:`preview` counts the matches (through the index of the small states,
  never the whole ledger) and shows a sample.
- **Confirmation**: :func:`create` takes the count the operator typed. In one transaction it
  records the job, snapshots the matching keys with the fence each has now, checks that their
  number is the typed one (else nothing is written: the filter matches something else now),
  and writes the job's audit row. The form's id is unique in the ledger, so a second click (or
  a second console) finds the same job instead of making another.
- **Running**: a :class:`Runner` takes the job's lease (a compare-and-set: of two consoles, one
  holds it), renews it as it goes, and replays the items in order at the job's rate, through
  the Receiver's replay (the claim and fence path of a single replay: a queued dead letter goes
  back to the workers, an inline delivery runs through the pipeline). A runner that dies leaves
  its lease to run out; the next console (or ``receiver replay --job``) takes the job over and
  goes on from the first item not done. Cancelling stops the job between two items.
- **Exactly once**: an item is marked ``started`` just before its replay begins (each on its
  own, not with the batch it was read in: the items a crashed runner never reached stay
  ``pending``) and ``done`` with the outcome after it (with the others done in the last half
  second). An item found ``started`` after a crash is judged from its receipt: still at the
  snapshotted fence, it never ran (replay it); one fence on and completed, failed again or
  queued, its replay happened (record what it did); one fence on and in flight with its lease
  run out, the attempt died before finishing: the replay reconciles it (transactional
  handlers' work rolled back with it and runs again; an external handler's ``reconcile()``
  decides, or the delivery is held for review: it is never run again blindly); in flight with
  a live lease, wait. A pending item whose receipt moved on (a sender's retry, another
  operator) is skipped as ``changed``, never counted as what the job did.
- **Audit**: one row for the job (action ``bulk replay``), its outcome ``done`` or
  ``cancelled`` and the counts per outcome when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from .._exceptions import ReceiverError
from .._ledger import receipts as ledger
from .._ledger.receipts import Key, State
from .._logging import get_logger
from .._store.base import Store
from . import actions

logger = get_logger("receiver")

#: The most deliveries one job replays (a larger outage is several jobs, by time range).
MAX_ITEMS = 100_000
#: Seconds a runner holds a job without renewing; it renews every second or so.
LEASE = 5.0
#: Seconds between two looks for a job nobody runs.
POLL = 1.0
#: Items read (and marked started) at once, and seconds between two writes of outcomes.
BATCH = 50
FLUSH = 0.5
#: Deliveries per second, unless configured.
DEFAULT_RATE = 20.0
SAMPLE = 20
STATES = ("", "released", "failed")
_RELATIVE = {"m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, slots=True)
class Filter:
    """Which deliveries a bulk replay runs; empty strings and None mean "any"."""

    provider: str = ""
    state: str = ""  # released, failed, or both
    event_type: str = ""
    since: float | None = None  # claimed at or after (unix seconds)
    until: float | None = None  # claimed before
    error: str = ""  # text in the last error, case-insensitive

    @classmethod
    def parse(cls, given: Mapping[str, str], now: float) -> Filter:
        """From a form, a query string or ``--filter KEY=VALUE`` pairs; a clear error for a
        value that is not one."""
        unknown = set(given) - {"provider", "state", "type", "since", "until", "error"}
        if unknown:
            raise ReceiverError(
                f"unknown filter {', '.join(repr(k) for k in sorted(unknown))}: use provider, "
                "state, type, since, until, error"
            )
        state = given.get("state", "").strip()
        if state not in STATES:
            raise ReceiverError(f"state {state!r}: a bulk replay runs released or failed ones")
        provider = given.get("provider", "").strip()
        if ":" in provider:
            raise ReceiverError("only webhook deliveries are replayed in bulk")
        parts = {k: given.get(k, "") for k in ("provider", "type", "error")}
        if any("\x00" in v or len(v) > 500 for v in parts.values()):
            raise ReceiverError("a filter value is longer than 500 characters or holds a NUL")
        found = cls(
            provider=provider,
            state=state,
            event_type=given.get("type", "").strip(),
            since=moment(given.get("since", ""), now, "since"),
            until=moment(given.get("until", ""), now, "until"),
            error=given.get("error", "").strip(),
        )
        if found.since is not None and found.until is not None and found.since >= found.until:
            raise ReceiverError("since must be before until")
        return found

    def query(self) -> dict[str, str]:
        """The filter as form fields (times as ISO 8601, UTC)."""
        return {
            "provider": self.provider,
            "state": self.state,
            "type": self.event_type,
            "since": iso(self.since),
            "until": iso(self.until),
            "error": self.error,
        }

    def args(self) -> tuple[Any, ...]:
        return (
            self.provider,
            self.state,
            self.event_type,
            self.since,
            self.until,
            self.error,
        )

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.query().items() if v]
        return ", ".join(parts) or "every failed or released delivery"


def moment(text: str, now: float, name: str) -> float | None:
    """``''`` (no bound), a relative ``90m``/``2h``/``7d`` (before now), unix seconds, or ISO
    8601 (UTC unless it says otherwise)."""
    text = text.strip()
    if not text:
        return None
    try:
        if not text.isascii():
            raise ValueError(text)
        if text[-1:] in _RELATIVE and text[:-1].isdigit():
            seconds = now - int(text[:-1]) * _RELATIVE[text[-1]]
        elif text.replace(".", "", 1).isdigit():
            seconds = float(text)
        else:
            seconds = _iso(text)
    except (ValueError, OverflowError):
        raise ReceiverError(
            f"{name} {text!r} is not a time: give 2h, 7d, unix seconds or 2026-12-04T15:00"
        ) from None
    # Receipts are from 1970 on; a moment past year 9999 cannot even be shown.
    if not 0 <= seconds <= _LAST_MOMENT:
        raise ReceiverError(f"{name} {text!r} is before 1970 or after 9999")
    return seconds


_LAST_MOMENT = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC).timestamp()


def _iso(text: str) -> float:
    parsed = datetime.datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


def iso(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")


@dataclass(frozen=True, slots=True)
class Preview:
    count: int
    capped: bool  # more than MAX_ITEMS match
    sample: list[dict[str, Any]]


async def preview(store: Store, wanted: Filter) -> Preview:
    """The dry run: how many deliveries the filter matches, and the first few."""
    async with store.acquire() as conn:
        counted = await conn.run("bulk_count", *wanted.args(), MAX_ITEMS + 1)
        sample = await conn.run_all("bulk_match", *wanted.args(), SAMPLE)
    n = int(counted["n"]) if counted is not None else 0
    return Preview(min(n, MAX_ITEMS), n > MAX_ITEMS, [dict(r) for r in sample])


async def create(
    store: Store,
    actor: str,
    wanted: Filter,
    typed: str,
    reason_text: str,
    request: str,
    rate: float,
) -> int:
    """The confirmed job's id (see the module docstring); refused if the typed count is not
    the number of deliveries the filter matches now."""
    reason = actions.reason_of(reason_text)
    try:
        expected = int(typed.strip().replace(",", "").replace("_", ""))
    except ValueError:
        raise actions.ActionRefused(
            "not confirmed: type the number of deliveries the dry run counted"
        ) from None
    if not 0 < rate <= 1000:
        raise actions.ActionRefused("the rate is between 0 and 1000 deliveries a second")
    if not 8 <= len(request) <= 100:
        raise actions.ActionRefused("the confirmation form carries no id: count again")
    described = orjson.dumps(asdict(wanted)).decode()
    async with store.acquire() as conn, conn.transaction():
        row = await conn.run("bulk_job_add", request, store.now(), actor, reason, described, rate)
        if row is None:  # this form was sent before: its job
            found = await conn.run("bulk_job_by_request", request)
            assert found is not None
            return int(found["id"])
        job = int(row["id"])
        await conn.run("bulk_snapshot", *wanted.args(), MAX_ITEMS, job)
        audit = await conn.run(
            "console_audit_add",
            store.now(),
            actor,
            "bulk replay",
            wanted.provider or "*",
            f"job {job}",
            None,
            f"{reason} [{wanted.describe()}]"[: actions.MAX_REASON],
            None,
        )
        assert audit is not None
        total = await conn.run("bulk_job_total", job, int(audit["id"]))
        assert total is not None
        if int(total["total"]) != expected or expected == 0:
            raise actions.ActionRefused(
                f"not confirmed: the filter matches {total['total']} deliveries now, not "
                f"{expected}: count again"
            )
    return job


async def cancel(store: Store, job: int) -> bool:
    """Stop a running job between two items (the items not done stay as they are)."""
    async with store.acquire() as conn:
        row = await conn.run("bulk_job_cancel", job, store.now())
    if row is None:
        return False
    await _close_audit(store, job, row["audit_id"], "cancelled")
    return True


async def outcomes(store: Store, job: int) -> dict[str, int]:
    async with store.acquire() as conn:
        rows = await conn.run_all("bulk_outcomes", job)
    return {(r["outcome"] or "to do"): int(r["n"]) for r in rows}


def summary(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "nothing"


async def _close_audit(store: Store, job: int, audit_id: int | None, outcome: str) -> None:
    if audit_id is None:
        return
    detail = summary(await outcomes(store, job))
    async with store.acquire() as conn:
        await conn.run("console_audit_done", int(audit_id), outcome, detail)


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Runner:
    """Runs bulk replay jobs with one Receiver's handlers, one job at a time."""

    def __init__(self, store: Store, replayer: actions.Replayer, owner: str | None = None) -> None:
        self.store = store
        self.replayer = replayer
        self.owner = owner or owner_id()
        self.wake = asyncio.Event()

    async def serve(self) -> None:
        """Forever: take a job nobody runs (a new one, or one whose runner died) and run it."""
        while True:
            try:
                async with self.store.acquire() as conn:
                    row = await conn.run("bulk_job_orphan", self.store.now())
                if row is not None:
                    await self.run(int(row["id"]))
                    continue
            except ReceiverError as exc:  # the ledger is away: look again later
                logger.warning("bulk replay runner: %s", type(exc).__name__)
            except Exception:  # a bug must not end the runner: the job waits, and is retried
                logger.exception("bulk replay runner failed; it looks again shortly")
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), POLL)

    async def run(self, job: int, progress: Any = None) -> str | None:
        """Run ``job`` while this runner holds it: its final state (``done``, ``cancelled``), or
        None if another runner holds it (or took it over).

        Items are read in batches; each is marked started in the statement just before its
        replay (so that after a crash the items not reached are still pending), and the
        outcomes are written together (with the job's progress) every ``FLUSH`` seconds: the
        runner adds one write per delivery to the replay's own, and one per flush."""
        rate = await self._lease(job)
        if rate is None:
            return None
        interval = 1.0 / rate
        renewed = flushed = next_at = time.monotonic()
        outcomes: list[tuple[int, str]] = []
        try:
            while True:
                async with self.store.acquire() as conn:
                    items = await conn.run_all("bulk_items_next", job, BATCH)
                if not items:
                    return await self._finish(job)
                waiting = 0
                for item in items:
                    now = time.monotonic()
                    if now - renewed >= 1.0:
                        if await self._lease(job) is None:
                            return await self._lost(job, outcomes)
                        renewed = now
                    if now - flushed >= FLUSH:
                        await self._flush(job, outcomes)
                        flushed = now
                    await asyncio.sleep(max(0.0, next_at - now))
                    next_at = max(next_at, now) + interval
                    outcome = await self._item(job, item)
                    if outcome is None:
                        waiting += 1
                        continue
                    outcomes.append((int(item["seq"]), outcome))
                    if progress is not None:
                        progress(item, outcome)
                await self._flush(job, outcomes)
                if waiting == len(items):
                    await asyncio.sleep(1.0)  # only attempts still running: look again later
                    if await self._lease(job) is None:
                        return await self._lost(job, outcomes)
                    renewed = time.monotonic()
        finally:
            # Cancelled or failing: what is known is kept (a crash loses it, and the next
            # runner judges those items from their receipts instead).
            with contextlib.suppress(Exception):
                await asyncio.shield(self._flush(job, outcomes))

    async def _flush(self, job: int, outcomes: list[tuple[int, str]]) -> None:
        if not outcomes:
            return
        done = [(job, seq, outcome) for seq, outcome in outcomes]
        outcomes.clear()
        async with self.store.acquire() as conn, conn.transaction():
            written = await conn.run_many("bulk_item_done", done)
            if written:
                await conn.run("bulk_job_progress", job, len(written))

    async def _lease(self, job: int) -> float | None:
        """Take or keep the job's lease; its rate, or None if it is not this runner's."""
        async with self.store.acquire() as conn:
            row = await conn.run("bulk_job_lease", job, self.owner, LEASE, self.store.now())
        return None if row is None else float(row["rate"])

    async def _lost(self, job: int, outcomes: list[tuple[int, str]]) -> str | None:
        """The lease is gone: cancelled (the audit's counts then include what this runner did
        since its last write), or taken over."""
        await self._flush(job, outcomes)
        async with self.store.acquire() as conn:
            row = await conn.run("bulk_job_get", job, self.store.now())
        if row is not None and row["state"] == "cancelled":
            await _close_audit(self.store, job, row["audit_id"], "cancelled")
        return await self._state(job)

    async def _state(self, job: int) -> str | None:
        async with self.store.acquire() as conn:
            row = await conn.run("bulk_job_get", job, self.store.now())
        state = None if row is None else str(row["state"])
        return state if state in ("done", "cancelled") else None

    async def _finish(self, job: int) -> str | None:
        async with self.store.acquire() as conn:
            row = await conn.run("bulk_job_finish", job, self.owner, self.store.now())
        if row is None:
            return await self._state(job)
        await _close_audit(self.store, job, row["audit_id"], "done")
        return "done"

    async def _item(self, job: int, item: Mapping[str, Any]) -> str | None:
        """Replay one item (or judge what its interrupted replay did); its outcome, or None
        while an attempt on it is still running."""
        key = Key(item["provider"], item["webhook_id"])
        fence, started = int(item["fence"]), item["state"] == "started"
        async with self.store.acquire() as conn:
            receipt = await ledger.lookup(conn, key, self.store.now())
        outcome: str | None
        if receipt is None:
            outcome = "gone"
        elif receipt.fence == fence and receipt.state in (State.RELEASED, State.FAILED):
            if not started:
                # Marked before the replay can claim it: after a crash, an item still pending
                # was never reached, and whatever moved its receipt on was not this job.
                async with self.store.acquire() as conn:
                    await conn.run("bulk_item_started", job, item["seq"])
            outcome = await self._replay(key)
        elif not started:
            outcome = "changed"  # a sender's retry or another operator got there first
        elif receipt.fence == fence and receipt.state is State.QUEUED:
            outcome = "queued"  # the replay gave it back to the workers, then the crash
        elif receipt.fence != fence + 1:
            outcome = "changed"
        elif receipt.state is State.COMPLETED:
            outcome = "executed"
        elif receipt.state is State.IN_FLIGHT and receipt.lease_until > receipt.now:
            return None  # the interrupted attempt's lease still runs (or it is alive)
        elif receipt.state is State.IN_FLIGHT:
            # Died before finishing: the replay reconciles an external attempt, never re-runs it.
            outcome = await self._replay(key)
        else:
            outcome = "failed again"
        return outcome

    async def _replay(self, key: Key) -> str:
        try:
            reply = await self.replayer(key.provider, key.webhook_id)
        except ReceiverError as exc:
            logger.info("bulk replay: %s/%s refused: %s", key.provider, key.webhook_id, exc)
            return "refused"
        outcome = str(reply.outcome)
        return outcome


class Host:
    """A console's bulk replay runner, run in its process (a console with handlers only): it
    takes the jobs nobody runs, and is woken for the one just confirmed."""

    def __init__(self, store: Store, replayer: actions.Replayer | None) -> None:
        self.runner = None if replayer is None else Runner(store, replayer)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> bool:
        """Start (or wake) the runner; False without handlers."""
        if self.runner is None:
            return False
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.runner.serve())
        self.runner.wake.set()
        return True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
