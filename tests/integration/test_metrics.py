"""Metrics: each one moves exactly when its event happens, read the way Prometheus reads them
(GET /metrics, parsed by prometheus_client's parser). On both stores.

The double-execution counter is provoked twice: through a deliberately broken store (a claim
statement that lets a duplicate through, the kind of bug the unique constraint exists to rule
out) and through a handler that outlives its lease; it stays 0 under duplicates, the race and the
state machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from receiver import (
    ConfigurationError,
    Connection,
    Event,
    PostgresStore,
    Provider,
    Receiver,
    Store,
)
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key
from receiver._ops.metrics import OUTCOMES, QUEUE_OUTCOMES, reason_of
from receiver._store.queries import queries
from receiver._verification.payload import parse
from receiver._webhooks.outcomes import Outcome
from receiver.testing import examples
from tests.integration import test_state_machine as t5
from tests.support import (
    EFFECTS_DDL,
    PROVIDER,
    SECRET,
    Clock,
    body_of,
    effects,
    ledger_clock,
    make_receiver,
    signed,
)

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "examples" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "examples" / "prometheus" / "alerts.test.yml"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# -- reading /metrics ---------------------------------------------------------------------------


async def scrape(client: httpx.AsyncClient) -> Samples:
    answer = await client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def counted(before: Samples, after: Samples) -> dict[str, float]:
    """The counters that moved, as ``name{label=value,...}`` -> increase."""
    moved = {}
    for key, now in after.items():
        name, labels = key
        if name.endswith("_total") and now != before.get(key, 0.0):
            shown = ",".join(f"{k}={v}" for k, v in sorted(labels) if k != "provider")
            moved[f"{name}{{{shown}}}"] = now - before.get(key, 0.0)
    return moved


@contextlib.asynccontextmanager
async def client_of(rx: Receiver) -> AsyncIterator[httpx.AsyncClient]:
    await rx.open()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=rx), base_url="http://test"
        ) as client:
            yield client
    finally:
        await rx.close()


async def post(
    client: httpx.AsyncClient,
    webhook_id: str,
    body: bytes,
    clock: Clock,
    **headers: str,
) -> httpx.Response:
    sent = {**signed(webhook_id, body, timestamp=clock.now), **headers}
    return await client.post(f"/{PROVIDER}", content=body, headers=sent)


async def dead_claim(store: Store, webhook_id: str, body: bytes, now: float) -> None:
    """Another worker claimed the key and died holding it."""
    parsed = parse(body, None)
    claim = Claim(
        Key(PROVIDER, webhook_id), parsed.payload_hash, parsed.event_type, body, now, 60.0, 3600
    )
    async with store.acquire() as conn:
        claimed = await ledger.claim(conn, claim)
        assert isinstance(claimed, ledger.Claimed)
        assert claimed.fence == 1


# -- deliveries, by outcome ---------------------------------------------------------------------


async def test_each_outcome_moves_its_own_counter(store: Store) -> None:
    clock = Clock()
    rx, _ = make_receiver(store, clock=clock, max_body_size=2000)
    body = body_of(order="o-1")
    expectations: list[tuple[str, Any, dict[str, float]]] = [
        ("first delivery", ("msg_1", body), {"outcome=executed,reason=": 1}),
        ("duplicate", ("msg_1", body), {"outcome=replayed,reason=": 1}),
        (
            "same id, other payload",
            ("msg_1", body_of(order="o-2")),
            {"outcome=payload_mismatch,reason=": 1, "key_mismatches": 1},
        ),
        ("no handler", ("msg_2", body_of("customer.deleted")), {"outcome=ignored,reason=": 1}),
        ("not JSON", ("msg_3", b"not json"), {"outcome=invalid_payload,reason=": 1}),
        ("handler raises", ("msg_4", body_of(mode="raise")), {"outcome=handler_failed,reason=": 1}),
    ]
    async with client_of(rx) as client:
        for what, (webhook_id, sent), expected in expectations:
            before = await scrape(client)
            await post(client, webhook_id, sent, clock)
            moved = counted(before, await scrape(client))
            assert moved == {
                (
                    f"receiver_deliveries_total{{{k}}}"
                    if k.startswith("outcome")
                    else f"receiver_{k}_total{{}}"
                ): v
                for k, v in expected.items()
            }, what

        # Rejections, by the check that failed.
        before = await scrape(client)
        forged = signed("msg_5", body, timestamp=clock.now, secret="whsec_" + "A" * 32)
        await client.post(f"/{PROVIDER}", content=body, headers=forged)
        await post(client, "msg_6", body, Clock(clock.now - 3600))  # too old
        await client.post(f"/{PROVIDER}", content=body, headers={"webhook-id": "msg_7"})
        await post(client, "msg_8", body_of(pad="x" * 3000), clock)  # over max_body_size
        moved = counted(before, await scrape(client))
        assert moved == {
            "receiver_deliveries_total{outcome=rejected,reason=signature}": 1,
            "receiver_deliveries_total{outcome=rejected,reason=timestamp}": 1,
            "receiver_deliveries_total{outcome=rejected,reason=missing_header}": 1,
            "receiver_deliveries_total{outcome=rejected,reason=body_too_large}": 1,
        }

        # In flight: another worker holds a live claim.
        await dead_claim(store, "msg_9", body, clock.now)
        before = await scrape(client)
        assert (await post(client, "msg_9", body, clock)).status_code == 409
        assert counted(before, await scrape(client)) == {
            "receiver_deliveries_total{outcome=in_flight_conflict,reason=}": 1
        }
        after = await scrape(client)
    assert (
        value(after, "receiver_double_executions_total", provider=PROVIDER, evidence="fenced") == 0
    )


def test_the_outcome_label_values_are_the_pipelines() -> None:
    # dead_letter ends a worker's attempt, never a delivery: it labels the queue's series only
    # (handler_rejected ends both: a handed-off delivery's and a worker's attempt).
    assert set(OUTCOMES) == {o.value for o in Outcome} - {"dead_letter"}
    assert set(QUEUE_OUTCOMES) <= {o.value for o in Outcome}
    assert reason_of("missing_header:webhook-id") == "missing_header"
    assert reason_of("a custom verifier's own check") == "other"
    assert reason_of(None) == "other"


async def test_every_series_exists_from_the_start(store: Store) -> None:
    rx, _ = make_receiver(store)
    async with client_of(rx) as client:
        samples = await scrape(client)
    for evidence in ("fenced", "external", "reported"):
        key = (
            "receiver_double_executions_total",
            frozenset({("provider", PROVIDER), ("evidence", evidence)}),
        )
        assert samples[key] == 0
    assert value(samples, "receiver_key_mismatches_total", provider=PROVIDER) == 0
    assert value(samples, "receiver_key_drift_total", provider=PROVIDER) == 0
    assert ("receiver_key_drift_total", frozenset({("provider", PROVIDER)})) in samples
    labels = [dict(k[1]) for k in samples if k[0] == "receiver_deliveries_total"]
    assert all(set(d) == {"provider", "outcome", "reason"} for d in labels)
    # Bounded cardinality: no label carries a webhook-id or anything from a payload.
    assert not any("msg_" in v for k in samples for _, v in k[1])


async def test_store_unavailable_is_counted(tmp_path: Path) -> None:
    from receiver import SQLiteStore

    clock = Clock()
    rx, _ = make_receiver(SQLiteStore(tmp_path / "missing" / "r.db"), clock=clock)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=rx), base_url="http://test"
    ) as client:
        assert (await post(client, "msg_1", body_of(), clock)).status_code == 503
        samples = await scrape(client)  # the ledger's gauges cannot be read: still 200
    assert (
        value(
            samples,
            "receiver_deliveries_total",
            provider=PROVIDER,
            outcome="store_unavailable",
            reason="",
        )
        == 1
    )


# -- latency ------------------------------------------------------------------------------------


async def test_latency_histograms(store: Store) -> None:
    clock = Clock()
    rx, _ = make_receiver(store, clock=clock)
    async with client_of(rx) as client:
        await post(client, "msg_1", body_of(), clock)
        await post(client, "msg_1", body_of(), clock)  # a replay: no handler runs
        samples = await scrape(client)
    assert value(samples, "receiver_handler_duration_seconds_count", provider=PROVIDER) == 1
    handler_seconds = value(samples, "receiver_handler_duration_seconds_sum", provider=PROVIDER)
    assert 0 < handler_seconds < 5
    for outcome in ("executed", "replayed"):
        count = value(
            samples, "receiver_delivery_duration_seconds_count", provider=PROVIDER, outcome=outcome
        )
        assert count == 1, outcome
    executed = value(
        samples, "receiver_delivery_duration_seconds_sum", provider=PROVIDER, outcome="executed"
    )
    assert executed >= handler_seconds


# -- key drift ----------------------------------------------------------------------------------


async def test_key_drift_counts_a_payload_seen_under_another_id(store: Store) -> None:
    clock = Clock()
    rx, _ = make_receiver(store, clock=clock)
    body = body_of(order="o-1", amount=5)
    async with client_of(rx) as client:
        await post(client, "msg_1", body, clock)
        before = await scrape(client)
        await post(client, "msg_1", body, clock)  # a true redelivery: replayed, no drift
        await post(client, "msg_2", body_of(order="o-2"), clock)  # another event
        assert counted(before, await scrape(client)) == {
            "receiver_deliveries_total{outcome=executed,reason=}": 1,
            "receiver_deliveries_total{outcome=replayed,reason=}": 1,
        }
        # The sender retries msg_1 under a new id (re-serialized, too): dedup cannot see it,
        # the drift counter does.
        before = await scrape(client)
        redone = b'{"data": {"amount": 5, "order": "o-1"}, "type": "order.created"}'
        assert (await post(client, "msg_1_retry", redone, clock)).status_code == 200
        assert counted(before, await scrape(client)) == {
            "receiver_deliveries_total{outcome=executed,reason=}": 1,
            "receiver_key_drift_total{}": 1,
        }
        # Past the first receipt's window the payload is fair game again.
        clock.advance(rx.providers[PROVIDER].window.window + 1)
        before = await scrape(client)
        await post(client, "msg_1_much_later", body, clock)
        assert "receiver_key_drift_total{}" not in counted(before, await scrape(client))
    # Without HTTP too (rx.deliver runs the check before returning).
    await rx.open()
    try:
        await rx.deliver(PROVIDER, signed("msg_1_again", body, timestamp=clock.now), body)
        assert rx.metrics is not None
        assert (
            rx.metrics.registry.get_sample_value("receiver_key_drift_total", {"provider": PROVIDER})
            == 2
        )
    finally:
        await rx.close()


# -- the sweeper, the oldest in-flight receipt, receipts per state ------------------------------


async def test_stale_leases_and_the_oldest_in_flight_age(store: Store) -> None:
    clock = Clock()
    rx, _ = make_receiver(store, clock=clock, lease=60)
    calls: list[str] = []

    @rx.on("payment.created", effects="external")
    async def pay(event: Event, tx: Connection) -> None:
        calls.append(event.id)

    async with client_of(rx) as client:
        samples = await scrape(client)
        assert value(samples, "receiver_oldest_in_flight_age_seconds", provider=PROVIDER) == 0
        await dead_claim(store, "msg_1", body_of(order="o-1"), clock.now)
        clock.advance(30)
        samples = await scrape(client)
        assert value(samples, "receiver_oldest_in_flight_age_seconds", provider=PROVIDER) == 30
        await dead_claim(store, "msg_2", body_of("payment.created"), clock.now)
        clock.advance(61)
        samples = await scrape(client)
        assert value(samples, "receiver_oldest_in_flight_age_seconds", provider=PROVIDER) == 91

        before = samples
        report = await rx.sweep()
        after = await scrape(client)
    assert (report.recovered, report.failed) == (1, 1)
    assert calls == []  # the external one was not re-run blindly: failed, needs review
    assert counted(before, after) == {
        "receiver_stale_leases_total{result=recovered}": 1,
        "receiver_stale_leases_total{result=failed}": 1,
        "receiver_needs_review_total{}": 1,  # what the ReceiverNeedsReview alert reads
    }
    assert value(after, "receiver_oldest_in_flight_age_seconds", provider=PROVIDER) == 0
    assert value(after, "receiver_receipts", provider=PROVIDER, state="completed") == 1
    assert value(after, "receiver_receipts", provider=PROVIDER, state="failed") == 1
    assert value(after, "receiver_receipts", provider=PROVIDER, state="in_flight") == 0


async def test_receipts_per_state_on_scrape(store: Store) -> None:
    clock = Clock()
    rx, _ = make_receiver(store, clock=clock)
    assert rx.metrics is not None
    async with client_of(rx) as client:
        samples = await scrape(client)
        assert value(samples, "receiver_receipts", provider=PROVIDER, state="completed") == 0
        await post(client, "msg_1", body_of(), clock)
        await post(client, "msg_2", body_of(), clock)
        await post(client, "msg_3", body_of(mode="raise"), clock)
        samples = await scrape(client)  # counted at most every count_interval (60 s)
        assert value(samples, "receiver_receipts", provider=PROVIDER, state="completed") == 0
        clock.advance(rx.metrics.count_interval)
        samples = await scrape(client)
    assert value(samples, "receiver_receipts", provider=PROVIDER, state="completed") == 2
    assert value(samples, "receiver_receipts", provider=PROVIDER, state="released") == 1


# -- double executions --------------------------------------------------------------------------


class _BrokenConnection(Connection):
    """A real connection whose ``claim`` statement is deliberately broken: an upsert that hands
    the caller the existing fence instead of refusing it (the arbiter lets a duplicate in)."""

    def __init__(self, inner: Connection) -> None:
        super().__init__()
        self.inner = inner
        self.dialect = inner.dialect  # type: ignore[misc]

    def _raw(self) -> Any:
        return self.inner._raw()

    async def _execute(self, query: str, *args: Any) -> None:
        await self.inner._execute(query, *args)

    async def _fetch(self, query: str, *args: Any) -> list[Any]:
        return await self.inner._fetch(query, *args)

    def _transaction(self) -> Any:
        return self.inner._transaction()

    async def run(self, name: str, *args: Any) -> Any:
        if name == "claim":
            broken = re.sub(
                r"ON CONFLICT (\(provider, webhook_id\) )?DO NOTHING",
                "ON CONFLICT (provider, webhook_id) DO UPDATE SET fence = receiver_receipts.fence",
                queries(self.dialect)["claim"],
            )
            rows = await self.inner._fetch(broken, *args)
            return rows[0] if rows else None
        return await self.inner.run(name, *args)


class BrokenArbiter(Store):
    """The test-only store hook: a real store behind a broken claim."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.dialect = inner.dialect  # type: ignore[misc]

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        pass  # the fixture owns the real store

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Connection]:
        async with self.inner.acquire() as conn:
            yield _BrokenConnection(conn)

    async def migrate(self) -> None:
        await self.inner.migrate()

    @property
    def url(self) -> str:
        return self.inner.url


def double_executions(samples: Samples) -> dict[str, float]:
    return {
        evidence: value(
            samples, "receiver_double_executions_total", provider=PROVIDER, evidence=evidence
        )
        for evidence in ("fenced", "external", "reported")
    }


@pytest.mark.single_layout(
    "breaks the single table's arbiter (the claim's ON CONFLICT); the partitioned layout's "
    "is its key table's trigger"
)
@pytest.mark.parametrize("effects_kind", ["transactional", "external"])
async def test_a_broken_arbiter_is_caught_as_a_double_execution(
    store: Store, effects_kind: str
) -> None:
    clock = Clock()
    # No replay cache: it trusts the ledger, and this ledger is broken on purpose.
    rx = Receiver(
        ledger_clock(BrokenArbiter(store), clock),
        [Provider(PROVIDER, [SECRET])],
        clock=clock,
        replay_cache=0,
    )
    outside: list[int] = []  # the external world

    @rx.on_startup
    async def tables(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.created", effects=effects_kind)  # type: ignore[arg-type]
    async def created(event: Event, tx: Connection) -> dict[str, int]:
        outside.append(event.fence)
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )
        return {"fence": event.fence}

    body = body_of()
    async with client_of(rx) as client:
        first = await post(client, "msg_1", body, clock)
        assert double_executions(await scrape(client)) == {
            "fenced": 0,
            "external": 0,
            "reported": 0,
        }
        # The redelivery of a completed key gets through the broken claim: the handler runs
        # a second time. Its fenced completion finds the key completed and rolls back.
        second = await post(client, "msg_1", body, clock)
        samples = await scrape(client)
    assert first.status_code == 200
    assert second.status_code == 409
    assert outside == [1, 1]  # ran twice
    assert await effects(store) == 1  # the writes through tx committed once
    evidence = "external" if effects_kind == "external" else "fenced"
    assert double_executions(samples) == {
        "fenced": 0,
        "external": 0,
        "reported": 0,
        evidence: 1,
    }
    assert (
        value(
            samples, "receiver_deliveries_total", provider=PROVIDER, outcome="lease_lost", reason=""
        )
        == 1
    )


async def test_a_handler_that_outlives_its_lease_is_a_double_execution(
    pg_store: PostgresStore,
) -> None:
    """No broken part: a slow handler loses its lease, a redelivery runs the handlers again and
    completes; the slow one finishes second, finds the key completed, and is counted."""
    clock = Clock()
    rx = Receiver(
        ledger_clock(pg_store, clock), [Provider(PROVIDER, [SECRET], lease=10)], clock=clock
    )
    entered, release = asyncio.Event(), asyncio.Event()

    @rx.on("order.created")
    async def slow(event: Event, tx: Connection) -> dict[str, int]:
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )
        if event.fence == 1:
            entered.set()
            await release.wait()
        return {"fence": event.fence}

    body = body_of()
    async with client_of(rx) as client:
        late = asyncio.create_task(post(client, "msg_1", body, clock))
        await entered.wait()
        clock.advance(11)
        assert (await post(client, "msg_1", body, clock)).json() == {"fence": 2}
        release.set()
        assert (await late).status_code == 409
        samples = await scrape(client)
    assert await effects(pg_store) == 1
    assert double_executions(samples)["fenced"] == 1


async def test_a_business_check_can_report_a_double_execution(store: Store) -> None:
    """A receipt lost before the sender stopped retrying (deleted by hand, restored from an
    older backup): the ledger cannot know, the handler's own data can."""
    clock = Clock()
    # No replay cache: the test deletes a receipt by hand behind its back.
    rx = Receiver(
        ledger_clock(store, clock), [Provider(PROVIDER, [SECRET])], clock=clock, replay_cache=0
    )

    @rx.on_startup
    async def tables(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> None:
        seen = await tx.fetchval("SELECT count(*) FROM effects WHERE webhook_id = $1", event.id)
        if seen:
            rx.report_double_execution(event, "an effects row for this webhook-id exists")
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )

    body = body_of()
    async with client_of(rx) as client:
        await post(client, "msg_1", body, clock)
        async with store.acquire() as conn:  # the receipt is lost
            await conn.execute("DELETE FROM receiver_receipts")
        await post(client, "msg_1", body, clock)
        samples = await scrape(client)
    assert double_executions(samples) == {"fenced": 0, "external": 0, "reported": 1}


async def test_no_double_execution_under_duplicates_and_the_race(store: Store) -> None:
    """T1 and T2 with the counter watched: 100 concurrent copies, then duplicates."""
    rx, recorder = make_receiver(store)
    body = body_of(order="o-race")
    headers = signed("msg_race", body)
    async with client_of(rx) as client:
        barrier = asyncio.Barrier(100)

        async def one() -> httpx.Response:
            await barrier.wait()
            return await client.post(f"/{PROVIDER}", content=body, headers=headers)

        answers = await asyncio.gather(*(one() for _ in range(100)))
        for _ in range(3):
            await client.post(f"/{PROVIDER}", content=body, headers=headers)
        samples = await scrape(client)
    assert recorder.calls["msg_race"] == 1
    assert sum(a.status_code == 200 for a in answers) >= 1
    assert double_executions(samples) == {"fenced": 0, "external": 0, "reported": 0}
    executed = value(
        samples, "receiver_deliveries_total", provider=PROVIDER, outcome="executed", reason=""
    )
    assert executed == 1


class _WatchedMachine(t5.LedgerMachine):
    """T5 with one more invariant: the double-execution counter stays at 0."""

    @invariant()
    def no_double_execution(self) -> None:
        assert self.rx.metrics is not None
        for evidence in ("fenced", "external", "reported"):
            seen = self.rx.metrics.registry.get_sample_value(
                "receiver_double_executions_total", {"provider": PROVIDER, "evidence": evidence}
            )
            assert seen == 0, evidence


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_no_double_execution_in_the_state_machine(kind: str, pg_url: str) -> None:
    machine = type(f"Watched_{kind}", (_WatchedMachine,), {"kind": kind, "pg_url": pg_url})
    machine.TestCase.settings = settings(
        max_examples=examples(12),
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    machine.TestCase().runTest()


# -- configuration ------------------------------------------------------------------------------


async def test_each_receiver_has_its_own_registry(store: Store) -> None:
    one, _ = make_receiver(store)
    two, _ = make_receiver(store)  # same provider, same metric names: no collision
    assert one.metrics is not None
    assert two.metrics is not None
    assert one.metrics.registry is not two.metrics.registry
    shared = CollectorRegistry()
    three, _ = make_receiver(store, registry=shared)
    assert three.metrics is not None
    assert three.metrics.registry is shared


async def test_metrics_path_and_disabling(store: Store) -> None:
    clock = Clock()
    moved, _ = make_receiver(store, clock=clock, metrics_path="/internal/metrics")
    async with client_of(moved) as client:
        assert (await client.get("/internal/metrics")).status_code == 200
        assert (await client.get("/metrics")).status_code == 404  # no provider named metrics
    off, _ = make_receiver(store, clock=clock, metrics=False)
    assert off.metrics is None
    async with client_of(off) as client:
        assert (await client.get("/metrics")).status_code == 404
        assert (await post(client, "msg_1", body_of(), clock)).status_code == 200
    with pytest.raises(ConfigurationError, match="metrics_path"):
        make_receiver(store, metrics_path="metrics")


def test_providers_may_not_take_the_receivers_own_paths(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/r.db"
    for name in ("metrics", "healthz", "readyz"):
        with pytest.raises(ConfigurationError, match=f"GET /{name}"):
            Receiver(store, [Provider(name, [SECRET])])
    rx = Receiver(store, [Provider("metrics", [SECRET])], metrics_path="/internal/metrics")
    with pytest.raises(ConfigurationError, match="GET /healthz"):
        rx.add_provider(Provider("healthz", [SECRET]))
    Receiver(store, [Provider("healthz", [SECRET]), Provider("readyz", [SECRET])], health=False)
    Receiver(store, [Provider("metrics", [SECRET])], metrics=False)


# -- the alert rules ----------------------------------------------------------------------------


def exported_metric_names() -> set[str]:
    """Every sample name a Receiver exports (counters with _total, histograms with _bucket ...)."""
    rx = Receiver("sqlite:///unused.db", [Provider(PROVIDER, [SECRET])])
    assert rx.metrics is not None
    rx.metrics._ledger.counts, rx.metrics._ledger.oldest = {}, {}
    rx.metrics._ledger.queue = {}
    return {s.name for family in rx.metrics.registry.collect() for s in family.samples}


def rule_exprs() -> Iterator[tuple[str, str]]:
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]


def test_every_alert_reads_a_metric_the_receiver_exports() -> None:
    exported = exported_metric_names()
    alerts = dict(rule_exprs())
    assert {
        "ReceiverDoubleExecution",
        "ReceiverPayloadMismatch",
        "ReceiverStuckInFlight",
        "ReceiverKeyDrift",
        "ReceiverStoreUnavailable",
    } <= set(alerts)
    for alert, expr in alerts.items():
        names = set(re.findall(r"\breceiver_[a-z_]+", expr))
        assert names, alert
        assert names <= exported, (alert, names - exported)


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (Debian)"
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = subprocess.run(
        [promtool, "check", "config", str(RULES.parent / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert config.returncode == 0, config.stdout + config.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=RULE_TESTS.parent,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
