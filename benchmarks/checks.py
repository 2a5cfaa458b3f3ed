"""Correctness measured during the benchmark, at the end of every scenario.

Three sources are compared: what wrk saw (every answer's status, ``Idempotent-Replayed`` header
and body), what the handler counted (one line per invocation, written outside the transaction),
and what the store holds (receipts, business rows). A failure is an invariant broken:

- a delivery executed twice (two invocations, or two business rows, for one webhook-id);
- a 2xx answered for a webhook-id whose receipt is not committed as completed (I4);
- a 2xx whose body is not the stored answer byte for byte (I3);
- a completed receipt without its business row, or a business row without a completed
  receipt (the handler's write and the receipt commit together or not at all);
- a completed receipt whose handler never ran, or a forged delivery that reached the store (I5).

Anything else unexpected (a status other than the scenario's, socket errors, receipts left in
flight, a "fresh" run that saw a replay) is a warning: the figures may not mean what they say.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .load import read_logs
from .stores import Snapshot


@dataclass
class Observed:
    """What wrk saw, over every run of one scenario against the receiver."""

    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    replayed: int = 0
    ok_ids: set[str] = field(default_factory=set)
    bad_bodies: list[bytes] = field(default_factory=list)

    @property
    def answers(self) -> int:
        return sum(self.statuses.values())

    @property
    def ok(self) -> int:
        return sum(n for s, n in self.statuses.items() if 200 <= s < 300)


def observe(paths: Iterable[Path]) -> Observed:
    seen = Observed()
    for status, replayed, body in read_logs(paths):
        seen.statuses[status] += 1
        seen.replayed += replayed
        if 200 <= status < 300:
            try:
                webhook_id = orjson.loads(body)["id"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                seen.bad_bodies.append(body)
                continue
            # The stored answer is orjson.dumps({"id": ...}): a replay must be those bytes.
            if body != orjson.dumps({"id": webhook_id}):
                seen.bad_bodies.append(body)
            seen.ok_ids.add(webhook_id)
    return seen


def invocations(directory: Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for path in directory.glob("*.log"):
        with path.open() as f:
            for line in f:
                counts[line.split(" ", 1)[0]] += 1
    return counts


@dataclass
class Verdict:
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


def _sample(ids: Iterable[str], n: int = 3) -> str:
    return ", ".join(sorted(ids)[:n])


def check(
    *,
    kind: str,
    handler: str,
    seen: Observed,
    measured: Observed,
    calls: collections.Counter[str],
    ledger: Snapshot,
    expected_status: int,
) -> Verdict:
    """``kind`` is fresh, replay, mixed or forged; ``handler`` noop or insert. ``seen`` is every
    answer wrk saw, ``measured`` those of the scenario's own runs (without its seeding)."""
    v = Verdict()
    completed = ledger.with_state("completed")
    twice = {k for k, n in calls.items() if n > 1}
    if twice:
        v.failures.append(
            f"DOUBLE EXECUTION: {len(twice)} webhook-ids ran their handler more than once "
            f"(e.g. {_sample(twice)}; fences {[ledger.fences.get(k) for k in sorted(twice)[:3]]})"
        )
    not_committed = seen.ok_ids - completed
    if not_committed:
        v.failures.append(
            f"2xx WITHOUT COMMITTED RECEIPT: {len(not_committed)} webhook-ids were answered 2xx "
            f"but their receipt is not completed (e.g. {_sample(not_committed)})"
        )
    if seen.bad_bodies:
        v.failures.append(
            f"WRONG ANSWER: {len(seen.bad_bodies)} 2xx bodies are not the stored answer "
            f"(e.g. {seen.bad_bodies[0][:120]!r})"
        )
    never_ran = completed - set(calls)
    if never_ran:
        v.failures.append(
            f"COMPLETED WITHOUT EXECUTION: {len(never_ran)} receipts completed but their handler "
            f"never ran (e.g. {_sample(never_ran)})"
        )
    if handler == "insert":
        doubled = {k for k, n in ledger.business.items() if n > 1}
        if doubled:
            v.failures.append(
                f"DOUBLE COMMIT: {len(doubled)} webhook-ids have more than one business row "
                f"(e.g. {_sample(doubled)})"
            )
        without_row = completed - set(ledger.business)
        if without_row:
            v.failures.append(
                f"RECEIPT WITHOUT EFFECT: {len(without_row)} completed receipts have no business "
                f"row (e.g. {_sample(without_row)})"
            )
        orphans = set(ledger.business) - completed
        if orphans:
            v.failures.append(
                f"EFFECT WITHOUT RECEIPT: {len(orphans)} business rows belong to no completed "
                f"receipt (e.g. {_sample(orphans)})"
            )
    if kind == "forged" and ledger.states:
        v.failures.append(
            f"FORGED DELIVERY REACHED THE STORE: {len(ledger.states)} receipts after a run of "
            "forged signatures only"
        )

    unexpected = {s: n for s, n in seen.statuses.items() if s != expected_status}
    if unexpected:
        v.warnings.append(f"statuses other than {expected_status}: {unexpected}")
    if kind == "fresh" and measured.replayed:
        v.warnings.append(f"{measured.replayed} replays in a run of fresh deliveries")
    if kind == "replay" and measured.replayed != measured.ok:
        v.warnings.append(
            f"{measured.ok - measured.replayed} of {measured.ok} 2xx were not replays"
        )
    if kind == "mixed" and not 0.4 < measured.replayed / max(1, measured.ok) < 0.6:
        v.warnings.append(f"{measured.replayed} of {measured.ok} 2xx were replays, not about half")
    in_flight = ledger.with_state("in_flight")
    if in_flight:
        v.warnings.append(f"{len(in_flight)} receipts still in flight after the server stopped")
    rolled_back = set(calls) - completed
    if rolled_back:
        v.warnings.append(
            f"{len(rolled_back)} handler invocations did not complete their receipt "
            f"(states: {collections.Counter(ledger.states.get(k, 'none') for k in rolled_back)})"
        )
    v.counts = {
        "answers": seen.answers,
        "statuses": {str(k): n for k, n in sorted(seen.statuses.items())},
        "replayed": seen.replayed,
        "replayed_in_measured_runs": measured.replayed,
        "ids_answered_2xx": len(seen.ok_ids),
        "receipts": len(ledger.states),
        "completed": len(completed),
        "invocations": sum(calls.values()),
        "ids_invoked": len(calls),
        "ids_invoked_twice": len(twice),
        "business_rows": sum(ledger.business.values()),
    }
    return v
