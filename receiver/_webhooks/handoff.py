"""Handoff: an inline delivery still running when its sender's time is nearly spent is answered
202, as queued mode answers, and finishes in the background (``Provider(handoff=True)``).

The delivery runs as a task from the start; the request waits for it until the sender's budget
is nearly spent: its time limit, less what the delivery has already waited, less a margin (the
larger of :data:`MARGIN` and :data:`MARGIN_SHARE` of the limit) for the answer to reach it.
Finished by then, its own answer is sent, as without handoff. Still running, the sender is told
202 with queued mode's body, and the task is never cancelled: the delivery runs to completion in
its own transaction, its receipt in flight under its fence until then (a redelivery meanwhile
gets the in-flight answer; one after completion, the stored answer). If the process dies first,
the receipt's stored body lets the sweeper recover it once its lease has expired, as it
recovers any interrupted inline attempt.

Who answers the sender is decided once per delivery, by its :class:`Turn`: a delivery is
handed off only while its handlers run (before its claim, its answer may be a replay or a
conflict, which a 202 would contradict), and not once it has fixed its own answer (that
answer is being stored: the request waits for it). A delivery handed off stores the 202 the
sender got, so that every redelivery is answered the same, byte for byte; a final 4xx of its
handlers fails the receipt instead, rejected by its handler, as a queued delivery's does
(:mod:`.rejections`).

The tasks are kept in :attr:`Handoffs.tasks` until they end; closing the Receiver waits for them
up to :data:`GRACE` seconds, then cancels those left (their transactions roll back, and lease
recovery finishes them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from .._logging import get_logger
from .outcomes import Reply

logger = get_logger("receiver")

#: Seconds kept back from the sender's limit for the answer to reach it (at least).
MARGIN = 0.5
#: ...or this share of the limit, where that is more (1 s of GitHub's 10 s).
MARGIN_SHARE = 0.1
#: How long closing a Receiver waits for handed-off deliveries before cancelling them.
GRACE = 30.0


def margin(timeout: float) -> float:
    """Seconds kept back from a sender's limit of ``timeout`` for the answer to reach it."""
    return max(MARGIN, MARGIN_SHARE * timeout)


def budget(timeout: float, waited: float) -> float:
    """Seconds a delivery that has waited ``waited`` may still run before it is handed off."""
    return max(0.0, timeout - waited - margin(timeout))


class Turn:
    """Whether one delivery's sender is answered by the delivery or was told 202 at its limit,
    decided once (between awaits, so the two sides never both win)."""

    __slots__ = ("answered", "began", "handed_off")

    def __init__(self) -> None:
        #: Set when the delivery's handlers begin: from then on it may be handed off.
        self.began: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: The sender was answered 202 before the delivery finished.
        self.handed_off = False
        #: The delivery fixed its own answer: it is the sender's, and no handoff happens.
        self.answered = False

    def begin(self) -> None:
        """The delivery has claimed its key and runs its handlers."""
        if not self.began.done():
            self.began.set_result(None)

    def hand_off(self) -> bool:
        """At the sender's limit: True (and the sender is told 202) if the delivery's handlers
        are running and it has not fixed its answer."""
        if self.began.done() and not self.answered:
            self.handed_off = True
        return self.handed_off

    def answer(self) -> bool:
        """The delivery is about to store its answer: True if its sender was told 202 already
        (the 202 is what is stored), else False, and from now on it is not handed off."""
        if not self.handed_off:
            self.answered = True
        return self.handed_off


class Handoffs:
    """The deliveries of one Receiver that were answered before they finished."""

    def __init__(self, grace: float = GRACE) -> None:
        self.grace = grace
        #: Handed-off deliveries still running.
        self.tasks: set[asyncio.Task[Reply]] = set()

    async def run(
        self, work: Coroutine[Any, Any, Reply], within: float, turn: Turn
    ) -> Reply | None:
        """``work``'s result if it finishes within ``within`` seconds (or its exception), else
        None once ``turn`` hands it off: it goes on in the background, never cancelled. Not yet
        running its handlers at the limit, it is handed off once they begin; its own answer
        already fixed, that answer is awaited."""
        task = asyncio.create_task(work)
        try:
            await asyncio.wait((task,), timeout=within)
            if not task.done() and not turn.hand_off():
                if not turn.answered:
                    await asyncio.wait((task, turn.began), return_when=asyncio.FIRST_COMPLETED)
                if not task.done() and not turn.hand_off():
                    await asyncio.wait((task,))
        except asyncio.CancelledError:
            # The request was cancelled (the client went away): the delivery finishes anyway.
            self._keep(task)
            raise
        if task.done():
            return task.result()
        self._keep(task)
        return None

    def _keep(self, task: asyncio.Task[Reply]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Reply]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # The pipeline answers its own failures; this is a bug, and nobody else awaits it.
            logger.error("a handed-off delivery failed", exc_info=task.exception())

    async def drain(self) -> None:
        """Wait up to :attr:`grace` seconds for the handed-off deliveries, then cancel those
        still running (their receipts stay in flight until lease recovery runs them again)."""
        if not self.tasks:
            return
        _, pending = await asyncio.wait(set(self.tasks), timeout=self.grace)
        if not pending:
            return
        logger.warning(
            "%d handed-off deliveries still running after %g s; cancelled, their receipts are "
            "recovered once their leases expire",
            len(pending),
            self.grace,
        )
        for task in pending:
            task.cancel()
        await asyncio.wait(pending)
