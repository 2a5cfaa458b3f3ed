"""Redelivery orders as data, and playing one against a real Receiver.

A step list is what :func:`receiver.testing.redeliveries` draws and hypothesis shrinks, so each
step prints short: ``deliver(e0, before_commit)``, ``twins(e1, 4)``, ``wait(lease)``,
``sweep()``. After every step the kit checks what holds for any handler (each event's handlers
ran to a stored answer at most once; every replay repeats that answer byte for byte) and then
the user's own invariant. At the end every lease is let expire, the sweeper runs, each event is
delivered once more, and nothing may be left in flight.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from .._store.base import Connection
from .._verification.sending import Webhook
from .._webhooks.app import Receiver
from ._assertions import _table, assert_nothing_in_flight
from ._clock import FakeClock
from ._faults import Fault, Faults
from ._sender import Delivery, Sender

#: The user's invariant: reads their own tables through ``conn`` and raises AssertionError.
Invariant = Callable[[Connection], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Deliver:
    """One delivery of event ``event``; ``fault`` strikes it if its handlers run."""

    event: int
    fault: Fault | None = None

    def __repr__(self) -> str:
        return f"deliver(e{self.event}{'' if self.fault is None else ', ' + self.fault.value})"


@dataclass(frozen=True, slots=True)
class Twins:
    """``copies`` concurrent deliveries of event ``event`` through one barrier."""

    event: int
    copies: int

    def __repr__(self) -> str:
        return f"twins(e{self.event}, {self.copies})"


@dataclass(frozen=True, slots=True)
class Wait:
    """Time passes: ``"moment"`` is one second, ``"lease"`` one second more than the longest
    lease (every in-flight claim expires)."""

    span: str

    def __repr__(self) -> str:
        return f"wait({self.span})"


@dataclass(frozen=True, slots=True)
class Sweep:
    """One sweeper pass (``rx.sweep()``): recovers expired in-flight receipts."""

    def __repr__(self) -> str:
        return "sweep()"


Step = Deliver | Twins | Wait | Sweep

_RECOVERY = "after the recovery (wait(lease), sweep(), then each event delivered once more)"


def check_history(history: dict[str, list[Delivery]]) -> None:
    """What holds for any handler: at most one stored execution per event, and every replay
    the same answer byte for byte."""
    for webhook_id, deliveries in history.items():
        executed = [d for d in deliveries if d.outcome == "executed"]
        if len(executed) > 1:
            raise AssertionError(
                f"{webhook_id}: the handlers ran to a stored answer {len(executed)} times:\n"
                + _table(deliveries)
            )
        answers = {d.answer for d in deliveries if d.outcome in ("executed", "replayed")}
        if len(answers) > 1:
            raise AssertionError(
                f"{webhook_id}: the replays are not byte-identical:\n" + _table(deliveries)
            )


def lease_of(rx: Receiver, provider: str) -> float:
    """The longest lease a claim of ``provider`` can get."""
    leases: list[float] = [h.lease for h in rx.registry if h.lease is not None]
    return max([rx.providers[provider].lease, *leases])


async def play(
    rx: Receiver,
    sender: Sender,
    clock: FakeClock,
    webhooks: Sequence[Webhook],
    steps: Sequence[Step],
    *,
    invariant: Invariant | None = None,
    final: Invariant | None = None,
) -> dict[str, list[Delivery]]:
    """Play ``steps`` against the open Receiver ``rx``, checking after each; then recover and
    check that nothing is left in flight and that ``final`` (else ``invariant``) holds."""
    faults = Faults.of(rx)
    lease = lease_of(rx, sender.provider)
    history: dict[str, list[Delivery]] = {w.id: [] for w in webhooks}
    done: list[Step] = []

    async def check(where: str) -> None:
        try:
            check_history(history)
            if invariant is not None:
                async with rx.store.acquire() as conn:
                    await invariant(conn)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{where}; steps: {done!r}") from exc

    for step in steps:
        done.append(step)
        if isinstance(step, Deliver):
            webhook = webhooks[step.event]
            if step.fault is not None:
                faults.arm(webhook.id, step.fault)
            history[webhook.id].append(await sender.send(webhook))
            faults.disarm()  # a fault belongs to this delivery only (a replay runs nothing)
        elif isinstance(step, Twins):
            webhook = webhooks[step.event]
            history[webhook.id].extend(await sender.twins(webhook, step.copies))
        elif isinstance(step, Wait):
            clock.advance(lease + 1 if step.span == "lease" else 1.0)
        else:
            await rx.sweep()
        await check(f"after {step!r}")

    # Recovery: every lease runs out, the sweeper passes, the sender tries each event again.
    clock.advance(lease + 1)
    await rx.sweep()
    for webhook in webhooks:
        history[webhook.id].append(await sender.send(webhook))
    await check(_RECOVERY)
    try:
        await assert_nothing_in_flight(rx.store, sender.provider)
        if final is not None:
            async with rx.store.acquire() as conn:
                await final(conn)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_RECOVERY}; steps: {steps!r}") from exc
    return history
