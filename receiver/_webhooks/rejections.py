"""A queued delivery whose handlers answer a final 4xx.

Inline, a handler's 4xx is the sender's answer: stored with the handlers' writes and replayed.
A queued delivery's sender was answered 202 when it was queued, so nobody hears of its
handlers' answer but the ledger. The receipt is therefore failed, not completed: a final answer,
never retried, but one that ``receiver inspect``, ``receiver failed`` and the console's failed
list show as rejected by the handler, with the status it answered as the attempt's error, and
that the workers count under its own outcome (``handler_rejected``). The stored 202 stays, so
every redelivery is answered as before, byte for byte; the handlers' writes commit with the
receipt, as an inline final answer's do; and the request body is kept, so that an operator's
replay can run it again once the cause is fixed.
"""

from __future__ import annotations

from .._ledger.receipts import State, StoredResponse
from .._logging import get_logger
from .._queue import receipts as queue
from .._store.base import Connection
from .jobs import Job
from .outcomes import Outcome

logger = get_logger("receiver")


def rejected(job: Job, stored: StoredResponse) -> bool:
    """Whether a queued receipt's handlers answered a final 4xx (5xx and 429 are failures,
    retried: see :func:`.outcomes.final_answer`)."""
    return job.queued is not None and stored.status >= 400


async def complete_queued(
    conn: Connection, job: Job, fence: int, stored: StoredResponse, now: float | None
) -> None:
    """Finish a queued receipt whose handlers answered ``stored``, in ``conn``'s transaction:
    completed, or for a final 4xx failed with the handlers' status kept
    (:func:`receiver._queue.receipts.reject`). The stored 202 stays either way; LeaseLost if
    the fence is stale."""
    assert job.queued is not None
    key, window = job.claim.key, job.queued.window
    if rejected(job, stored):
        await queue.reject(conn, key, fence, stored.status, now, window)
    else:
        await queue.complete(conn, key, fence, State.COMPLETED, now, window)


def counted(job: Job, fence: int, stored: StoredResponse, outcome: Outcome) -> Outcome:
    """How a run whose completion stands is counted: ``outcome``, or for a queued receipt its
    handlers rejected, ``handler_rejected``, logged."""
    if not rejected(job, stored):
        return outcome
    key = job.claim.key
    logger.warning(
        "queued delivery rejected by its handler (HTTP %d): failed, not retried",
        stored.status,
        extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
    )
    return Outcome.HANDLER_REJECTED
