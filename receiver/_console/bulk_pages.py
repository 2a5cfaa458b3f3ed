"""The bulk replay's pages: the filter and its dry run, the typed confirmation, the job's
progress (its own page, refreshed while it runs, no script needed) and cancelling it.
The job itself is :mod:`receiver._console.bulk`."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .._exceptions import ReceiverError
from .._store.base import Store
from . import actions, bulk, pages
from .forms import BadRequest
from .html import Html, badge, esc, form, hidden, link, table, url, when
from .operate import actor_of
from .redaction import error_line

#: Seconds between two refreshes of a running job's page.
REFRESH = 2


class Console(Protocol):
    """What these pages use of the console (receiver._console.app.Console)."""

    @property
    def store(self) -> Store: ...
    @property
    def bulk_rate(self) -> float: ...
    def start_runner(self) -> bool: ...
    def now(self) -> float: ...
    async def redirect(self, request: Request, href: str, notice: str) -> Response: ...


def _filter(console: Console, given: Mapping[str, str]) -> bulk.Filter:
    fields = {k: given.get(k, "") for k in ("provider", "state", "type", "since", "until", "error")}
    try:
        return bulk.Filter.parse(fields, console.now())
    except ReceiverError as exc:
        raise BadRequest(str(exc)) from None


def filter_link(view: pages.View, query: Mapping[str, str]) -> Html:
    """'Replay all matching…' for a list's filter (its time filter becomes a since)."""
    wanted = {k: query.get(k, "") for k in ("provider", "type")}
    state = query.get("state", "") or query.get("list", "")
    wanted["state"] = state if state in ("released", "failed") else ""
    wanted["since"] = query.get("since", "")
    return (
        '<p class="bulk-link">'
        + link(url(view.root, "/bulk", wanted), "Replay all matching deliveries…")
        + "</p>"
    )


def page(console: Console) -> Any:
    async def handler(request: Request, view: pages.View) -> Response | tuple[str, Html]:
        if request.method == "POST":
            return await _confirm(console, request, view)
        q = request.query_params
        wanted = _filter(console, q)
        body = _filter_form(view, wanted)
        if q.get("count"):
            found = await bulk.preview(console.store, wanted)
            body += _preview(view, console, wanted, found)
        async with console.store.acquire() as conn:
            jobs = await conn.run_all("bulk_job_list", 20)
        body += "<h2>Recent bulk replays</h2>" + _jobs(view, jobs)
        return "Bulk replay", body

    return handler


async def _confirm(console: Console, request: Request, view: pages.View) -> Response:
    form_data: dict[str, str] = request.state.form
    wanted = _filter(console, form_data)
    job = await bulk.create(
        console.store,
        actor_of(view, form_data),
        wanted,
        form_data.get("count", ""),
        form_data.get("reason", ""),
        form_data.get("request", ""),
        console.bulk_rate,
    )
    if not console.start_runner():
        notice = (
            f"Bulk replay {job} confirmed: this console has no handlers, so it runs when a "
            "console with them (or receiver replay --job) takes it"
        )
    else:
        notice = f"Bulk replay {job} started"
    return await console.redirect(request, url(view.root, "/bulk/job", {"id": job}), notice)


def job_page(console: Console) -> Any:
    async def handler(request: Request, view: pages.View) -> tuple[str, Html]:
        job = _job_id(request.query_params.get("id", ""))
        async with console.store.acquire() as conn:
            row = await conn.run("bulk_job_get", job, console.store.now())
        if row is None:
            raise actions.ActionRefused(f"no bulk replay {job}")
        counts = await bulk.outcomes(console.store, job)
        if row["state"] == "running":
            request.state.head = f'<meta http-equiv="refresh" content="{REFRESH}">'
        return f"Bulk replay {job}", _job(view, row, counts)

    return handler


def cancel(console: Console) -> Any:
    async def handler(request: Request, view: pages.View) -> Response:
        job = _job_id(request.state.form.get("id", ""))
        done = await bulk.cancel(console.store, job)
        notice = f"Bulk replay {job} cancelled" if done else f"Bulk replay {job} is not running"
        return await console.redirect(request, url(view.root, "/bulk/job", {"id": job}), notice)

    return handler


def _job_id(text: str) -> int:
    # ASCII digits only: str.isdigit() takes "²", which int() refuses.
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise BadRequest("name the bulk replay: ?id=N")
    return int(text)


def _filter_form(view: pages.View, wanted: bulk.Filter) -> Html:
    q = wanted.query()
    states = "".join(
        f'<option value="{esc(s)}"{" selected" if s == wanted.state else ""}>'
        f"{esc(s or 'failed or released')}</option>"
        for s in bulk.STATES
    )

    def box(name: str, label: str, size: int = 16, hint: str = "") -> Html:
        return (
            f'<label>{esc(label)} <input name="{name}" value="{esc(q[name])}" size="{size}"'
            f' placeholder="{esc(hint)}"></label>'
        )

    return (
        f'<form class="filters" method="get" action="{esc(view.root)}/bulk">'
        + box("provider", "provider", 12)
        + f'<label>state <select name="state">{states}</select></label>'
        + box("type", "event type", 16)
        + box("since", "claimed since", 18, "2h, 7d or 2026-12-04T15:00")
        + box("until", "until", 18, "UTC")
        + box("error", "error contains", 18)
        + '<input type="hidden" name="count" value="1">'
        '<button type="submit">Count (dry run)</button></form>'
        '<p class="hint">A bulk replay runs every failed or released webhook delivery the filter '
        "matches (never a completed one, nor one that needs a person's review) as a job the "
        "ledger keeps: it goes on if this console stops, and one console runs it at a time.</p>"
    )


def _preview(view: pages.View, console: Console, wanted: bulk.Filter, found: bulk.Preview) -> Html:
    if found.count == 0:
        return pages.error("nothing matches: no delivery would run")
    rows = [
        [
            esc(r["provider"]),
            link(pages.receipt_href(view, r["provider"], r["webhook_id"]), r["webhook_id"]),
            badge(r["state"], r["state"]),
            esc(r["event_type"] or "-"),
            esc(r["attempts"]),
            when(float(r["claimed_at"])),
            f"<code>{esc(error_line(r['last_error']))}</code>",
        ]
        for r in found.sample
    ]
    capped = (
        f" (more match: a job runs at most {bulk.MAX_ITEMS:,}; narrow the time range)"
        if found.capped
        else ""
    )
    body = (
        f'<h2 class="count">{found.count:,} deliveries would run{esc(capped)}</h2>'
        f'<p class="hint">The first {len(found.sample)}:</p>'
        + table(
            ["provider", "webhook-id", "state", "type", "attempts", "claimed", "last error"],
            rows,
        )
    )
    if view.read_only:
        return body
    operator = (
        ""
        if view.actor is not None
        else '<label>Your name <input name="operator" required maxlength="100"></label>'
    )
    inner = (
        "".join(hidden(k, v) for k, v in wanted.query().items())
        + hidden("request", secrets.token_urlsafe(16))
        + operator
        + '<label>Why (recorded with the job) <input name="reason" required maxlength="2000" '
        'size="60"></label>'
        f"<label>Type the number of deliveries to run them ({found.count}) "
        '<input name="count" required inputmode="numeric" autocomplete="off"></label>'
        f'<p class="hint">At most {console.bulk_rate:g} a second; progress on the job\'s page, '
        "where it can be cancelled.</p>"
    )
    return body + form(view.root + "/bulk", view.csrf, inner, "Replay them", cls="confirm")


def _jobs(view: pages.View, rows: Sequence[Any]) -> Html:
    return table(
        ["job", "state", "progress", "by", "filter", "created"],
        [
            [
                link(url(view.root, "/bulk/job", {"id": r["id"]}), f"#{r['id']}"),
                badge(r["state"], _state_class(r["state"])),
                esc(f"{r['done']:,} / {r['total']:,}"),
                esc(r["actor"]),
                esc(_described(r["filter"])),
                when(float(r["created_at"])),
            ]
            for r in rows
        ],
        empty="no bulk replays yet",
    )


def _described(text: str) -> str:
    try:
        data = orjson.loads(text)
        return bulk.Filter(**data).describe()
    except (orjson.JSONDecodeError, TypeError):
        return "?"


def _state_class(state: str) -> str:
    return {"running": "in_flight", "done": "completed", "cancelled": "released"}.get(state, "")


def _job(view: pages.View, row: Mapping[str, Any], counts: Mapping[str, int]) -> Html:
    total, done = int(row["total"]), int(row["done"])
    percent = 100 * done // total if total else 100
    state = str(row["state"])
    runner = ""
    if state == "running":
        held = row["owner"] and float(row["lease_until"]) > float(row["now"])
        runner = (
            f"run by {esc(row['owner'])}"
            if held
            else "waiting for a console with handlers (or receiver replay --job) to take it"
        )
    facts = [
        ("State", badge(state, _state_class(state)) + f" {runner}"),
        (
            "Progress",
            f'<progress max="{total}" value="{done}"></progress> '
            f'<span class="done">{done:,} / {total:,}</span> ({percent} %)',
        ),
        ("Outcomes", esc(bulk.summary(counts))),
        ("Filter", esc(_described(row["filter"]))),
        ("By", esc(row["actor"])),
        ("Why", esc(row["reason"])),
        ("Rate", esc(f"{float(row['rate']):g} a second")),
        ("Created", when(float(row["created_at"]))),
        ("Ended", when(None if row["finished_at"] is None else float(row["finished_at"]))),
    ]
    body = '<dl class="job">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    if state == "running" and not view.read_only:
        body += form(
            view.root + "/bulk/cancel",
            view.csrf,
            '<p class="hint">Stops between two deliveries; the ones not run yet stay as they '
            "are.</p>",
            "Cancel this bulk replay",
            cls="action",
            values={"id": row["id"]},
        )
    return body
