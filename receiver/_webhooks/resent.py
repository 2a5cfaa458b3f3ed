"""A delivery whose signed content is already in the window under another id:
``Provider(same_content="hold" | "absorb")``.

A sender whose event id is not signed (GitHub, Shopify, Twilio) cannot tell the ledger whether
two deliveries with the same content are one event or two: a captured request re-sent under a
new id looks exactly like it. So by default (``"run"``) the new id is a new event, and the claim
that finds the same content under another key reports it as key drift (the alert and
``receiver_key_drift``, :meth:`receiver._ops.metrics.Metrics.drifted`). A user who knows that
their sender never repeats content opts in: ``"hold"`` records the delivery as needing review
(202 to the sender, the handlers not run until an operator replays it), ``"absorb"`` answers it
with the other receipt's stored answer, as a duplicate.

Only content of the same event type counts: one Shopify change fires ``products/create`` and
``products/update`` with the same body, and both run. Decided after the claim, on the claim's
own drift flag, so that a delivery that repeats nothing costs nothing more.
"""

from __future__ import annotations

from .._ledger import receipts as ledger
from .._ledger.receipts import State, StoredResponse, decode_headers
from .._ledger.responses import replay
from .._ops.review import needs_review
from .execution import Execution
from .jobs import Job
from .outcomes import Outcome, Reply
from .providers import Provider

#: What the sender is told about a held delivery (stored, and replayed to its retries).
HELD = StoredResponse(
    202,
    "application/json",
    b'{"status":"held","detail":"the same content was already received under another id; '
    b'held for review"}',
)


async def settle(execution: Execution, provider: Provider, job: Job, fence: int) -> Reply | None:
    """The answer to a fresh claim (``fence``) that reported drift, under the provider's
    ``same_content``; None where the handlers run as for any delivery."""
    if provider.same_content == "run":
        return None
    claim = job.claim
    key = claim.key
    async with execution.store.acquire() as conn:
        other = await conn.run(
            "same_content",
            key.provider,
            claim.payload_hash,
            key.webhook_id,
            claim.event_type,
            claim.now,
        )
        if other is None:  # gone meanwhile (expired), or released: waiting for its own retry
            return None
        if provider.same_content == "hold":
            reason = f"held: the same content was received as {other['webhook_id']!r}"
            await needs_review(conn, key, fence, HELD, reason, claim.now, execution.metrics)
            return Reply(replay(HELD, replayed=False), Outcome.NEEDS_REVIEW, fence)
        if other["response_status"] is None:
            # Still running under its own key: its answer is not known yet. Given back, so the
            # sender's retry is absorbed once it is.
            await ledger.release(
                conn, key, fence, "the same content is in flight under another id", claim.now
            )
            return execution._busy(fence, 1)
        stored = StoredResponse(
            other["response_status"],
            other["response_content_type"] or "",
            bytes(other["response_body"]),
            decode_headers(other["response_headers"]),
        )
        # A held one stays held: absorbed, it needs the same review.
        state = State.FAILED if other["state"] == State.FAILED else State.COMPLETED
        await ledger.complete(conn, key, fence, stored, claim.now, state=state)
    return Reply(replay(stored, replayed=True), Outcome.REPLAYED, fence, detail="same_content")
