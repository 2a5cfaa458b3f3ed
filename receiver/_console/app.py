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
from typing import Any, Protocol

import orjson
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .._exceptions import ReceiverError, SchemaOutdated, StoreUnavailable
from .._ledger import receipts as ledger
from .._ledger.receipts import Key
from .._ops.metrics import Metrics
from .._store.base import Store
from .._store.migrations import missing
from .._store.url import store_from_url
from . import actions, auth, overview, pages, queries, receipt
from .html import Html, esc, link, render, static, url

#: The largest form accepted (a re-run's pasted payload is the big one).
MAX_FORM = 2 * 1024 * 1024
_SINCE = {"1h": 3600, "24h": 86400, "7d": 7 * 86400}

Actor = Callable[[Request], str | None]


class WindowLike(Protocol):
    @property
    def window(self) -> float: ...


class ProviderLike(Protocol):
    @property
    def window(self) -> WindowLike: ...


class ReceiverLike(Protocol):
    """What the console uses of a :class:`~receiver.Receiver` (named structurally, so that the
    console does not import the entry point that mounts it)."""

    @property
    def store(self) -> Store: ...
    @property
    def providers(self) -> Mapping[str, ProviderLike]: ...
    @property
    def metrics(self) -> Metrics | None: ...
    async def replay(self, provider: str, webhook_id: str) -> actions.ReplyLike: ...


class Console:
    """The operator console, an ASGI app.

    - ``token``: require it (a session after signing in); without one the console trusts
      whoever the host application lets reach it.
    - ``read_only``: show everything, change nothing.
    - ``show_payloads``: show payloads and stored answers (redacted); hidden by default.
    - ``actor``: who is acting, from a request of the host app (default: the user set by
      Starlette's AuthenticationMiddleware, else a name typed into each form).
    - ``redact_fields``: more JSON field names whose values are never shown.
    """

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        receiver: ReceiverLike | None = None,
        token: str | None = None,
        read_only: bool = False,
        show_payloads: bool = False,
        actor: Actor | None = None,
        redact_fields: Sequence[str] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        if store is None and receiver is None:
            raise ReceiverError("Console needs a store (or a receiver)")
        if isinstance(store, str):
            store = store_from_url(store)
        self.store: Store = store if store is not None else receiver.store  # type: ignore[union-attr]
        self.receiver = receiver
        self.auth = None if token is None else auth.TokenAuth(token)
        self.read_only = read_only
        self.show_payloads = show_payloads
        self.actor = actor
        self.redact_fields = tuple(redact_fields)
        metrics = receiver.metrics if receiver is not None else None
        if registry is None and metrics is not None:
            registry = metrics.registry
        #: Where the executor's keys-per-turn counters are (the receiver's metrics, by default).
        self.registry = registry
        self._checked = False
        self._check_lock = asyncio.Lock()
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
                Route("/rerun", page(self._rerun), methods=both),
                Route("/replay", page(self._replay), methods=post),
                Route("/resolve", page(self._settle("resolve")), methods=post),
                Route("/fail", page(self._settle("fail")), methods=post),
                Route("/audit", page(self._audit), methods=get),
                Route("/login", self._login, methods=both),
                Route("/logout", self._logout, methods=post),
                Route("/console.css", self._css, methods=get),
            ],
            lifespan=self.lifespan,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    @asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """Served alone: open the store for the console's life, refusing an older schema."""
        async with self.store:
            await self._check_schema()
            yield

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

    def _who(self, request: Request) -> tuple[bool, str | None]:
        """(allowed, actor): the signed-in operator with a token; else the host's user."""
        if self.auth is not None:
            name = self.auth.session(request.cookies.get(auth.SESSION_COOKIE), time.time())
            return name is not None, name
        if self.actor is not None:
            return True, self.actor(request)
        user = request.scope.get("user")
        if user is not None and getattr(user, "is_authenticated", False):
            return True, str(getattr(user, "display_name", "") or "") or None
        return True, None

    def _page(
        self, handler: Callable[[Request, pages.View], Awaitable[Response | tuple[str, Html]]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            allowed, actor = self._who(request)
            if not allowed:
                response: Response = self._login_page(request, "", 401)
            else:
                view = pages.View(
                    root=request.scope.get("root_path", "").rstrip("/"),
                    csrf=auth.csrf_token(request),
                    actor=actor,
                    read_only=self.read_only,
                    show_payloads=self.show_payloads,
                    can_replay=self.receiver is not None,
                    redact_fields=self.redact_fields,
                )
                response = await self._answer(request, view, handler)
            auth.set_cookies(request, response)
            return response

        return endpoint

    async def _answer(
        self,
        request: Request,
        view: pages.View,
        handler: Callable[[Request, pages.View], Awaitable[Response | tuple[str, Html]]],
    ) -> Response:
        try:
            if request.method == "POST":
                refusal = await self._refuse_post(request)
                if refusal is not None:
                    return self._frame(request, view, "Refused", pages.error(refusal), 403)
            if any("\x00" in v for v in request.query_params.values()):
                raise _BadRequest("a query parameter holds a NUL character, which no receipt has")
            await self._check_schema()
            result = await handler(request, view)
        except actions.ActionRefused as exc:
            return self._frame(request, view, "Not done", pages.error(str(exc)), 409)
        except (_BadRequest, queries.BadCursor) as exc:
            return self._frame(request, view, "Bad request", pages.error(str(exc)), 400)
        except (StoreUnavailable, SchemaOutdated) as exc:
            message = f"The ledger is unavailable ({type(exc).__name__}): {exc}"
            return self._frame(request, view, "Unavailable", pages.error(message), 503)
        if isinstance(result, Response):
            return result
        title, body = result
        return self._frame(request, view, title, body)

    async def _refuse_post(self, request: Request) -> str | None:
        if self.read_only:
            return "this console is read-only: nothing can be changed from it"
        form = await _form(request)
        request.state.form = form
        return auth.csrf_refusal(request, form)

    def _frame(
        self, request: Request, view: pages.View, title: str, body: Html, status: int = 200
    ) -> HTMLResponse:
        nav_items = [
            ("/", "Overview"),
            ("/receipts", "Receipts"),
            ("/attention", "Needs attention"),
            ("/actions", "Agent actions"),
            ("/keys", "Idempotency-Keys"),
            ("/audit", "Audit"),
        ]
        here = request.url.path.removeprefix(view.root) or "/"
        nav = "".join(
            link(view.root + path, label, cls="current" if path == here else "")
            for path, label in nav_items
        )
        who = esc(view.actor or "")
        if self.auth is not None:
            who = f"signed in as {who} " + (
                f'<form method="post" action="{esc(view.root)}/logout">'
                f'<input type="hidden" name="csrf" value="{esc(view.csrf)}">'
                '<button type="submit">Sign out</button></form>'
            )
        elif view.actor:
            who = f"{who} (from the host app)"
        if self.read_only:
            who += ' <span class="badge">read-only</span>'
        message = request.query_params.get("msg", "")
        notice = f'<div class="notice">{esc(message)}</div>' if message else ""
        footer = esc(f"ledger: {self.store.url}") + (
            "" if self.receiver is not None else esc(" · no handlers: replays are off")
        )
        page = render(
            "layout.html",
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
                panel = pages.turn_panel(self._turns())
            body = pages.receipts(view, filters, page, listed, q, panel)
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

    def _turns(self) -> dict[str, tuple[float, float, float]]:
        """Per tool: (turns, keys over turns, most keys in a recent turn), from the metrics."""
        if self.registry is None:
            return {}
        found: dict[str, list[float]] = {}
        names = {
            "receiver_action_turns_total": 0,
            "receiver_action_turn_keys_total": 1,
            "receiver_action_max_keys_per_turn": 2,
        }
        for metric in self.registry.collect():
            for sample in metric.samples:
                index = names.get(sample.name)
                if index is not None and "action" in sample.labels:
                    found.setdefault(sample.labels["action"], [0.0, 0.0, 0.0])[index] = float(
                        sample.value
                    )
        return {tool: (v[0], v[1], v[2]) for tool, v in found.items()}

    async def _attention(self, request: Request, view: pages.View) -> tuple[str, Html]:
        which = request.query_params.get("list", "failed")
        if which not in pages.ATTENTION:
            which = "failed"
        provider = request.query_params.get("provider", "")
        cursor = queries.Cursor.decode(request.query_params.get("after", ""), self.store.dialect)
        async with self.store.acquire() as conn:
            known = await queries.providers(conn)
            page = await queries.attention(conn, which, provider, cursor, self.store.now())
        return "Needs attention", pages.attention(view, which, provider, page, known)

    async def _lookup(self, request: Request) -> tuple[ledger.Receipt, list[Any], list[Any]]:
        provider = request.query_params.get("provider", "")
        webhook_id = request.query_params.get("id", "")
        if not provider or not webhook_id:
            raise _BadRequest("name the receipt: ?provider=...&id=...")
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
        found, attempts, audit = await self._lookup(request)
        title = f"{found.key.provider} / {found.key.webhook_id}"
        return title, receipt.page(view, found, attempts, audit)

    async def _rerun(self, request: Request, view: pages.View) -> Response | tuple[str, Html]:
        if request.method == "GET":
            if self.read_only or self.receiver is None:
                raise actions.ActionRefused("re-runs need a console with handlers, not read-only")
            found, _, _ = await self._lookup(request)
            return "Run a completed delivery again", receipt.rerun(view, found)
        form, key, fence, actor = self._action_input(request, view)
        done = await actions.rerun(
            self.store,
            self._replayer(),
            actor,
            key,
            fence,
            form.get("reason", ""),
            form.get("payload", "").encode(),
            form.get("confirm", ""),
        )
        return self._done(view, key, done.notice("rerun"))

    async def _replay(self, request: Request, view: pages.View) -> Response:
        form, key, fence, actor = self._action_input(request, view)
        done = await actions.replay(
            self.store, self._replayer(), actor, key, fence, form.get("reason", "")
        )
        return self._done(view, key, done.notice("replay"))

    def _settle(
        self, decision: str
    ) -> Callable[[Request, pages.View], Awaitable[Response | tuple[str, Html]]]:
        async def handler(request: Request, view: pages.View) -> Response:
            form, key, fence, actor = self._action_input(request, view)
            done = await actions.settle(
                self.store,
                actor,
                key,
                fence,
                decision,
                form.get("reason", ""),
                form.get("answer", ""),
            )
            return self._done(view, key, f"{done.outcome.capitalize()}: {done.detail}")

        return handler

    def _replayer(self) -> actions.Replayer:
        if self.receiver is None:
            raise actions.ActionRefused(
                "this console has no handlers (started with a store only): start it with "
                "--app, or run `receiver replay`"
            )
        return self.receiver.replay

    def _action_input(
        self, request: Request, view: pages.View
    ) -> tuple[dict[str, str], Key, int, str]:
        form: dict[str, str] = request.state.form
        provider, webhook_id = form.get("provider", ""), form.get("id", "")
        if not provider or not webhook_id:
            raise _BadRequest("the form names no receipt")
        try:
            fence = int(form.get("fence", ""))
        except ValueError:
            raise _BadRequest("the form carries no fence") from None
        actor = view.actor
        if actor is None:
            typed = " ".join(form.get("operator", "").split())[:100]
            if not typed:
                raise _BadRequest("say who you are: your name is recorded with the action")
            actor = f"{typed} (as typed)"
        return form, Key(provider, webhook_id), fence, actor

    def _done(self, view: pages.View, key: Key, message: str) -> Response:
        href = url(
            view.root, "/receipt", {"provider": key.provider, "id": key.webhook_id, "msg": message}
        )
        return RedirectResponse(href, 303)

    async def _audit(self, request: Request, view: pages.View) -> tuple[str, Html]:
        before = queries.audit_cursor(request.query_params.get("before", ""))
        async with self.store.acquire() as conn:
            rows = await queries.audit(conn, before)
        next_id = rows[-1].id if len(rows) == queries.PAGE else None
        return "Audit: operator actions", pages.audit(view, rows, next_id)

    # -- signing in ----------------------------------------------------------------------------

    def _login_page(
        self, request: Request, notice: str, status: int, target: str = ""
    ) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        if self.auth is None:
            return HTMLResponse("the console trusts its host application here", 404)
        if not target:
            here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            login = request.url.path.removeprefix(root) in ("/login", "")
            target = root + "/" if login else here
        text = "You must sign in with the console's token." if status == 401 else notice
        page = render(
            "login.html",
            root=esc(root),
            csrf=esc(auth.csrf_token(request)),
            next=esc(target),
            notice=f'<div class="notice error">{esc(notice or text)}</div>' if text else "",
        )
        return HTMLResponse(page, status)

    async def _login(self, request: Request) -> Response:
        if request.method == "GET" or self.auth is None:
            response: Response = self._login_page(request, "", 200)
            auth.set_cookies(request, response)
            return response
        try:
            form = await _form(request)
        except _BadRequest:
            form = {}
        refusal = auth.csrf_refusal(request, form)
        name = " ".join(form.get("name", "").split())[:100]
        if refusal is None and not name:
            refusal = "give your name: it is recorded with every action you take"
        if refusal is None and not self.auth.check(form.get("token", "")):
            await asyncio.sleep(0.5)  # a guess costs time
            refusal = "wrong token"
        root = request.scope.get("root_path", "").rstrip("/")
        target = form.get("next", "")
        if not target.startswith(root + "/") or target.startswith("//"):
            target = root + "/"
        if refusal is not None:
            status = 401 if refusal == "wrong token" else 403
            response = self._login_page(request, refusal, status, target)
            auth.set_cookies(request, response)
            return response
        response = RedirectResponse(target, 303)
        response.set_cookie(
            auth.SESSION_COOKIE,
            self.auth.issue(name, time.time()),
            max_age=auth.SESSION_SECONDS,
            path=auth.cookie_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        auth.set_cookies(request, response)
        return response

    async def _logout(self, request: Request) -> Response:
        try:
            form = await _form(request)
        except _BadRequest:
            form = {}
        root = request.scope.get("root_path", "").rstrip("/")
        if auth.csrf_refusal(request, form) is not None:
            return HTMLResponse("refused: no valid CSRF token", 403)
        response = RedirectResponse(root + "/login", 303)
        response.delete_cookie(auth.SESSION_COOKIE, path=auth.cookie_path(request))
        return response

    async def _css(self, request: Request) -> Response:
        return Response(
            static("console.css"),
            media_type="text/css",
            headers={"cache-control": "max-age=3600"},
        )


class _BadRequest(ReceiverError):
    """The request names nothing the console can act on."""


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form, bounded in size (no multipart: the console's forms never upload)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise _BadRequest(f"the form is larger than {MAX_FORM} bytes")
    try:
        pairs = urllib.parse.parse_qsl(
            body.decode(), keep_blank_values=True, max_num_fields=50, strict_parsing=False
        )
    except (UnicodeDecodeError, ValueError):
        raise _BadRequest("the form is not valid urlencoded UTF-8") from None
    if any("\x00" in v for _, v in pairs):
        raise _BadRequest("a form field holds a NUL character, which the ledger cannot store")
    return dict(pairs)
