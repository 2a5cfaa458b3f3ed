"""Once a handler with external effects has acted, no redelivery runs it again (issue 19, items
2 and 3), on both stores: its result is stored exactly (Decimal, Pydantic-like models), what
cannot be stored is a needs-review answer, an unfinished attempt past its dedup window is
reconciled rather than reclaimed, and a failing reconcile() keeps the receipt unresolved."""

from __future__ import annotations

import decimal
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from receiver import RUN_AGAIN, Event, Provider, Receiver, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Key, State
from receiver._store.base import Connection
from tests.support import PROVIDER, SECRET, Clock, SimulatedCrash, body_of, ledger_clock, signed

LEASE = 60.0


class Opaque:
    def __repr__(self) -> str:
        return "Opaque(iban=DE89370400440532013000)"


class Payments:
    """A receiver whose ``payment.created`` handler is external: ``answers`` says what each
    call returns (or raises), ``outside`` what reconcile() finds."""

    def __init__(self, store: Store, clock: Clock, *, encoder: Any = None) -> None:
        self.calls: list[int] = []
        self.reconciled: list[int] = []
        self.answers: list[Any] = []
        self.outside: list[Any] = []
        self.rx = Receiver(
            ledger_clock(store, clock),
            [Provider(PROVIDER, [SECRET], lease=LEASE)],
            clock=clock,
            sweep_interval=None,
            encoder=encoder,
        )
        self.clock = clock

        async def reconcile(event: Event) -> Any:
            self.reconciled.append(event.fence)
            found = self.outside.pop(0)
            if isinstance(found, BaseException):
                raise found
            return found

        @self.rx.on("payment.created", effects="external", reconcile=reconcile)
        async def pay(event: Event, tx: Connection) -> Any:
            self.calls.append(event.fence)
            answer = self.answers.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return answer

    async def post(self, webhook_id: str) -> httpx.Response:
        body = body_of("payment.created", amount="12.30")
        transport = httpx.ASGITransport(app=self.rx)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post(
                f"/{PROVIDER}",
                content=body,
                headers=signed(webhook_id, body, timestamp=self.clock.now),
            )

    async def receipt(self, webhook_id: str) -> ledger.Receipt:
        async with self.rx.store.acquire() as conn:
            found = await ledger.lookup(conn, Key(PROVIDER, webhook_id))
        assert found is not None
        return found


@pytest.fixture
async def payments(store: Store) -> AsyncIterator[Callable[..., Payments]]:
    made: list[Payments] = []

    def make(**options: Any) -> Payments:
        made.append(Payments(store, Clock(), **options))
        return made[-1]

    yield make
    for p in made:
        await p.rx.close()


async def test_a_decimal_result_is_stored_exactly_and_replayed(
    payments: Callable[..., Payments],
) -> None:
    p = payments()
    p.answers = [{"amount": decimal.Decimal("10000000000000001.10")}]
    first = await p.post("msg_1")
    assert (first.status_code, first.content) == (200, b'{"amount":10000000000000001.10}')
    again = await p.post("msg_1")
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert p.calls == [1]


async def test_an_unstorable_result_of_an_external_handler_needs_review_never_reruns(
    payments: Callable[..., Payments], caplog: pytest.LogCaptureFixture
) -> None:
    p = payments()
    p.answers = [{"payout": Opaque()}, {"paid": True}]
    first = await p.post("msg_2")
    assert first.status_code == 202
    assert first.json()["status"] == "needs_review"
    for _ in range(3):
        again = await p.post("msg_2")
        assert again.json()["status"] == "needs_review"
    assert p.calls == [1]
    receipt = await p.receipt("msg_2")
    assert receipt.state is State.FAILED
    assert receipt.last_error is not None
    assert "Opaque" in receipt.last_error
    assert "DE89" not in caplog.text
    assert any("ALERT:" in r.getMessage() and "Opaque" in r.getMessage() for r in caplog.records)


async def test_the_receivers_encoder_stores_what_else_could_not_be(
    payments: Callable[..., Payments],
) -> None:
    p = payments(encoder=lambda obj: {"kind": type(obj).__name__})
    p.answers = [Opaque()]
    answer = await p.post("msg_3")
    assert (answer.status_code, answer.json()) == (200, {"kind": "Opaque"})


@pytest.mark.parametrize("window_passed", [False, True])
async def test_an_unfinished_external_attempt_is_reconciled_whatever_its_age(
    payments: Callable[..., Payments], window_passed: bool
) -> None:
    p = payments()
    p.answers = [SimulatedCrash("the process died after paying")]
    p.outside = [{"paid": "found"}]
    with pytest.raises(SimulatedCrash):
        await p.post("msg_4")
    # Past the lease only, or past the whole dedup window too (a sender's manual resend days
    # later): either way the attempt is unfinished, and is reconciled, not run again.
    p.clock.advance(30 * 86_400 if window_passed else LEASE + 1)
    answer = await p.post("msg_4")
    assert (answer.status_code, answer.json()) == (200, {"paid": "found"})
    assert (p.calls, p.reconciled) == ([1], [2])


async def test_a_failing_reconcile_leaves_the_receipt_unresolved_never_released(
    payments: Callable[..., Payments],
) -> None:
    p = payments()
    p.answers = [SimulatedCrash("died mid-call"), {"paid": "again"}]
    p.outside = [ConnectionError("the bank is down"), ConnectionError("still down"), RUN_AGAIN]
    with pytest.raises(SimulatedCrash):
        await p.post("msg_5")
    p.clock.advance(LEASE + 1)
    for _ in range(2):
        answer = await p.post("msg_5")
        assert answer.status_code == 500
        receipt = await p.receipt("msg_5")
        assert receipt.state is State.IN_FLIGHT  # never released: no blind re-run
        assert receipt.last_error is not None
        assert "reconcile: ConnectionError" in receipt.last_error
    assert p.calls == [1]
    answer = await p.post("msg_5")  # the bank answers: it never saw the payment
    assert (answer.status_code, answer.json()) == (200, {"paid": "again"})
    assert p.calls == [1, 4]
