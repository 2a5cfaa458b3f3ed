"""The console as an ASGI app: its routes, who may use them, and the pages they render.

``Console(store)`` (or ``rx.console()``, which adds the Receiver's handlers for replays and its
providers' configured windows) is mounted like any ASGI app, or served alone by ``receiver
console``. Every GET only reads; every state change is a POST with its form's CSRF token,
refused in read-only mode, and answered with a redirect to the page that shows its result.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .._exceptions import ConfigurationError, ReceiverError, SchemaOutdated, StoreUnavailable
from .._ledger import receipts as ledger
from .._ledger.receipts import Key
from .._store.base import Store
from .._store.migrations import missing
from .._store.url import store_from_url
from .._values import names
from . import (
    actions,
    auth,
    bulk,
    bulk_pages,
    live,
    operate,
    overview,
    pages,
    queries,
    receipt,
    sessions,
)
from .forms import BadRequest, read_form
from .html import Html, esc, link, render, static

_SINCE = {"1h": 3600, "24h": 86400, "7d": 7 * 86400}

Actor = Callable[[Request], str | None]


class Console:
    """The operator console, an ASGI app.

    - ``token``: require it (a session after signing in); without one the console trusts
      whoever the host application lets reach it.
    - ``operators``: tokens of named operators instead (or as well): mappings with ``name``,
      ``role`` (``operator`` or ``read-only``) and ``token`` or ``token_sha256``; the audit
      records each action under its operator's name.
    - ``read_only``: show everything, change nothing.
    - ``show_payloads``: show payloads and stored answers (redacted); hidden by default.
    - ``actor``: who is acting, from a request of the host app (default: the user set by
      Starlette's AuthenticationMiddleware, else a name typed into each form).
    - ``redact_fields``: more JSON field names whose values are never shown.
    - ``bulk_rate``: deliveries a second a bulk replay confirmed here runs at.
    """

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        receiver: actions.ReceiverLike | None = None,
        token: str | None = None,
        operators: Sequence[Mapping[str, str]] = (),
        read_only: bool = False,
        show_payloads: bool = False,
        actor: Actor | None = None,
        redact_fields: Sequence[str] = (),
        registry: CollectorRegistry | None = None,
        bulk_rate: float = bulk.DEFAULT_RATE,
    ) -> None:
        if store is None and receiver is None:
            raise ReceiverError("Console needs a store (or a receiver)")
        if isinstance(store, str):
            store = store_from_url(store)
        self.store: Store = store if store is not None else receiver.store  # type: ignore[union-attr]
        self.receiver = receiver
        self.auth = None
        self.signin = None
        if token is not None or operators:
            self.auth = auth.TokenAuth(token, operators)
            self.signin = sessions.SignIn(self.store, self.auth)
        self.read_only = read_only
        self.show_payloads = show_payloads
        self.actor = actor
        self.redact_fields = names(
            redact_fields, "redact_fields= takes a list of field names, such as ['ssn']"
        )
        number = not isinstance(bulk_rate, bool) and isinstance(bulk_rate, int | float)
        if not (number and 0 < bulk_rate <= 1000):  # NaN fails the comparison too
            raise ConfigurationError(
                f"bulk_rate is between 0 and 1000 deliveries a second, not {bulk_rate!r}"
            )
        self.bulk_rate = float(bulk_rate)
        self.runs = bulk.Host(self.store, None if receiver is None else receiver.replay)
        metrics = receiver.metrics if receiver is not None else None
        if registry is None and metrics is not None:
            registry = metrics.registry
        #: Where the executor's keys-per-turn counters are (the receiver's metrics, by default).
        self.registry = registry
        self._checked = False
        self._check_lock = asyncio.Lock()
        self.live = live.Live(self)
        get, post, both = ["GET"], ["POST"], ["GET", "POST"]
        page = self._page
        self._app = Starlette(
            routes=[
                Route("/", page(self._overview), methods=get),
                Route("/receipts", page(self._list("webhook")), methods=get),
                Route("/actions", page(self._list("action")), methods=get),
                Route("/keys", page(self._list("idem")), methods=get),
                Route("/attention", page(self._attention), methods=get),
                Route("/receipt", page(self._receipt), methods=get),
                Route("/rerun", page(operate.rerun(self)), methods=both),
                Route("/replay", page(operate.replay(self)), methods=post),
                Route("/resolve", page(operate.settle(self, "resolve")), methods=post),
                Route("/fail", page(operate.settle(self, "fail")), methods=post),
                Route("/audit", page(self._audit), methods=get),
                Route("/live", page(self.live.page()), methods=get),
                Route("/live/events", page(self.live.events()), methods=get),
                Route("/live.js", live.script, methods=get),
                Route("/bulk", page(bulk_pages.page(self)), methods=both),
                Route("/bulk/job", page(bulk_pages.job_page(self)), methods=get),
                Route("/bulk/cancel", page(bulk_pages.cancel(self)), methods=post),
                Route("/sessions", page(sessions.listing(self.store, self.auth)), methods=get),
                Route(
                    "/sessions/end",
                    page(sessions.end_all_route(self.store, self.auth)),
                    methods=post,
                ),
                Route("/login", self._login, methods=both),
                Route("/logout", self._logout, methods=post),
                Route("/console.css", self._css, methods=get),
            ],
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._serve_lifespan(receive, send)
            return
        await self._app(scope, receive, send)

    async def _serve_lifespan(self, receive: Receive, send: Send) -> None:
        """:meth:`lifespan` served: a store down or not migrated fails the start-up with its
        one-line reason (Starlette's would be a traceback)."""
        await receive()  # lifespan.startup
        context = self.lifespan()
        try:
            await context.__aenter__()
        except (StoreUnavailable, SchemaOutdated) as exc:
            return await send({"type": "lifespan.startup.failed", "message": f"console: {exc}"})
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        await context.__aexit__(None, None, None)
        await send({"type": "lifespan.shutdown.complete"})

    @asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """Served alone: open the store for the console's life, refusing an older schema."""
        async with self.store:
            await self._check_schema()
            self.runs.start()
            try:
                yield
            finally:
                await self.runs.stop()

    def start_runner(self) -> bool:
        """Run bulk replays in this process; False without handlers (bulk.Host)."""
        return self.runs.start()

    async def _check_schema(self) -> None:
        async with self._check_lock:
            if self._checked:
                return
            lacking = await missing(self.store)
            if lacking:
                raise SchemaOutdated(
                    f"the console needs the ledger's migration(s) {', '.join(lacking)}: run "
                    f"`receiver migrate --store {self.store.url}`"
                )
            self._checked = True

    # -- the frame of every page ---------------------------------------------------------------

    async def _who(self, request: Request) -> tuple[bool, str | None, str]:
        """(allowed, actor, role): the signed-in operator with tokens; else the host's user.
        The session found (if any) is kept on the request, with its notice."""
        session = await sessions.lookup(self.store, request.cookies.get(auth.SESSION_COOKIE))
        if self.auth is not None:
            credential = None
            if session is not None and session.role != sessions.BROWSER:
                credential = self.auth.current(session.credential)
            if session is None or credential is None:
                return False, None, ""
            request.state.session = session
            return True, session.operator, credential.role
        if session is not None and session.role == sessions.BROWSER:
            request.state.session = session
        if self.actor is not None:
            return True, self.actor(request), "operator"
        user = request.scope.get("user")
        if user is not None and getattr(user, "is_authenticated", False):
            return True, str(getattr(user, "display_name", "") or "") or None, "operator"
        return True, None, "operator"

    async def allowed(self, request: Request) -> bool:
        """Whether this request's session still lets it in (an open event stream asks)."""
        return (await self._who(request))[0]

    def _page(self, handler: operate.Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                await self._check_schema()
                allowed, actor, role = await self._who(request)
            except (StoreUnavailable, SchemaOutdated) as exc:
                message = f"The ledger is unavailable ({type(exc).__name__}): {exc}"
                response: Response = HTMLResponse(esc(message), 503)
                auth.set_cookies(request, response)
                return response
            if not allowed:
                assert self.signin is not None
                response = self.signin.page(request, "", 401)
            else:
                view = pages.View(
                    root=request.scope.get("root_path", "").rstrip("/"),
                    csrf=auth.csrf_token(request),
                    actor=actor,
                    read_only=self.read_only or role == "read-only",
                    show_payloads=self.show_payloads,
                    can_replay=self.receiver is not None,
                    redact_fields=self.redact_fields,
                )
                response = await self._answer(request, view, handler)
            auth.set_cookies(request, response)
            return response

        return endpoint

    async def _answer(
        self, request: Request, view: pages.View, handler: operate.Handler
    ) -> Response:
        try:
            if request.method == "POST":
                refusal = await self._refuse_post(request, view)
                if refusal is not None:
                    return await self._frame(request, view, "Refused", pages.error(refusal), 403)
            if any("\x00" in v for v in request.query_params.values()):
                raise BadRequest("a query parameter holds a NUL character, which no receipt has")
            result = await handler(request, view)
            if isinstance(result, Response):
                return result
            title, body = result
            return await self._frame(request, view, title, body)
        except actions.ActionRefused as exc:
            return await self._frame(request, view, "Not done", pages.error(str(exc)), 409)
        except (BadRequest, queries.BadCursor) as exc:
            return await self._frame(request, view, "Bad request", pages.error(str(exc)), 400)
        except (StoreUnavailable, SchemaOutdated) as exc:
            message = f"The ledger is unavailable ({type(exc).__name__}): {exc}"
            return HTMLResponse(esc(message), 503)

    async def _refuse_post(self, request: Request, view: pages.View) -> str | None:
        if view.read_only:
            who = "this console is" if self.read_only else "you are signed in"
            return f"{who} read-only: nothing can be changed from it"
        form = await read_form(request)
        request.state.form = form
        return auth.csrf_refusal(request, form)

    async def redirect(self, request: Request, href: str, notice: str) -> Response:
        """Answer an action: to the page that shows its result, whose notice waits in the
        session (a console without sign-in makes this browser a notices-only session)."""
        response = RedirectResponse(href, 303)
        session: sessions.Session | None = getattr(request.state, "session", None)
        if session is not None and await sessions.notify(self.store, session.id, notice):
            return response
        if self.auth is None:
            secret = await sessions.start(self.store, "", sessions.BROWSER, "", notice)
            sessions.set_cookie(request, response, secret)
        return response

    async def _frame(
        self, request: Request, view: pages.View, title: str, body: Html, status: int = 200
    ) -> HTMLResponse:
        nav_items = [
            ("/", "Overview"),
            ("/live", "Live"),
            ("/receipts", "Receipts"),
            ("/attention", "Needs attention"),
            ("/actions", "Agent actions"),
            ("/keys", "Idempotency-Keys"),
            ("/bulk", "Bulk replay"),
            ("/audit", "Audit"),
        ]
        here = request.url.path.removeprefix(view.root) or "/"
        nav = "".join(
            link(view.root + path, label, cls="current" if path == here else "")
            for path, label in nav_items
        )
        who = esc(view.actor or "")
        if self.auth is not None:
            who = (
                f"signed in as {who} "
                + link(view.root + "/sessions", "sessions")
                + (
                    f'<form method="post" action="{esc(view.root)}/logout">'
                    f'<input type="hidden" name="csrf" value="{esc(view.csrf)}">'
                    '<button type="submit">Sign out</button></form>'
                )
            )
        elif view.actor:
            who = f"{who} (from the host app)"
        if view.read_only:
            who += ' <span class="badge">read-only</span>'
        session: sessions.Session | None = getattr(request.state, "session", None)
        message = None if session is None else await sessions.take_notice(self.store, session)
        notice = f'<div class="notice">{esc(message)}</div>' if message else ""
        footer = esc(f"ledger: {self.store.url}") + (
            "" if self.receiver is not None else esc(" · no handlers: replays are off")
        )
        page = render(
            "layout.html",
            head=getattr(request.state, "head", ""),
            title=esc(title),
            root=esc(view.root),
            nav=nav,
            who=who,
            notice=notice,
            body=body,
            footer=footer,
        )
        return HTMLResponse(page, status)

    # -- pages ---------------------------------------------------------------------------------

    def now(self) -> float:
        return self._now()

    def _now(self) -> float:
        return self.store.clock() if self.store.clock is not None else time.time()

    async def _overview(self, request: Request, view: pages.View) -> tuple[str, Html]:
        chart_range = request.query_params.get("range", "24h")
        if chart_range not in overview.RANGES:
            chart_range = "24h"
        configured: dict[str, float] = {}
        if self.receiver is not None:
            configured = {n: p.window.window for n, p in self.receiver.providers.items()}
        async with self.store.acquire() as conn:
            data = await overview.collect(conn, self._now(), configured, chart_range)
        admission = getattr(self.receiver, "admission", None)
        if admission is not None:
            data.shed = admission.shed_rate()
        return "Overview", pages.overview(view, data, chart_range)

    def _list(
        self, kind: str
    ) -> Callable[[Request, pages.View], Awaitable[Response | tuple[str, Html]]]:
        async def handler(request: Request, view: pages.View) -> Response | tuple[str, Html]:
            q = {k: v for k, v in request.query_params.items() if v}
            since = _SINCE.get(q.get("since", ""))
            prefix = ""
            if kind == "idem" and q.get("principal"):
                prefix = orjson.dumps([q["principal"]]).decode()[:-1] + ","
            elif kind == "action" and q.get("scope"):
                prefix = urllib.parse.quote(q["scope"], safe="") + ":"
            filters = queries.Filters(
                kind=kind,
                provider=q.get("provider", ""),
                state=q.get("state", ""),
                event_type=q.get("type", ""),
                prefix=prefix,
                since=None if since is None else self._now() - since,
            )
            async with self.store.acquire() as conn:
                known = await queries.providers(conn)
                listed = [p for p in known if queries.kind_of(p) == kind]
                if q.get("id"):
                    return await self._search(conn, view, kind, listed, q)
                cursor = queries.Cursor.decode(q.get("after", ""), self.store.dialect)
                page = await queries.list_receipts(conn, known, filters, cursor, self.store.now())
            panel = ""
            if kind == "action":
                panel = pages.turn_panel(overview.turns(self.registry))
            body = pages.receipts(view, filters, page, listed, q, panel)
            if kind == "webhook" and not view.read_only:
                body = bulk_pages.filter_link(view, q) + body
            return pages.KIND_TITLES[kind], body

        return handler

    async def _search(
        self, conn: Any, view: pages.View, kind: str, listed: list[str], q: Mapping[str, str]
    ) -> Response | tuple[str, Html]:
        """An exact id: one primary-key lookup per provider of the kind."""
        wanted = q["id"]
        if kind == "idem":
            if not q.get("principal"):
                return pages.KIND_TITLES[kind], pages.error(
                    "an Idempotency-Key is scoped to its principal: give the principal too"
                )
            wanted = orjson.dumps([q["principal"], wanted]).decode()
        names = [q["provider"]] if q.get("provider") else listed
        found = [p for p in names if await ledger.lookup(conn, Key(p, wanted), self.store.now())]
        if len(found) == 1:
            return RedirectResponse(pages.receipt_href(view, found[0], wanted), 303)
        if not found:
            return pages.KIND_TITLES[kind], pages.error(f"no receipt with the id {q['id']!r}")
        links = "".join(
            f"<li>{link(pages.receipt_href(view, p, wanted), f'{p}/{wanted}')}</li>" for p in found
        )
        return pages.KIND_TITLES[kind], f"<ul>{links}</ul>"

    async def _attention(self, request: Request, view: pages.View) -> tuple[str, Html]:
        which = request.query_params.get("list", "failed")
        if which not in pages.ATTENTION:
            which = "failed"
        provider = request.query_params.get("provider", "")
        cursor = queries.Cursor.decode(request.query_params.get("after", ""), self.store.dialect)
        async with self.store.acquire() as conn:
            known = await queries.providers(conn)
            page = await queries.attention(conn, which, provider, cursor, self.store.now())
        body = pages.attention(view, which, provider, page, known)
        if which in ("failed", "released") and not view.read_only:
            body = bulk_pages.filter_link(view, {"list": which, "provider": provider}) + body
        return "Needs attention", body

    async def lookup(self, request: Request) -> tuple[ledger.Receipt, list[Any], list[Any]]:
        provider = request.query_params.get("provider", "")
        webhook_id = request.query_params.get("id", "")
        if not provider or not webhook_id:
            raise BadRequest("name the receipt: ?provider=...&id=...")
        async with self.store.acquire() as conn:
            found = await ledger.lookup(conn, Key(provider, webhook_id), self.store.now())
            if found is None:
                raise actions.ActionRefused(
                    f"no receipt for {provider}/{webhook_id}: never received, or expired"
                )
            attempts = await conn.run_all("list_attempts", provider, webhook_id)
            audit = await queries.audit_of(conn, provider, webhook_id)
        return found, attempts, audit

    async def _receipt(self, request: Request, view: pages.View) -> tuple[str, Html]:
        found, attempts, audit = await self.lookup(request)
        title = f"{found.key.provider} / {found.key.webhook_id}"
        async with self.store.acquire() as conn:
            same = await receipt.same_content(conn, found)
        return title, receipt.page(view, found, attempts, audit, same)

    async def _audit(self, request: Request, view: pages.View) -> tuple[str, Html]:
        before = queries.audit_cursor(request.query_params.get("before", ""))
        async with self.store.acquire() as conn:
            rows = await queries.audit(conn, before)
        next_id = rows[-1].id if len(rows) == queries.PAGE else None
        return "Audit: operator actions", pages.audit(view, rows, next_id)

    async def _login(self, request: Request) -> Response:
        if self.signin is None:
            return HTMLResponse("the console trusts its host application here", 404)
        return await self.signin.login(request, self._check_schema)

    async def _logout(self, request: Request) -> Response:
        if self.signin is None:
            return HTMLResponse("the console trusts its host application here", 404)
        return await self.signin.logout(request)

    async def _css(self, request: Request) -> Response:
        return Response(
            static("console.css"),
            media_type="text/css",
            headers={"cache-control": "max-age=3600"},
        )
