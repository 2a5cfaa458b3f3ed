"""A receipt's page: its state, fence and lease, its attempts with their (redacted) errors, the
stored answer and the payload where enabled, its audit records, and the forms of the actions
its state allows; and the confirmation page of a deliberate re-run.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._ledger import keyed
from .._ledger.receipts import Receipt, State
from .._queue import receipts as queue
from .._store.base import Connection, Row
from .html import Html, badge, duration, esc, fields, form, link, table, url, when
from .pages import View, idem_parts, receipt_href
from .queries import AuditRow
from .redaction import error_line, show_body


def _kind(receipt: Receipt) -> Html:
    provider, webhook_id = receipt.key.provider, receipt.key.webhook_id
    namespace = keyed.namespace(provider)
    if namespace == keyed.ACTION:
        return f"agent action of tool <code>{esc(provider.partition(':')[2])}</code>"
    if namespace == keyed.IDEMPOTENCY:
        parts = idem_parts(webhook_id)
        if parts is None:
            return "Idempotency-Key request"
        return (
            f"Idempotency-Key request ({esc(provider.partition(':')[2])}) of principal "
            f"<code>{esc(parts[0])}</code>, key <code>{esc(parts[1])}</code>"
        )
    return "webhook delivery"


def _state(receipt: Receipt) -> Html:
    text = badge(receipt.state.value.replace("_", " "), receipt.state.value)
    if keyed.needs_review(receipt):
        text += " " + badge("needs review", "needs_review")
    status = queue.rejected_status(receipt.state, receipt.last_error)
    if status is not None:
        text += " " + badge(f"rejected by its handler: HTTP {status}", "failed")
    if stale(receipt):
        text += " " + badge("stale: lease ended", "stale")
    return text


def _rejected_note(receipt: Receipt) -> Html:
    """Over the stored answer of a delivery answered 202 before its handler finished (queued,
    or handed off) that its handler rejected: that answer is the sender's 202, not the
    handler's."""
    status = queue.rejected_status(receipt.state, receipt.last_error)
    if status is None:
        return ""
    return (
        "<p class='hint'>The sender's answer, given before its handler finished (queued, or "
        "handed off at the sender's time limit). Its handler "
        f"answered {esc(status)} (see the failed attempts), which the sender never saw.</p>"
    )


def stale(receipt: Receipt) -> bool:
    return receipt.state is State.IN_FLIGHT and receipt.lease_until <= receipt.now


def replayable(receipt: Receipt) -> bool:
    return receipt.state in (State.FAILED, State.RELEASED) or stale(receipt)


def _operator(view: View) -> Html:
    """Who acts: known (signed in, or the host's user), or typed into the form."""
    if view.actor is not None:
        return ""
    return (
        '<label>Your name (recorded with the action) <input type="text" name="operator" '
        'required maxlength="100"></label>'
    )


def _reason(label: str = "Why (recorded with the action)") -> Html:
    return (
        f'<label>{esc(label)} <input type="text" name="reason" required maxlength="2000"></label>'
    )


def _actions(view: View, receipt: Receipt) -> Html:
    key = receipt.key
    values = {"provider": key.provider, "id": key.webhook_id, "fence": receipt.fence}
    webhook = keyed.namespace(key.provider) is None
    boxes: list[Html] = []
    if view.read_only:
        return "<p class='hint'>This console is read-only: no actions.</p>"
    if webhook and replayable(receipt):
        if view.can_replay:
            boxes.append(
                "<div><h3>Replay</h3><p class='hint'>Runs the stored delivery again through the "
                "claim and fence path, under the next fence. External handlers run again too: "
                "check the outside system first.</p>"
                + form(
                    f"{view.root}/replay",
                    view.csrf,
                    _operator(view) + _reason(),
                    "Replay",
                    cls="action",
                    values=values,
                )
                + "</div>"
            )
        else:
            boxes.append(
                "<div><h3>Replay</h3><p class='hint'>This console has no handlers (started with "
                "a store only): start it with --app, or run <code>receiver replay</code>.</p></div>"
            )
    if webhook and receipt.state is State.COMPLETED and view.can_replay:
        href = url(view.root, "/rerun", {"provider": key.provider, "id": key.webhook_id})
        boxes.append(
            "<div><h3>Run again</h3><p class='hint'>Completed: its effects committed once and "
            "every redelivery gets its stored answer. After fixing a handler bug you may run its "
            "handlers again, deliberately, behind a confirmation.</p>"
            + link(href, "Re-run this delivery…", cls="rerun")
            + "</div>"
        )
    if keyed.needs_review(receipt):
        answer = (
            '<label>Answer to store (JSON, optional; default {"status":"resolved"}) '
            '<textarea name="answer"></textarea></label>'
        )
        boxes.append(
            "<div><h3>Resolve</h3><p class='hint'>You reconciled it by hand: store it as "
            "completed. Nothing runs.</p>"
            + form(
                f"{view.root}/resolve",
                view.csrf,
                _operator(view) + _reason("Note: what you found and did") + answer,
                "Mark resolved",
                cls="action",
                values=values,
            )
            + "</div>"
        )
        boxes.append(
            "<div><h3>Store as failed</h3><p class='hint'>A final failure: it stays a dead "
            "letter, no longer waiting for review.</p>"
            + form(
                f"{view.root}/fail",
                view.csrf,
                _operator(view) + _reason(),
                "Store as failed",
                cls="action danger",
                values=values,
            )
            + "</div>"
        )
    if not boxes:
        return "<p class='hint'>Nothing to do here in this state.</p>"
    return f'<div class="actions">{"".join(boxes)}</div>'


def attempts_line(current: int, kept: int) -> str:
    """How many attempts failed: the receipt counts those since it was last queued or replayed
    (its retries' budget starts again then), the table lists every one still kept."""
    if current == kept:
        return str(kept)
    return f"{kept} ({current} since its last replay or re-queue)"


async def same_content(conn: Connection, receipt: Receipt) -> str | None:
    """The id of another webhook receipt of the provider in the window with the same payload
    and event type (key drift: the same signed content under two ids), or None."""
    if keyed.namespace(receipt.key.provider) is not None:
        return None
    key = receipt.key
    row = await conn.run(
        "same_content",
        key.provider,
        receipt.payload_hash,
        key.webhook_id,
        receipt.event_type,
        receipt.now,
    )
    return None if row is None else str(row["webhook_id"])


def _drift(view: View, receipt: Receipt, other: str | None) -> Html:
    if other is None:
        return "-"
    href = receipt_href(view, receipt.key.provider, other)
    return (
        badge("key drift", "stale")
        + " also received as "
        + link(href, other)
        + " <span class='hint'>(a sender repeating content under a new id, or a captured "
        "delivery re-sent: Provider(same_content=...) decides)</span>"
    )


def page(
    view: View,
    receipt: Receipt,
    attempts: Sequence[Row],
    audit: Sequence[AuditRow],
    same: str | None = None,
) -> Html:
    now = receipt.now
    if receipt.state is State.IN_FLIGHT:
        lease = (
            f"{when(receipt.lease_until)} (live, {esc(duration(receipt.lease_until - now))} left)"
            if receipt.lease_until > now
            else f"{when(receipt.lease_until)} (ended {esc(duration(now - receipt.lease_until))}"
            " ago)"
        )
    else:
        lease = when(receipt.lease_until)
    facts = fields(
        [
            ("kind", _kind(receipt)),
            ("provider", f"<code>{esc(receipt.key.provider)}</code>"),
            ("id", f"<code>{esc(receipt.key.webhook_id)}</code>"),
            ("state", _state(receipt)),
            ("fence", esc(receipt.fence)),
            ("lease until", lease),
            ("claimed at", when(receipt.claimed_at)),
            ("completed at", when(receipt.completed_at)),
            ("expires at", when(receipt.expires_at)),
            ("event type", esc(receipt.event_type or "-")),
            ("payload hash", f"<code>{esc(receipt.payload_hash.hex())}</code>"),
            ("same content", _drift(view, receipt, same)),
            ("failed attempts", esc(attempts_line(receipt.attempts, len(attempts)))),
        ]
    )
    attempt_rows = [
        [
            esc(a["fence"]),
            when(float(a["failed_at"])),
            f"<code>{esc(error_line(a['error'], None))}</code>",
        ]
        for a in attempts
    ]
    response = receipt.response
    if response is None:
        answer = "<p class='hint'>No stored answer (not finished).</p>"
    else:
        answer = (
            _rejected_note(receipt)
            + fields(
                [
                    ("status", esc(response.status)),
                    ("content type", esc(response.content_type or "-")),
                    ("size", esc(f"{len(response.body)} bytes")),
                ]
            )
            + _body(view, response.body, "stored answer")
        )
    if receipt.request_body is None:
        payload = (
            "<p class='hint'>Not kept: a receipt keeps its payload only until it completes.</p>"
        )
    else:
        payload = _body(view, receipt.request_body, "payload")
    audit_rows = [
        [
            when(a.at),
            esc(a.actor),
            esc(a.action),
            esc(a.reason),
            esc(a.outcome or "running"),
            esc(error_line(a.detail, None)),
        ]
        for a in audit
    ]
    return (
        f"{facts}<h2>Actions</h2>{_actions(view, receipt)}"
        f"<h2>Failed attempts</h2>"
        f"{table(['fence', 'failed at', 'error (redacted)'], attempt_rows, empty='none')}"
        f"<h2>Stored answer</h2>{answer}<h2>Payload</h2>{payload}"
        f"<h2>Operator actions</h2>"
        f"{table(['when', 'who', 'action', 'why', 'outcome', 'detail'], audit_rows)}"
    )


def _body(view: View, body: bytes, what: str) -> Html:
    if not view.show_payloads:
        return (
            f"<p class='hint'>The {esc(what)} is hidden: start the console with "
            "--show-payloads (or show_payloads=True) to show it, redacted.</p>"
        )
    shown = show_body(body, view.redact_fields)
    return f"<pre>{esc(shown)}</pre>"


def rerun(view: View, receipt: Receipt) -> Html:
    key = receipt.key
    back = receipt_href(view, key.provider, key.webhook_id)
    inner = (
        "<label>The delivery's payload, exactly as the sender sent it (a completed receipt no "
        "longer keeps it; the sender's dashboard has it). It must hash to this receipt's "
        'payload hash. <textarea name="payload" required></textarea></label>'
        + _operator(view)
        + _reason()
        + "<label>To confirm, type the webhook-id "
        f"<code>{esc(key.webhook_id)}</code> "
        '<input type="text" name="confirm" required autocomplete="off"></label>'
    )
    return (
        f"<p>You are about to run the handlers of <code>{esc(key.provider)}/"
        f"{esc(key.webhook_id)}</code> again. It completed at {when(receipt.completed_at)} with "
        f"HTTP {esc(receipt.response.status if receipt.response else '?')}; its effects "
        "committed then.</p>"
        "<ul><li>Every handler of its type runs once more, under the next fence, in one "
        "transaction with its new stored answer; external handlers call the outside world "
        "again.</li><li>It is recorded as your action, with your reason: a deliberate re-run, "
        "never counted as a double execution.</li><li>Senders' redeliveries stay deduplicated: "
        "they get the new stored answer.</li></ul>"
        + form(
            f"{view.root}/rerun",
            view.csrf,
            inner,
            "Run the handlers again",
            cls="confirm danger",
            values={"provider": key.provider, "id": key.webhook_id, "fence": receipt.fence},
        )
        + f"<p>{link(back, '← back to the receipt, changing nothing')}</p>"
    )
