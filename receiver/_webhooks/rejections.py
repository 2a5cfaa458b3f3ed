"""A delivery whose sender was answered 202 before its handlers finished: a queued delivery
(answered when it was queued), or an inline one handed off at its sender's time limit
(:mod:`.handoff`).

Inline, the handlers' answer is the sender's: stored with their writes and replayed. Answered
202 early, the sender never hears of it, and the 202 is the first answer it got, so the 202
is what is stored and replayed to every redelivery, byte for byte (a queued receipt stores it
when it is queued; a handed-off one when it completes, in place of the handlers' answer).

A final 4xx of the handlers is then heard of by nobody but the ledger. The receipt is
therefore failed, not completed: a final answer, never retried, but one that ``receiver
inspect``, ``receiver failed`` and the console's failed list show as rejected by the handler,
with the status it answered as the attempt's error, and that is counted under its own
outcome (``handler_rejected``). The handlers' writes commit with the receipt, as an inline
final answer's do; and the request body is kept, so that an operator's replay can run it
again once the cause is fixed. A body that cannot be run at all (not JSON, no event type)
fails the same way, its reason kept as the attempt's error (it is a fixed text, never a
payload value).
"""

from __future__ import annotations

from .._ledger import receipts as ledger
from .._ledger.receipts import Key, State, StoredResponse
from .._logging import get_logger
from .._queue import receipts as queue
from .._store.base import Connection
from .jobs import Job
from .outcomes import Outcome

logger = get_logger("receiver")

#: The kind of error kept for a delivery answered 202 whose body cannot be run.
INVALID = "InvalidPayload"


def answered_early(job: Job) -> bool:
    """Whether ``job``'s sender was answered 202 before its handlers finished. For a delivery
    that may be handed off, asking fixes the answer: called where it is about to be stored."""
    if job.queued is not None:
        return True
    return job.turn is not None and job.turn.answer()


def sent(job: Job, stored: StoredResponse) -> StoredResponse:
    """What the sender got, and every redelivery gets: ``stored``, or the 202 it was told."""
    return queue.QUEUED if answered_early(job) else stored


def rejected(job: Job, stored: StoredResponse) -> bool:
    """Whether the handlers of a delivery answered 202 early answered a final 4xx (5xx and 429
    are failures, retried: see :func:`.outcomes.final_answer`)."""
    early = answered_early(job)  # asked first: it fixes a handoff's answer
    return early and stored.status >= 400


def _when(job: Job) -> str:
    return "queued" if job.queued is not None else "handed off"


async def complete_early(
    conn: Connection, job: Job, fence: int, stored: StoredResponse, now: float | None
) -> None:
    """Finish a delivery answered 202 early whose handlers answered ``stored``, in
    ``conn``'s transaction: completed, or for a final 4xx failed with the handlers' status
    kept; the 202 is the stored answer either way. LeaseLost if the fence is stale."""
    key = job.claim.key
    if rejected(job, stored):
        await fail_early(conn, job, fence, queue.rejection(stored.status, _when(job)), now)
    elif job.queued is not None:
        await queue.complete(conn, key, fence, State.COMPLETED, now, job.queued.window)
    else:
        await ledger.complete(conn, key, fence, queue.QUEUED, now)


async def fail_early(conn: Connection, job: Job, fence: int, error: str, now: float | None) -> None:
    """Fail a delivery answered 202 early for good, in ``conn``'s transaction, with ``error``
    as its attempt's error, the 202 as its stored answer and its body kept for a replay.
    LeaseLost if the fence is stale."""
    key = job.claim.key
    if job.queued is not None:
        await queue.reject(conn, key, fence, error, now, job.queued.window)
        return
    await ledger.complete(conn, key, fence, queue.QUEUED, now, state=State.FAILED)
    await _note(conn, key, fence, error, now)


async def _note(conn: Connection, key: Key, fence: int, error: str, now: float | None) -> None:
    await conn.run("note_failure", key.provider, key.webhook_id, fence, error)
    await conn.run("record_attempt", key.provider, key.webhook_id, fence, now, error)


def invalid(problem: str) -> str:
    """The error kept for a delivery answered 202 whose body cannot be run (``problem``: the
    parser's fixed text)."""
    return f"{INVALID}: {problem}; not retried"


def counted(job: Job, fence: int, stored: StoredResponse, outcome: Outcome) -> Outcome:
    """How a run whose completion stands is counted: ``outcome``, or for a delivery answered
    202 early that its handlers rejected, ``handler_rejected``, logged."""
    if not rejected(job, stored):
        return outcome
    key = job.claim.key
    logger.warning(
        "%s delivery rejected by its handler (HTTP %d): failed, not retried",
        "queued" if job.queued is not None else "handed-off",
        stored.status,
        extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
    )
    return Outcome.HANDLER_REJECTED
