"""The overview's figures: receipts per provider and state, what is stuck, what needs a person,
each provider's dedup window, and deliveries, failures and replays over time.

Each figure is read at a cost that does not grow with the ledger: the metrics' state counts
(partial indexes, and the planner's estimate of the completed ones on a large PostgreSQL
table), the oldest in-flight claim through the in-flight index, a loose scan for the
providers, one index probe per provider for its newest receipt, and charts whose buckets
each read a bounded number of index entries (receiver/_console/queries.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from .._ops.counts import count_receipts
from .._store.base import Connection
from . import queries
from .queries import Bucket

#: Chart ranges: (buckets, seconds per bucket).
RANGES = {"1h": (60, 60), "24h": (24, 3600), "7d": (28, 6 * 3600)}
STATES = ("in_flight", "queued", "completed", "released", "failed")


@dataclass
class ProviderFigures:
    name: str
    kind: str
    counts: dict[str, int] = field(default_factory=dict)
    needs_review: int = 0
    oldest_in_flight: float | None = None  # claimed_at of the oldest in-flight receipt
    window: float | None = None
    window_source: str = ""  # "configured" or "observed"


@dataclass
class Overview:
    now: float
    providers: list[ProviderFigures]
    deliveries: list[Bucket]
    failures: list[Bucket]
    replays: list[Bucket]
    step: float
    #: This process's deliveries shed under load over the last minute: per second, and their
    #: share of arrivals (None: the console has no receiver in this process).
    shed: tuple[float, float] | None = None

    def total(self, state: str) -> int:
        return sum(p.counts.get(state, 0) for p in self.providers)

    @property
    def needs_review(self) -> int:
        return sum(p.needs_review for p in self.providers)

    @property
    def oldest_in_flight(self) -> tuple[str, float] | None:
        found = [(p.oldest_in_flight, p.name) for p in self.providers if p.oldest_in_flight]
        if not found:
            return None
        claimed, name = min(found)
        assert claimed is not None
        return name, claimed


async def collect(
    conn: Connection, now: float, configured: Mapping[str, float], chart_range: str = "24h"
) -> Overview:
    """``configured``: each provider's dedup window in seconds, where a Receiver is known."""
    names = await queries.providers(conn)
    figures = {n: ProviderFigures(n, queries.kind_of(n)) for n in names}
    for name in configured:
        figures.setdefault(name, ProviderFigures(name, "webhook"))
    for (provider, state), n in (await count_receipts(conn)).items():
        figures.setdefault(provider, ProviderFigures(provider, queries.kind_of(provider)))
        figures[provider].counts[state] = n
    for row in await conn.run_all("console_needs_review_counts"):
        if row["provider"] in figures:
            figures[row["provider"]].needs_review = int(row["n"])
    for row in await conn.run_all("oldest_in_flight_by_provider"):
        if row["provider"] in figures and row["claimed_at"] is not None:
            figures[row["provider"]].oldest_in_flight = float(row["claimed_at"])
    for name, figure in figures.items():
        if name in configured:
            figure.window, figure.window_source = configured[name], "configured"
            continue
        newest = await conn.run("console_receipts", name, None, None, None, "", "", "", 1, 1, None)
        if newest is not None and not newest["queued"]:
            span = float(newest["expires_at"]) - float(newest["claimed_at"])
            if 0 < span < 1e11:
                figure.window, figure.window_source = span, "observed"
    buckets, step = RANGES.get(chart_range, RANGES["24h"])
    end = math.ceil(now / step) * step
    start = end - buckets * step
    webhooks = [n for n in names if queries.kind_of(n) == "webhook"]
    deliveries = queries.add(
        [
            await queries.chart(conn, "console_delivery_chart", [n], start, step, buckets)
            for n in webhooks
        ]
    ) or [Bucket(start + i * step, 0, False) for i in range(buckets)]
    failures = await queries.chart(conn, "console_failure_chart", [], start, step, buckets)
    replays = await queries.chart(conn, "console_replay_chart", [], start, step, buckets)
    order = sorted(figures.values(), key=lambda f: ({"webhook": 0}.get(f.kind, 1), f.name))
    return Overview(now, order, deliveries, failures, replays, step)


def turns(registry: CollectorRegistry | None) -> dict[str, tuple[float, float, float]]:
    """Per tool: (turns, keys over turns, most keys in a recent turn), from the metrics."""
    if registry is None:
        return {}
    found: dict[str, list[float]] = {}
    names = {
        "receiver_action_turns_total": 0,
        "receiver_action_turn_keys_total": 1,
        "receiver_action_max_keys_per_turn": 2,
    }
    for metric in registry.collect():
        for sample in metric.samples:
            index = names.get(sample.name)
            if index is not None and "action" in sample.labels:
                found.setdefault(sample.labels["action"], [0.0, 0.0, 0.0])[index] = float(
                    sample.value
                )
    return {tool: (v[0], v[1], v[2]) for tool, v in found.items()}
