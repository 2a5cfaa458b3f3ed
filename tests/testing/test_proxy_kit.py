"""The kit's ``check_requests`` through the idempotency proxy, in front of a real upstream
process (tests/apps/upstream.py on loopback) that records every call it acts on.

The kit's faults strike the proxy's forwarding step: before it (a death after the claim), after
the upstream answered (a death before the answer is stored, a failure after the call). The
invariant asks the upstream itself: no forwarded key acted on twice. A proxy that reconciles
by asking the upstream passes; one that is told the upstream deduplicates, when it does not,
is caught forwarding an interrupted attempt again, and the steps are shrunk to show it.
"""

from __future__ import annotations

import collections
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from receiver import Connection, IdempotencyProxy, SQLiteStore, State, Store
from receiver._ops.sweeper import KeySweeper
from receiver.testing import Client, FakeClock, Fault, TestStores, check_requests
from tests.acceptance.test_idempotency_proxy import Process
from tests.apps.upstream import reconcile
from tests.pgcluster import free_port

CALLS = [
    ("POST", "/payments", {"order": "1", "amount": 1200}),
    ("POST", "/payments", {"order": "2", "amount": 99}),
]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = Path(tmp_path_factory.mktemp("upstream")) / "upstream.log"
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "tests.apps.upstream:app",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    up = Process(argv, port, log, {})
    try:
        up.wait_ready()
        yield up.url
    finally:
        up.stop()


def acted_once(upstream: str) -> Any:
    async def invariant(conn: Connection) -> None:
        async with httpx.AsyncClient() as client:
            calls = (await client.get(f"{upstream}/calls")).json()
        twice = [k for k, n in collections.Counter(c["key"] for c in calls).items() if n > 1]
        assert not twice, f"the upstream acted twice on {len(twice)} key(s)"

    return invariant


def test_a_reconciling_proxy_passes(upstream: str, kit_stores: TestStores) -> None:
    def build(store: Store, clock: FakeClock) -> IdempotencyProxy:
        httpx.delete(f"{upstream}/calls")  # each example starts with an upstream that saw nothing
        return IdempotencyProxy(upstream, store=store, reconcile=reconcile, lease=10, timeout=5)

    check_requests(
        build,
        CALLS,
        invariant=acted_once(upstream),
        stores=kit_stores,
        max_examples=10 if kit_stores.kind == "sqlite" else 6,
    )


def test_forwarding_an_interrupted_attempt_again_is_caught(tmp_path: Path, upstream: str) -> None:
    def build(store: Store, clock: FakeClock) -> IdempotencyProxy:
        httpx.delete(f"{upstream}/calls")
        # Wrong: this upstream does not deduplicate by the forwarded key.
        return IdempotencyProxy(
            upstream, store=store, upstream_deduplicates=True, lease=10, timeout=5
        )

    with pytest.raises(AssertionError) as caught:
        check_requests(
            build,
            CALLS[:1],
            invariant=acted_once(upstream),
            stores=TestStores(tmp_path),
            max_examples=60,
        )
    message = str(caught.value)
    assert "acted twice" in message, message
    shown = re.search(r"steps: (\[.*\])", message)
    assert shown is not None, message
    assert "send(r0" in shown.group(1), message


async def test_the_sweeper_marks_an_unreconciled_attempt_for_review(
    upstream: str, tmp_path: Path
) -> None:
    """A proxy that died after the upstream acted, and nobody retries: a sweep of the store
    alone (``receiver sweep --store``) leaves it in flight, since only the proxy may judge it;
    the proxy's own sweeper, with no reconcile, stores it as needing review; the retry gets
    that answer, and the upstream acted once."""
    clock = FakeClock()
    async with SQLiteStore(tmp_path / "proxy.db", clock=clock) as store:
        proxy = IdempotencyProxy(upstream, store=store, lease=10, timeout=5, sweep_interval=None)
        async with Client(proxy) as client:
            request = client.request("/payments", {"order": "9", "amount": 5})
            died = await client.send(request, fault=Fault.AFTER_EXTERNAL_CALL)
            assert died.outcome == "died"
            clock.advance(11)
            assert (await KeySweeper(store, {}, None).run_once()).skipped == 1
            principal = client.faults.principals[str(request.key)]
            state = await proxy.inspect(principal, str(request.key))
            assert state is not None
            assert state.state is State.IN_FLIGHT
            assert (await proxy.sweep()).failed == 1
            state = await proxy.inspect(principal, str(request.key))
            assert state is not None
            assert state.needs_review
            retry = await client.send(request)
            assert retry.status == 409
            assert b"needs_review" in retry.body
        await proxy.aclose()
    async with httpx.AsyncClient() as http:
        calls = (await http.get(f"{upstream}/calls")).json()
    assert [c["body"] for c in calls].count('{"order":"9","amount":5}') == 1
