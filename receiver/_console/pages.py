"""The console's list pages, rendered on the server: overview, receipts (webhooks, agent actions,
Idempotency-Keys), what needs attention, and the audit records.

Each function returns a page body (escaped HTML); :mod:`receiver._console.app` puts it in the
layout. The receipt's own page and its forms are in :mod:`receiver._console.receipt`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from .._queue import receipts as queue
from . import charts
from .html import Html, badge, duration, esc, link, table, url, when
from .overview import RANGES, STATES, Overview
from .queries import AuditRow, Filters, Page, ReceiptRow
from .redaction import error_line


@dataclass(frozen=True, slots=True)
class View:
    """What every page needs to know about this request and this console."""

    root: str
    csrf: str
    actor: str | None  # who is acting, when the console knows (signed in, or the host's user)
    read_only: bool
    show_payloads: bool
    can_replay: bool  # a Receiver with handlers is at hand
    redact_fields: tuple[str, ...] = ()


KIND_TITLES = {"webhook": "Receipts", "action": "Agent actions", "idem": "Idempotency-Keys"}
KIND_PATHS = {"webhook": "/receipts", "action": "/actions", "idem": "/keys"}
ATTENTION = {
    "failed": "Failed",
    "needs_review": "Needs review",
    "released": "Released after failures",
    "stale": "Stale (in flight, lease ended)",
}


def state_badge(row: ReceiptRow) -> Html:
    if row.needs_review:
        return badge("needs review", "needs_review")
    if queue.rejected_status(row.state, row.last_error) is not None:
        return badge("rejected by handler", "failed")
    if row.stale:
        return badge("stale", "stale")
    return badge(row.state.replace("_", " "), row.state)


def receipt_href(view: View, provider: str, webhook_id: str) -> str:
    return url(view.root, "/receipt", {"provider": provider, "id": webhook_id})


def idem_parts(webhook_id: str) -> tuple[str, str] | None:
    """(principal, key) of an Idempotency-Key row, stored as the JSON pair."""
    try:
        principal, key = orjson.loads(webhook_id)
    except (orjson.JSONDecodeError, ValueError, TypeError):
        return None
    return str(principal), str(key)


def overview(view: View, data: Overview, chart_range: str) -> Html:
    oldest = data.oldest_in_flight
    cards = [
        ("In flight", str(data.total("in_flight")), False),
        ("Queued", str(data.total("queued")), False),
        ("Completed", str(data.total("completed")), False),
        ("Released (retry due)", str(data.total("released")), False),
        ("Failed (dead letters)", str(data.total("failed")), data.total("failed") > 0),
        ("Needs review", str(data.needs_review), data.needs_review > 0),
        (
            "Oldest claim in flight",
            "none" if oldest is None else duration(data.now - oldest[1]),
            False,
        ),
    ]
    if data.shed is not None:
        per_second, share = data.shed
        value = f"{per_second:.1f}/s · {share:.0%}" if per_second else "none"
        cards.append(("Shed under load (this process, last minute)", value, per_second > 0))
    card_html = "".join(
        f'<div class="card{" alert" if alert else ""}"><div class="label">{esc(label)}</div>'
        f'<div class="value">{esc(value)}</div></div>'
        for label, value, alert in cards
    )
    if oldest is not None:
        card_html += (
            f'<div class="card"><div class="label">Oldest in flight is</div>'
            f'<div class="value">{esc(oldest[0])}</div></div>'
        )
    ranges = " · ".join(
        esc(r) if r == chart_range else link(url(view.root, "/", {"range": r}), r) for r in RANGES
    )
    chart = charts.bars(
        [
            charts.Series("deliveries", data.deliveries),
            charts.Series("failures", data.failures),
            charts.Series("replays", data.replays),
        ],
        data.step,
        "Deliveries, failed attempts and operator replays over time",
    )
    rows = []
    for p in data.providers:
        path = KIND_PATHS[p.kind]
        window = (
            "-"
            if p.window is None
            else f"{esc(duration(p.window))} <span class='hint'>{esc(p.window_source)}</span>"
        )
        rows.append(
            [
                link(url(view.root, path, {"provider": p.name}), p.name),
                esc(p.kind),
                *[esc(p.counts.get(s, 0)) for s in STATES],
                link(
                    url(view.root, "/attention", {"list": "needs_review", "provider": p.name}),
                    p.needs_review,
                )
                if p.needs_review
                else "0",
                "-" if p.oldest_in_flight is None else esc(duration(data.now - p.oldest_in_flight)),
                window,
            ]
        )
    providers = table(
        [
            "provider",
            "kind",
            *[s.replace("_", " ") for s in STATES],
            "needs review",
            "oldest in flight",
            "dedup window",
        ],
        rows,
        cls="providers",
        empty="no receipts yet",
    )
    return (
        f'<div class="cards">{card_html}</div>'
        f"<h2>Over time <span class='hint'>({ranges}; UTC)</span></h2>{chart}"
        f"<h2>Per provider</h2>{providers}"
        '<p class="hint">Completed counts on a large PostgreSQL ledger are the planner\'s '
        "estimate (within a few percent); the other states are exact. A full chart bucket is "
        "extrapolated from the newest entries it read (drawn lighter).</p>"
    )


def receipts(
    view: View,
    filters: Filters,
    page: Page,
    providers: Sequence[str],
    query: Mapping[str, str],
    panel: Html = "",
) -> Html:
    path = KIND_PATHS[filters.kind]
    options = "".join(
        f'<option value="{esc(p)}"{" selected" if p == filters.provider else ""}>{esc(p)}</option>'
        for p in ["", *providers]
    )
    states = "".join(
        f'<option value="{esc(s)}"{" selected" if s == filters.state else ""}>'
        f"{esc(s.replace('_', ' ') or 'any')}</option>"
        for s in ("", *STATES)
    )
    since = query.get("since", "")
    since_options = "".join(
        f'<option value="{esc(v)}"{" selected" if v == since else ""}>{esc(label)}</option>'
        for v, label in (
            ("", "any time"),
            ("1h", "last hour"),
            ("24h", "last 24 h"),
            ("7d", "last 7 days"),
        )
    )
    extra = ""
    if filters.kind == "idem":
        extra = (
            f'<label>principal <input name="principal" value="{esc(query.get("principal", ""))}"'
            ' size="14"></label>'
        )
    elif filters.kind == "action":
        extra = (
            f'<label>scope <input name="scope" value="{esc(query.get("scope", ""))}"'
            ' size="14"></label>'
        )
    filter_form = (
        f'<form class="filters" method="get" action="{esc(view.root + path)}">'
        f'<label>provider <select name="provider">{options}</select></label>'
        f'<label>state <select name="state">{states}</select></label>'
        f'<label>type <input name="type" value="{esc(filters.event_type)}" size="16"></label>'
        f"{extra}"
        f'<label>since <select name="since">{since_options}</select></label>'
        f'<label>id <input name="id" value="{esc(query.get("id", ""))}" size="18"'
        ' placeholder="exact webhook-id or key"></label>'
        '<button type="submit">Filter</button></form>'
    )
    headers, rows = _receipt_rows(view, filters.kind, page.rows)
    pager = ""
    if page.next is not None:
        params = {k: v for k, v in query.items() if k not in ("after", "msg")}
        params["after"] = page.next.encode()
        pager = link(url(view.root, path, params), "older →")
    searched = (
        f"<p class='hint'>Looked back to {when(page.searched_to)} without filling the page "
        "(each page reads a bounded number of receipts): older ones are on the next page.</p>"
        if page.searched_to is not None
        else ""
    )
    return (
        f"{panel}{filter_form}{table(headers, rows, empty='no receipts match')}{searched}"
        f'<div class="pager">{pager}</div>'
    )


def _receipt_rows(
    view: View, kind: str, rows: Sequence[ReceiptRow]
) -> tuple[list[str], list[list[Html]]]:
    if kind == "idem":
        headers = [
            "namespace",
            "principal",
            "key",
            "state",
            "status",
            "attempts",
            "claimed",
            "last error",
        ]
    elif kind == "action":
        headers = ["tool", "action key", "state", "status", "attempts", "claimed", "last error"]
    else:
        headers = [
            "provider",
            "webhook-id",
            "type",
            "state",
            "status",
            "attempts",
            "claimed",
            "last error",
        ]
    out: list[list[Html]] = []
    for r in rows:
        href = receipt_href(view, r.provider, r.webhook_id)
        error = esc(error_line(r.last_error))
        common = [
            state_badge(r),
            esc(r.response_status or ""),
            esc(r.attempts),
            when(r.claimed_at),
            f"<code>{error}</code>" if error else "",
        ]
        if kind == "idem":
            parts = idem_parts(r.webhook_id) or ("?", r.webhook_id)
            out.append([esc(r.provider), esc(parts[0]), link(href, parts[1]), *common])
        elif kind == "action":
            out.append([esc(r.provider.partition(":")[2]), link(href, r.webhook_id), *common])
        else:
            out.append(
                [esc(r.provider), link(href, r.webhook_id), esc(r.event_type or ""), *common]
            )
    return headers, out


def attention(view: View, which: str, provider: str, page: Page, providers: Sequence[str]) -> Html:
    tabs = " · ".join(
        f"<strong>{esc(title)}</strong>"
        if key == which
        else link(url(view.root, "/attention", {"list": key, "provider": provider}), title)
        for key, title in ATTENTION.items()
    )
    options = "".join(
        f'<option value="{esc(p)}"{" selected" if p == provider else ""}>{esc(p or "all")}</option>'
        for p in ["", *providers]
    )
    chooser = (
        f'<form class="filters" method="get" action="{esc(view.root)}/attention">'
        f'<input type="hidden" name="list" value="{esc(which)}">'
        f'<label>provider <select name="provider">{options}</select></label>'
        '<button type="submit">Show</button></form>'
    )
    headers = [
        "provider",
        "id",
        "type",
        "state",
        "attempts",
        "claimed",
        "lease until",
        "last error",
    ]
    rows = [
        [
            esc(r.provider),
            link(receipt_href(view, r.provider, r.webhook_id), r.webhook_id),
            esc(r.event_type or ""),
            state_badge(r),
            esc(r.attempts),
            when(r.claimed_at),
            when(r.lease_until),
            f"<code>{esc(error_line(r.last_error))}</code>" if r.last_error else "",
        ]
        for r in page.rows
    ]
    pager = ""
    if page.next is not None:
        params = {"list": which, "provider": provider, "after": page.next.encode()}
        pager = link(url(view.root, "/attention", params), "older →")
    hint = {
        "failed": "Final failures, among them deliveries answered 202 (queued or handed off) "
        "that their handlers then rejected with a 4xx: replay one once its cause is fixed (a "
        "queued one is queued again for the workers).",
        "needs_review": "An external effect may or may not have happened: check the outside "
        "system, then resolve it (reconciled by hand), store it as failed, or replay it.",
        "released": "Handlers failed and the claim was given back: the sender's next retry runs "
        "it again, or replay it now.",
        "stale": "Attempts that died or stalled: the sweeper recovers them; replay one to run it "
        "now.",
    }[which]
    return (
        f"<p>{tabs}</p>{chooser}<p class='hint'>{esc(hint)}</p>"
        f"{table(headers, rows, empty='nothing here')}<div class='pager'>{pager}</div>"
    )


def audit(view: View, rows: Sequence[AuditRow], next_id: int | None) -> Html:
    body = table(
        ["#", "when", "who", "action", "receipt", "fence", "why", "outcome", "detail"],
        [
            [
                esc(r.id),
                when(r.at),
                esc(r.actor),
                esc(r.action),
                link(receipt_href(view, r.provider, r.webhook_id), f"{r.provider}/{r.webhook_id}"),
                esc("" if r.fence is None else r.fence),
                esc(r.reason),
                esc(r.outcome or "running"),
                esc(error_line(r.detail, None)),
            ]
            for r in rows
        ],
        empty="no operator actions yet",
    )
    pager = (
        "" if next_id is None else link(url(view.root, "/audit", {"before": next_id}), "older →")
    )
    return (
        "<p class='hint'>Every operator action, newest first, with its outcome: replays (from "
        "this console or <code>receiver replay</code>), re-runs of completed deliveries, and "
        "decisions on receipts that needed review. The sweeper deletes records older than the "
        "audit retention (<code>audit_retention</code>, a year by default).</p>"
        f"{body}<div class='pager'>{pager}</div>"
    )


def turn_panel(turns: Mapping[str, tuple[float, float, float]]) -> Html:
    """Keys per conversation turn by tool, from this process's metrics (the drift signal)."""
    if not turns:
        return (
            "<p class='hint'>Keys per conversation turn (the drift signal) are counted by the "
            "process that executes actions, in its metrics (receiver_action_turn_keys_total / "
            "receiver_action_turns_total): mount the console with rx.console() in that process to "
            "see them here.</p>"
        )
    rows = [
        [
            esc(tool),
            esc(f"{t:g}"),
            esc(f"{keys / t:.2f}" if t else "-"),
            esc(f"{most:g}"),
        ]
        for tool, (t, keys, most) in sorted(turns.items())
    ]
    return (
        "<h2>Keys per conversation turn</h2>"
        + table(["tool", "turns", "keys per turn", "most keys in one recent turn"], rows)
        + "<p class='hint'>Counted by this process since it started. When keys per turn climb, "
        "key derivation is drifting (a planner minting new action ids for one intent).</p>"
    )


def error(message: str) -> Html:
    return f'<div class="notice error">{esc(message)}</div>'
