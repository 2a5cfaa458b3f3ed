"""T5: a hypothesis state machine delivers random sequences (duplicates, same id with another
payload, failing handlers, concurrent bursts, workers that die holding a claim or mid-handler,
lease expiries, receipt expiry) to a real Receiver on a real store, and checks I1-I4 after
every step against a small model.

Hypothesis rules are synchronous: the machine owns an event loop and drives the async receiver
through it.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from receiver import PostgresStore, SQLiteStore, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key
from receiver._verification.payload import parse
from receiver.testing import examples
from tests.conftest import truncate
from tests.support import PROVIDER, Clock, SimulatedCrash, body_of, make_receiver, signed

IDS = ["msg_a", "msg_b", "msg_c"]
LEASE = 60.0

# Payload variants: (body, what the handler does). "retry" answers 503: released, never stored.
VARIANTS: dict[str, tuple[bytes, str]] = {
    "ok1": (body_of(order="o-1"), "ok"),
    "ok2": (body_of(order="o-2"), "ok"),
    "final422": (body_of(mode="status", status=422), "final"),
    "retry503": (body_of(mode="status", status=503), "retry"),
}
FINAL_VARIANTS = ["ok1", "ok2", "final422"]


@dataclass
class Known:
    """The model's view of one webhook-id."""

    variant: str
    state: str  # completed | released | in_flight
    expires_at: float
    lease_until: float = 0.0
    answer: tuple[int, str, bytes] | None = None


def answer_of(response: httpx.Response) -> tuple[int, str, bytes]:
    return (response.status_code, response.headers["content-type"], response.content)


class LedgerMachine(RuleBasedStateMachine):
    kind = "sqlite"
    pg_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory()
        self.clock = Clock()
        store: Store
        if self.kind == "postgresql":
            self.run(truncate(self.pg_url))
            store = PostgresStore(self.pg_url, max_size=10)
        else:
            store = SQLiteStore(Path(self.tmp.name) / "receipts.db")
        self.store = store
        self.rx, self.recorder = make_receiver(store, clock=self.clock, lease=LEASE)
        self.window = self.rx.providers[PROVIDER].window.window
        self.run(self.rx.open())
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.rx), base_url="http://test"
        )
        self.known: dict[str, Known] = {}
        self.expected_effects: dict[str, int] = dict.fromkeys(IDS, 0)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.client.aclose())
        self.run(self.rx.close())
        self.loop.close()
        self.tmp.cleanup()

    async def _post(self, webhook_id: str, variant: str) -> httpx.Response:
        body = VARIANTS[variant][0]
        headers = signed(webhook_id, body, timestamp=self.clock.now)
        return await self.client.post(f"/{PROVIDER}", content=body, headers=headers)

    def _current(self, webhook_id: str) -> Known | None:
        known = self.known.get(webhook_id)
        if known is not None and known.expires_at <= self.clock.now:
            return None  # expired: the ledger forgets it
        return known

    def _expect(self, webhook_id: str, variant: str) -> str:
        """What the ledger must do with this delivery: run | replay | mismatch | in_flight."""
        known = self._current(webhook_id)
        if known is None:
            return "run"
        if known.variant != variant:
            return "mismatch"
        if known.state == "completed":
            return "replay"
        if known.state == "in_flight" and known.lease_until > self.clock.now:
            return "in_flight"
        return "run"

    def _ran(self, webhook_id: str, variant: str, response: httpx.Response, fail: bool) -> None:
        behaviour = VARIANTS[variant][1]
        expires = self.clock.now + self.window
        if fail or behaviour == "retry":
            assert response.status_code == 500, response.content
            assert "idempotent-replayed" not in response.headers
            self.known[webhook_id] = Known(variant, "released", expires)
            return
        assert response.status_code == (200 if behaviour == "ok" else 422), response.content
        assert "idempotent-replayed" not in response.headers
        self.expected_effects[webhook_id] += 1
        self.known[webhook_id] = Known(variant, "completed", expires, answer=answer_of(response))

    # -- rules -----------------------------------------------------------------------------------

    @rule(
        webhook_id=st.sampled_from(IDS),
        variant=st.sampled_from(list(VARIANTS)),
        fail=st.booleans(),
    )
    def deliver(self, webhook_id: str, variant: str, fail: bool) -> None:
        expected = self._expect(webhook_id, variant)
        if fail and expected == "run":
            self.recorder.fail_next(webhook_id)
        response = self.run(self._post(webhook_id, variant))
        if expected == "run":
            self._ran(webhook_id, variant, response, fail)
        elif expected == "replay":
            known = self.known[webhook_id]
            assert response.headers["idempotent-replayed"] == "true"
            assert answer_of(response) == known.answer  # I3: byte-identical
        elif expected == "mismatch":
            assert response.status_code == 422
            assert response.json()["error"] == "payload_mismatch"
        else:
            assert response.status_code == 409
            assert int(response.headers["retry-after"]) >= 1

    @rule(
        webhook_id=st.sampled_from(IDS),
        variant=st.sampled_from(FINAL_VARIANTS),
        copies=st.integers(min_value=2, max_value=8),
    )
    def burst(self, webhook_id: str, variant: str, copies: int) -> None:
        """Concurrent copies of one delivery: at most one runs."""
        expected = self._expect(webhook_id, variant)

        async def fire() -> list[httpx.Response]:
            return list(
                await asyncio.gather(*(self._post(webhook_id, variant) for _ in range(copies)))
            )

        answers = self.run(fire())
        fresh = [
            a
            for a in answers
            if a.status_code in (200, 422)
            and "idempotent-replayed" not in a.headers
            and a.headers["content-type"] == "application/json"
            and a.json().get("error") != "payload_mismatch"
        ]
        if expected == "run":
            assert len(fresh) == 1, [answer_of(a) for a in answers]
            self._ran(webhook_id, variant, fresh[0], fail=False)
            for other in answers:
                if other is not fresh[0]:
                    assert other.status_code == 409 or answer_of(other) == answer_of(fresh[0])
        else:
            assert fresh == [] or expected == "mismatch"
            for other in answers:
                if expected == "replay":
                    assert answer_of(other) == self.known[webhook_id].answer
                elif expected == "mismatch":
                    assert other.status_code == 422
                else:
                    assert other.status_code == 409

    @precondition(lambda self: any(self._current(i) is None for i in IDS))
    @rule(data=st.data(), variant=st.sampled_from(FINAL_VARIANTS))
    def worker_dies_holding_a_claim(self, data: st.DataObject, variant: str) -> None:
        """Another process claimed the key and died before completing or releasing it."""
        webhook_id = data.draw(st.sampled_from([i for i in IDS if self._current(i) is None]))
        body = VARIANTS[variant][0]
        parsed = parse(body, None)
        claim = Claim(
            Key(PROVIDER, webhook_id),
            parsed.payload_hash,
            parsed.event_type,
            body,
            self.clock.now,
            LEASE,
            self.window,
        )

        async def claim_and_die() -> None:
            async with self.store.acquire() as conn:
                got = await ledger.claim(conn, claim)
                if isinstance(got, ledger.Receipt):  # an expired row: take it over
                    assert await ledger.reclaim(conn, claim, got.fence) is not None

        self.run(claim_and_die())
        self.known[webhook_id] = Known(
            variant, "in_flight", self.clock.now + self.window, self.clock.now + LEASE
        )

    @rule(
        webhook_id=st.sampled_from(IDS),
        variant=st.sampled_from(FINAL_VARIANTS),
    )
    def worker_dies_mid_handler(self, webhook_id: str, variant: str) -> None:
        """The process dies after the handler's write, before commit."""
        if self._expect(webhook_id, variant) != "run":
            return
        self.recorder.crash_next(webhook_id)
        try:
            self.run(self._post(webhook_id, variant))
        except SimulatedCrash:
            pass
        else:
            raise AssertionError("the handler should have crashed")
        self.known[webhook_id] = Known(
            variant, "in_flight", self.clock.now + self.window, self.clock.now + LEASE
        )

    @rule(seconds=st.sampled_from([1.0, 30.0, 59.0, 61.0, 600.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: bool(self.known))
    @rule()
    def receipts_expire(self) -> None:
        self.clock.advance(self.window + 1)

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def effects_match_the_model(self) -> None:
        """I2: each committed execution wrote exactly one business row; nothing else did."""

        async def counts() -> dict[str, int]:
            async with self.store.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT webhook_id, count(*) AS n FROM effects GROUP BY webhook_id"
                )
            return {r["webhook_id"]: int(r["n"]) for r in rows}

        found = self.run(counts())
        assert {k: v for k, v in found.items() if v} == {
            k: v for k, v in self.expected_effects.items() if v
        }

    @invariant()
    def acknowledged_means_committed(self) -> None:
        """I4: every answer the sender got for a completed id is the committed receipt's."""

        async def receipts() -> dict[str, ledger.Receipt | None]:
            async with self.store.acquire() as conn:
                return {i: await ledger.lookup(conn, Key(PROVIDER, i)) for i in IDS}

        rows = self.run(receipts())
        for webhook_id, known in self.known.items():
            if known.state != "completed":
                continue
            receipt = rows[webhook_id]
            assert receipt is not None
            assert receipt.state == "completed"
            assert receipt.response is not None
            assert known.answer is not None
            assert (
                receipt.response.status,
                receipt.response.content_type,
                receipt.response.body,
            ) == known.answer


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_ledger_state_machine(kind: str, pg_url: str) -> None:
    machine = type(f"LedgerMachine_{kind}", (LedgerMachine,), {"kind": kind, "pg_url": pg_url})
    machine.TestCase.settings = settings(
        max_examples=examples(60 if kind == "sqlite" else 40),
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    machine.TestCase().runTest()
