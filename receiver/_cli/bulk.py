"""``receiver replay --filter KEY=VALUE ...``: the console's bulk replay, for scripts.

The same job as the console's (receiver/_console/bulk.py): ``--dry-run`` counts and shows a
sample; ``--yes N`` confirms with the count (refused if the filter matches another number
now); the job is then run here, in the ledger, at ``--rate`` a second. Interrupted (Ctrl-C, a
crash), it stays in the ledger: ``--job ID`` goes on with it, and so does any console with
handlers once its lease runs out. Filters: provider, state (released or failed), type, since,
until (2h, 7d, unix seconds or ISO 8601 UTC) and error (text in the last error).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from .._console import actions, bulk
from .._exceptions import ReceiverError
from . import values
from .loading import config_receiver, load_receiver, text_argument, when


def add_bulk_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="bulk replay what matches (provider, state, type, since, until, error); repeatable",
    )
    parser.add_argument("--dry-run", action="store_true", help="with --filter: count, run nothing")
    parser.add_argument(
        "--yes", metavar="N", help="with --filter: confirm, with the number --dry-run counted"
    )
    parser.add_argument(
        "--rate",
        type=values.positive,
        default=bulk.DEFAULT_RATE,
        help="bulk replay: deliveries a second",
    )
    parser.add_argument("--job", type=values.count, help="go on with a bulk replay (its id)")


def wants_bulk(args: argparse.Namespace) -> bool:
    return bool(args.filter or args.job is not None or args.dry_run or args.yes)


def bulk_command(args: argparse.Namespace, actor: str, reason: str) -> int:
    if args.target or args.all_failed:
        raise ReceiverError("--filter and --job replay in bulk: give no PROVIDER WEBHOOK_ID")
    if args.job is not None and (args.filter or args.yes or args.dry_run):
        # A dry run changes nothing; going on with a job runs its deliveries.
        raise ReceiverError(
            "--job goes on with a confirmed job: give no --filter, --yes or --dry-run"
        )
    if args.job is None and not args.filter:
        raise ReceiverError("a bulk replay needs --filter KEY=VALUE (or --job ID)")
    given: dict[str, str] = {}
    for pair in args.filter:
        name, equals, value = text_argument("--filter", pair).partition("=")
        if not equals:
            raise ReceiverError(f"--filter {pair!r}: give KEY=VALUE, e.g. state=failed")
        given[name.strip()] = value
    wanted = bulk.Filter.parse(given, time.time())
    rx = config_receiver(args) if args.config else load_receiver(args.app)

    async def run() -> int:
        async with rx:
            job = args.job
            if job is None:
                found = await bulk.preview(rx.store, wanted)
                _show(wanted, found)
                if args.dry_run or args.yes is None:
                    if found.count and not args.dry_run:
                        print(f"confirm with --yes {found.count}", file=sys.stderr)
                    return 0
                job = await bulk.create(
                    rx.store,
                    actor,
                    wanted,
                    args.yes,
                    reason,
                    secrets.token_urlsafe(16),
                    args.rate,
                )
                print(f"bulk replay {job}: started (go on with --job {job} if interrupted)")
            return await _follow(rx.store, bulk.Runner(rx.store, rx.replay), job)

    try:
        return asyncio.run(run())
    except actions.ActionRefused as exc:
        raise ReceiverError(str(exc)) from None


def _show(wanted: bulk.Filter, found: bulk.Preview) -> None:
    print(f"{found.count} deliveries match ({wanted.describe()})")
    if found.capped:
        print(f"more match: a job runs at most {bulk.MAX_ITEMS}; narrow the time range")
    for row in found.sample:
        error = (row["last_error"] or "-").splitlines()[0][:60] if row["last_error"] else "-"
        print(
            f"  {row['provider']}/{row['webhook_id']}  {row['state']}  "
            f"type={row['event_type']}  claimed={when(row['claimed_at'])}  {error}"
        )


async def _follow(store: Any, runner: bulk.Runner, job: int) -> int:
    counts: dict[str, int] = {}
    step = _printer(counts)
    while True:
        state = await runner.run(job, step)
        if state is not None:
            break
        async with store.acquire() as conn:
            row = await conn.run("bulk_job_get", job, store.now())
        if row is None:
            raise ReceiverError(f"no bulk replay {job}")
        if row["state"] != "running":
            state = str(row["state"])
            break
        # Another runner (a console) holds it: report, and take over if its lease runs out.
        print(f"bulk replay {job}: {row['done']}/{row['total']}, run by {row['owner']}")
        await asyncio.sleep(bulk.LEASE)
    final = await bulk.outcomes(store, job)
    print(f"bulk replay {job} {state}: {bulk.summary(final)}")
    bad = set(final) - actions.SUCCEEDED - {"changed", "gone"}
    return 1 if bad or state != "done" else 0


def _printer(counts: dict[str, int]) -> Callable[[Mapping[str, Any], str], None]:
    tty = sys.stderr.isatty()

    def step(item: Mapping[str, Any], outcome: str) -> None:
        counts[outcome] = counts.get(outcome, 0) + 1
        line = f"{item['provider']}/{item['webhook_id']}: {outcome}"
        if tty:
            sys.stderr.write(f"\r{sum(counts.values())} done, last {line[:60]:<60}")
            sys.stderr.flush()
        else:
            print(line)

    return step
