"""A provider's retry schedule played on a fake clock: every attempt, then a person pressing
"resend" later, across lease expiries and the edge of the dedup window."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._exceptions import ConfigurationError
from .._verification.sending import Webhook
from .._webhooks.schedules import RetrySchedule, format_duration
from .._webhooks.timespans import HOUR
from ._assertions import _table, assert_executed_once
from ._clock import FakeClock
from ._faults import Fault, Faults
from ._sender import Delivery, Sender


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """What one event's deliveries along the schedule got back."""

    webhook: Webhook
    #: Seconds after the first attempt at which each delivery was sent.
    offsets: tuple[float, ...]
    deliveries: tuple[Delivery, ...]

    @property
    def executions(self) -> int:
        return sum(d.outcome == "executed" for d in self.deliveries)


async def replay_schedule(
    sender: Sender,
    webhook: Webhook,
    clock: FakeClock,
    *,
    schedule: RetrySchedule | str | Sequence[float | str] | None = None,
    resend_after: Sequence[float] = (HOUR, 23 * HOUR),
    first: Fault | None = None,
    check: bool = True,
) -> ScheduleRun:
    """Deliver ``webhook`` at every attempt of the provider's retry schedule, as if every answer
    were lost on the way back (the worst case), then once for each of ``resend_after``: seconds
    after the last automatic retry at which a person presses "resend" in the dashboard (by
    default an hour and 23 hours later, inside the default one-day review margin; pass the
    delays your operators really take).

    In-process only (the Receiver and its store run on ``clock``). The schedule is the
    provider's own unless given. ``first`` injects a fault into the first attempt, so the
    later attempts show the recovery across the lease's expiry. With ``check`` (the default),
    raises AssertionError unless the handlers ran to a stored answer exactly once and every
    replay repeats it byte for byte: a TTL shorter than the schedule plus the resend lets a
    late delivery run them again.
    """
    if sender.receiver is None:
        # Days pass on the fake clock only: a server in another process lives on real time
        # and would refuse the later signatures as "too new".
        raise ConfigurationError(
            "replay_schedule moves a fake clock: send to the Receiver in this process"
        )
    provider = sender.receiver.providers[sender.provider]
    window = provider.window.window
    if schedule is None:
        schedule = provider.window.schedule
    plan = RetrySchedule.from_value(schedule)
    offsets = [*plan.offsets()]
    last = offsets[-1]
    offsets += [last + after for after in resend_after]
    if first is not None:
        Faults.of(sender.receiver).arm(webhook.id, first)
    start = clock()
    deliveries: list[Delivery] = []
    for offset in offsets:
        clock.advance(max(0.0, start + offset - clock()))
        deliveries.append(await sender.send(webhook))
    run = ScheduleRun(webhook, tuple(offsets), tuple(deliveries))
    if check and run.executions > 1:
        again = [
            f"+{format_duration(o)}"
            for o, d in zip(offsets, deliveries, strict=True)
            if d.outcome == "executed"
        ]
        why = (
            f"; the dedup window is {format_duration(window)} but the sender still "
            f"delivers at +{format_duration(offsets[-1])}: raise the provider's ttl"
        )
        raise AssertionError(
            f"{webhook!r} ran its handlers {run.executions} times, at {', '.join(again)}{why}\n"
            + _table(deliveries)
        )
    if check and run.executions == 1:
        assert_executed_once(deliveries)
    return run
