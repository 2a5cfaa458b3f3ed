"""Prometheus metrics of one Receiver: what happened to each delivery, and the evidence of a
double execution or a drifting key the day it starts (docs/reference/metrics.md).

Each Receiver owns a :class:`Metrics` with its own ``CollectorRegistry`` (unless given one), so
several receivers in one process, or one per test, never collide. Every series is labelled by
provider; every other label takes values from a short fixed list. A webhook-id, an event type or
anything from a payload is never a label: those are unbounded and chosen by the sender.

The gauges that describe the ledger (receipts per state, age of the oldest in-flight receipt)
are read from the store: the oldest in-flight age on every scrape (it reads only in-flight rows,
through the partial index), the per-state counts at most every ``count_interval`` seconds and
after every sweeper pass, at a cost that does not grow with the table (receiver/_ops/counts.py:
exact for the small states, an estimate of the completed ones on a large PostgreSQL table).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._logging import get_logger
from .._store.base import Store
from .counts import EXACT_BELOW, count_receipts

logger = get_logger("receiver.metrics")

# Outcome values (receiver._webhooks.pipeline.Outcome), repeated here so that every series of a
# provider
# exists from the start at 0: an alert on increase() then sees the very first increment.
OUTCOMES = (
    "executed",
    "replayed",
    "ignored",
    "in_flight_conflict",
    "payload_mismatch",
    "rejected",
    "invalid_payload",
    "handler_failed",
    "lease_lost",
    "reconciled",
    "needs_review",
    "store_unavailable",
    "queued",
    "shed",
    "handed_off",
    "handler_rejected",
)

#: The ``reason`` label of shed deliveries (receiver/_webhooks/admission.py): past the bound on
#: deliveries in progress, or past the sender's time limit.
SHED_REASONS = ("overloaded", "past_budget")

#: The ``outcome`` label of queued attempts run by workers (receiver._webhooks.pipeline.Outcome
#: values).
QUEUE_OUTCOMES = (
    "executed",
    "ignored",
    "invalid_payload",
    "handler_failed",
    "dead_letter",
    "handler_rejected",
    "lease_lost",
    "reconciled",
    "needs_review",
)

#: The ``reason`` label of rejected deliveries: the failed check, from this list or "other".
REASONS = (
    "signature",
    "timestamp",
    "webhook_id",
    "event_type",
    "event_id",
    "missing_header",
    "duplicate_header",
    "body_too_large",
    "content_length",
    "client_disconnected",
    "other",
)

#: The ``evidence`` label of double executions.
EVIDENCE = (
    # An attempt ran its handlers to the end, and its fenced completion found the key already
    # completed by another attempt: the handlers ran twice for one key. Their writes through
    # ``tx`` rolled back (the fence held), anything else they did happened twice.
    "fenced",
    # The same, and the attempt had handlers with external effects, which cannot roll back.
    "external",
    # The application's own check said so (Receiver.report_double_execution).
    "reported",
)

#: The ``kind`` label of deliveries answered 503 because the store failed
#: (receiver._exceptions.StoreUnavailable and its subclasses).
STORE_ERRORS = ("unavailable", "read_only", "misconfigured")

#: The ``result`` label of stale leases handled by the sweeper.
SWEEP_RESULTS = ("recovered", "failed", "released", "skipped")

STATES = ("in_flight", "completed", "failed", "released")

# Seconds. Handlers are usually milliseconds; leases are a minute by default.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def reason_of(check: str | None) -> str:
    """The bounded ``reason`` label of a failed check (``missing_header:webhook-id`` ->
    ``missing_header``; a custom verifier's own names -> ``other``)."""
    if not check:
        return "other"
    head = check.split(":", 1)[0]
    return head if head in REASONS else "other"


class _LedgerGauges(Collector):
    """Gauges whose values are read from the store by :meth:`Metrics.refresh`."""

    def __init__(self) -> None:
        self.providers: list[str] = []
        self.counts: dict[tuple[str, str], int] | None = None
        self.oldest: dict[str, float] | None = None  # provider -> claimed_at of the oldest
        self.now: float = 0.0
        #: provider -> (due now, waiting for a retry, due_at of the oldest due), queued mode.
        self.queue: dict[str, tuple[int, int, float | None]] | None = None
        self.queue_now: float = 0.0

    def collect(self) -> Iterator[Metric]:
        yield from self._collect_queue()
        if self.counts is not None:
            receipts = GaugeMetricFamily(
                "receiver_receipts",
                "Receipts stored in the ledger, per state (read from the store; on a large "
                "PostgreSQL table the completed count is an estimate from its statistics).",
                labels=["provider", "state"],
            )
            counts = dict.fromkeys(((p, s) for p in self.providers for s in STATES), 0)
            counts.update(self.counts)
            for (provider, state), n in sorted(counts.items()):
                receipts.add_metric([provider, state], n)
            yield receipts
        if self.oldest is not None:
            age = GaugeMetricFamily(
                "receiver_oldest_in_flight_age_seconds",
                "Age of the oldest in-flight receipt (0 when none): a stuck lease shows here.",
                labels=["provider"],
            )
            ages = dict.fromkeys(self.providers, 0.0)
            ages.update({p: max(0.0, self.now - claimed) for p, claimed in self.oldest.items()})
            for provider, seconds in sorted(ages.items()):
                age.add_metric([provider], seconds)
            yield age

    def _collect_queue(self) -> Iterator[Metric]:
        if self.queue is None:
            return
        depth = GaugeMetricFamily(
            "receiver_queue_depth",
            "Queued receipts not yet processed: due now, or waiting for a retry (read from the "
            "store).",
            labels=["provider", "state"],
        )
        age = GaugeMetricFamily(
            "receiver_queue_oldest_due_age_seconds",
            "How long the oldest due queued receipt has waited for a worker (0 when none).",
            labels=["provider"],
        )
        for provider in sorted(set(self.providers) | set(self.queue)):
            due, waiting, oldest = self.queue.get(provider, (0, 0, None))
            depth.add_metric([provider, "due"], due)
            depth.add_metric([provider, "waiting"], waiting)
            age.add_metric([provider], 0.0 if oldest is None else max(0.0, self.queue_now - oldest))
        yield depth
        yield age


def _exposition(registry: CollectorRegistry, ledger: _LedgerGauges) -> CollectorRegistry:
    """What GET /metrics serves. Under ``receiver serve --workers N`` each worker is a process
    with its own counters, and a scrape reaches one of them: prometheus-client's multiprocess
    mode (PROMETHEUS_MULTIPROC_DIR, set by ``serve`` for its workers) keeps every worker's
    counters in files there, and the scrape sums them. The ledger's gauges are read from the
    shared store, the same from any worker, so they are served as they are."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return registry
    from prometheus_client import multiprocess

    combined = CollectorRegistry()
    multiprocess.MultiProcessCollector(combined)  # type: ignore[no-untyped-call]
    combined.register(ledger)
    return combined


class Metrics:
    """The Prometheus instruments of one Receiver (``rx.metrics``)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        count_interval: float = 60.0,
        refresh_timeout: float = 2.0,
        exact_count_below: int = EXACT_BELOW,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        #: Seconds between two counts of receipts per state on scrape (0: every scrape).
        self.count_interval = count_interval
        self.refresh_timeout = refresh_timeout
        #: Receipts are counted exactly below this many; above, completed ones are estimated
        #: (receiver/_ops/counts.py).
        self.exact_count_below = exact_count_below
        self._counted_at: float | None = None
        # Label sets are few (providers x outcomes x reasons, all from fixed lists).
        self._delivered: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}
        self._handler_seconds: dict[str, Histogram] = {}
        r = self.registry
        self.deliveries = Counter(
            "receiver_deliveries",
            "Deliveries answered, by outcome; rejected ones also by the failed check (reason), "
            "shed ones by why they were shed (overloaded, past_budget).",
            ["provider", "outcome", "reason"],
            registry=r,
        )
        self.double_executions = Counter(
            "receiver_double_executions",
            "Evidence that one key's handlers ran to the end twice. Must stay 0.",
            ["provider", "evidence"],
            registry=r,
        )
        self.key_mismatches = Counter(
            "receiver_key_mismatches",
            "Deliveries refused because their webhook-id was received with another payload.",
            ["provider"],
            registry=r,
        )
        self.key_drift = Counter(
            "receiver_key_drift",
            "Fresh deliveries whose payload was already received under another webhook-id "
            "within the dedup window (a sender that changes ids on retry defeats dedup).",
            ["provider"],
            registry=r,
        )
        self.store_errors = Counter(
            "receiver_store_errors",
            "Deliveries answered 503 because the store failed, by kind: unavailable, read_only "
            "(a standby), misconfigured (missing database, role, tables or privileges).",
            ["provider", "kind"],
            registry=r,
        )
        self.needs_review_receipts = Counter(
            "receiver_needs_review",
            "Receipts marked failed for a person to review (an interrupted external handler "
            "without reconcile, on redelivery or by the sweeper; a provider no longer "
            "configured).",
            ["provider"],
            registry=r,
        )
        self.stale_leases = Counter(
            "receiver_stale_leases",
            "Stale in-flight receipts handled by the sweeper, by result.",
            ["provider", "result"],
            registry=r,
        )
        self.replays = Counter(
            "receiver_replays",
            "Dead-letter replays (receiver replay), by outcome.",
            ["provider", "outcome"],
            registry=r,
        )
        self.handler_seconds = Histogram(
            "receiver_handler_duration_seconds",
            "Time the handlers of one attempt took (returned or raised).",
            ["provider"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.delivery_seconds = Histogram(
            "receiver_delivery_duration_seconds",
            "Time from a delivery's arrival to its answer, by outcome.",
            ["provider", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_attempts = Counter(
            "receiver_queue_attempts",
            "Attempts of queued receipts run by workers, by outcome.",
            ["provider", "outcome"],
            registry=r,
        )
        self.dead_letters = Counter(
            "receiver_queue_dead_letters",
            "Queued receipts failed after their last attempt (dead letters).",
            ["provider"],
            registry=r,
        )
        self.queue_lag_seconds = Histogram(
            "receiver_queue_lag_seconds",
            "Worker lag: from a queued receipt's due time to a worker taking it.",
            ["provider"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._ledger = _LedgerGauges()
        r.register(self._ledger)
        self._exposition = _exposition(self.registry, self._ledger)

    def add_provider(self, provider: str) -> None:
        """Create the provider's series at 0, so that the first event is an increase."""
        for outcome in OUTCOMES:
            if outcome not in ("rejected", "shed"):
                self.deliveries.labels(provider, outcome, "")
        for reason in REASONS:
            self.deliveries.labels(provider, "rejected", reason)
        for reason in SHED_REASONS:
            self.deliveries.labels(provider, "shed", reason)
        for evidence in EVIDENCE:
            self.double_executions.labels(provider, evidence)
        for result in SWEEP_RESULTS:
            self.stale_leases.labels(provider, result)
        for kind in STORE_ERRORS:
            self.store_errors.labels(provider, kind)
        self.needs_review_receipts.labels(provider)
        self.key_mismatches.labels(provider)
        self.key_drift.labels(provider)
        for outcome in QUEUE_OUTCOMES:
            self.queue_attempts.labels(provider, outcome)
        self.dead_letters.labels(provider)
        self.queue_lag_seconds.labels(provider)
        self.handler_seconds.labels(provider)
        self._ledger.providers.append(provider)

    # -- events --------------------------------------------------------------------------------

    def delivered(self, provider: str, outcome: str, check: str | None, seconds: float) -> None:
        if outcome == "rejected":
            reason = reason_of(check)
        elif outcome == "shed":
            reason = check if check in SHED_REASONS else "overloaded"
        else:
            reason = ""
        # The labelled children, looked up once per label set: prometheus_client's labels()
        # validates and locks on every call, a measurable share of a delivery's own time.
        labels = (provider, outcome, reason)
        children = self._delivered.get(labels)
        if children is None:
            children = (
                self.deliveries.labels(provider, outcome, reason),
                self.delivery_seconds.labels(provider, outcome),
            )
            self._delivered[labels] = children
        children[0].inc()
        children[1].observe(seconds)
        if outcome == "payload_mismatch":
            self.key_mismatches.labels(provider).inc()
        elif outcome == "store_unavailable":
            kind = check if check in STORE_ERRORS else "unavailable"
            self.store_errors.labels(provider, kind).inc()

    def double_execution(self, provider: str, evidence: str) -> None:
        self.double_executions.labels(provider, evidence).inc()

    def needs_review(self, provider: str) -> None:
        self.needs_review_receipts.labels(provider).inc()

    def swept(self, provider: str, result: str) -> None:
        self.stale_leases.labels(provider, result).inc()

    def drifted(self, provider: str, webhook_id: str) -> None:
        """A fresh delivery's payload is already in the ledger under another webhook-id."""
        self.key_drift.labels(provider).inc()
        logger.warning(
            "ALERT: key drift: this payload was already received under another webhook-id",
            extra={"provider": provider, "webhook_id": webhook_id},
        )

    def queue_attempt(self, provider: str, outcome: str) -> None:
        self.queue_attempts.labels(provider, outcome).inc()
        if outcome == "dead_letter":
            self.dead_letters.labels(provider).inc()

    def queue_lag(self, provider: str, seconds: float) -> None:
        self.queue_lag_seconds.labels(provider).observe(seconds)

    def replayed(self, provider: str, outcome: str) -> None:
        self.replays.labels(provider, outcome).inc()

    def handler_time(self, provider: str, seconds: float) -> None:
        child = self._handler_seconds.get(provider)
        if child is None:
            child = self._handler_seconds[provider] = self.handler_seconds.labels(provider)
        child.observe(seconds)

    # -- the ledger's gauges -------------------------------------------------------------------

    async def refresh(self, store: Store, now: float, *, counts: bool | None = None) -> None:
        """Read the ledger's gauges from the store (bounded by ``refresh_timeout``). On failure
        the previous values stay, and the failure is logged."""
        if counts is None:
            counts = self._counted_at is None or now - self._counted_at >= self.count_interval
        try:
            await asyncio.wait_for(self._read(store, now, counts), self.refresh_timeout)
        except Exception as exc:  # a scrape must answer even when the store does not
            logger.warning("metrics: could not read the ledger's gauges (%s)", type(exc).__name__)

    async def _read(self, store: Store, now: float, counts: bool) -> None:
        async with store.acquire() as conn:
            rows = await conn.run_all("oldest_in_flight_by_provider")
            oldest = {r["provider"]: float(r["claimed_at"]) for r in rows}
            rows = await conn.run_all("queue_depth", store.now())
            self._ledger.queue = {
                r["provider"]: (
                    int(r["due"] or 0),
                    int(r["waiting"] or 0),
                    None if r["oldest_due"] is None else float(r["oldest_due"]),
                )
                for r in rows
            }
            if rows:
                self._ledger.queue_now = float(rows[0]["now"])
            if counts:
                self._ledger.counts = await count_receipts(conn, self.exact_count_below)
                self._counted_at = now
        self._ledger.oldest, self._ledger.now = oldest, now

    async def render(self, store: Store, now: float) -> bytes:
        """The exposition text, after refreshing the ledger's gauges."""
        await self.refresh(store, now)
        return generate_latest(self._exposition)
