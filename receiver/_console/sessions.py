"""Console sessions, kept in the ledger: signing in and out, expiry, and the page notices.

Signing in gives the browser a cookie holding a random secret; the ledger keeps a row under the
secret's sha256 (a copy of the ledger gives no cookie) with the operator's name, role and the
fingerprint of the token used. Every page looks the row up: signing out deletes it, expiry
makes it dead, and ending all sessions deletes every row, so a copy of the cookie is worth
nothing afterwards. A token removed or changed in the configuration ends the sessions it
opened (their fingerprint is no longer known), and a role changed there applies at once.

The notice a page shows after an action (``Replayed: executed``) travels in the same row, set
by the action and cleared when shown, never in a URL: a crafted link cannot make the console
say something it did not do. A console without sign-in (mounted behind its host's
authentication) keeps a notices-only row per browser, made by its first action.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from .._exceptions import SchemaOutdated, StoreUnavailable
from .._store.base import Store
from . import auth, pages
from .actions import ActionRefused
from .forms import BadRequest, read_form
from .html import Html, esc, form, render, table, when
from .operate import Handler

#: The role of a notices-only row (a console without sign-in).
BROWSER = "browser"
#: Expired rows deleted per sign-in (the table stays small without a sweeper of its own).
SWEEP = 100


@dataclass(frozen=True, slots=True)
class Session:
    id: str  # the sha256 of the cookie's secret
    operator: str
    role: str
    credential: str
    notice: str | None


def _id(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def start(
    store: Store, operator: str, role: str, credential: str, notice: str | None = None
) -> str:
    """A new session; the cookie's value (its secret)."""
    secret = secrets.token_urlsafe(32)
    async with store.acquire() as conn:
        await conn.run("console_session_sweep", store.now(), SWEEP)
        await conn.run(
            "console_session_add",
            _id(secret),
            operator,
            role,
            credential,
            store.now(),
            float(auth.SESSION_SECONDS),
            notice,
        )
    return secret


async def lookup(store: Store, cookie: str | None) -> Session | None:
    """The live session of this cookie, or None (missing, unknown, ended or expired)."""
    if not cookie or len(cookie) > 100:
        return None
    session_id = _id(cookie)
    async with store.acquire() as conn:
        row = await conn.run("console_session_get", session_id, store.now())
    if row is None:
        return None
    return Session(session_id, row["operator"], row["role"], row["credential"], row["notice"])


async def take_notice(store: Store, session: Session) -> str | None:
    """The notice waiting for this session's page, cleared as it is shown."""
    if session.notice is None:
        return None
    async with store.acquire() as conn:
        await conn.run("console_session_shown", session.id, session.notice)
    return session.notice


async def notify(store: Store, session_id: str, notice: str) -> bool:
    """Leave a notice for the session's next page; False if the session ended meanwhile."""
    async with store.acquire() as conn:
        return await conn.run("console_session_notice", session_id, notice, store.now()) is not None


async def end(store: Store, cookie: str | None) -> None:
    if cookie and len(cookie) <= 100:
        async with store.acquire() as conn:
            await conn.run("console_session_end", _id(cookie))


async def end_all(store: Store, actor: str, where: str) -> int:
    """End every console session (every operator signs in again); how many there were. One
    audit row says who did it, and from where."""
    async with store.acquire() as conn, conn.transaction():
        ended = len(await conn.run_all("console_session_end_all"))
        row = await conn.run(
            "console_audit_add",
            store.now(),
            actor,
            "end sessions",
            "*",
            "sessions",
            None,
            f"every console session ended from {where}",
            "done",
        )
        assert row is not None
        await conn.run("console_audit_done", row["id"], "done", f"{ended} session(s) ended")
    return ended


async def listed(store: Store, limit: int = 200) -> list[tuple[str, str, float, float]]:
    """The live signed-in sessions: (operator, role, created at, expires at), newest first."""
    async with store.acquire() as conn:
        rows = await conn.run_all("console_session_list", store.now(), limit)
    return [
        (r["operator"], r["role"], float(r["created_at"]), float(r["expires_at"])) for r in rows
    ]


def set_cookie(request: Request, response: Response, secret: str) -> None:
    response.set_cookie(
        auth.SESSION_COOKIE,
        secret,
        max_age=auth.SESSION_SECONDS,
        path=auth.cookie_path(request),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def listing(store: Store, tokens: auth.TokenAuth | None) -> Handler:
    """The live sessions, and the button that ends them all."""

    async def handler(request: Request, view: pages.View) -> tuple[str, Html]:
        if tokens is None:
            raise ActionRefused("this console has no sign-in: its host application's")
        return "Sessions", page(view, await listed(store))

    return handler


def end_all_route(store: Store, tokens: auth.TokenAuth | None) -> Handler:
    """End every session, this one too: every operator signs in again."""

    async def handler(request: Request, view: pages.View) -> Response:
        if tokens is None:
            raise ActionRefused("this console has no sign-in: its host application's")
        await end_all(store, view.actor or "?", "the console's Sessions page")
        return RedirectResponse(view.root + "/login", 303)

    return handler


def page(view: pages.View, live: list[tuple[str, str, float, float]]) -> Html:
    rows = [
        [esc(name), esc(role), when(created), when(expires)]
        for name, role, created, expires in live
    ]
    body = table(["operator", "role", "signed in", "expires"], rows, empty="no live sessions")
    if not view.read_only:
        body += form(
            view.root + "/sessions/end",
            view.csrf,
            '<p class="hint">Ends every session, yours too: every operator signs in again '
            "(after a token was exposed, or someone left).</p>",
            "End all sessions",
            cls="action",
        )
    return body


class SignIn:
    """The sign-in page, the sign-in and the sign-out of a console with tokens."""

    def __init__(self, store: Store, tokens: auth.TokenAuth) -> None:
        self.store = store
        self.tokens = tokens

    def page(self, request: Request, notice: str, status: int, target: str = "") -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        if not target:
            here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            login = request.url.path.removeprefix(root) in ("/login", "")
            target = root + "/" if login else here
        text = "You must sign in with your console token." if status == 401 else notice
        # Named operators' tokens say who signs in; the shared token's holder types a name
        # (not required by the browser: with both kinds, an operator's token needs none).
        name = ""
        if self.tokens.shared:
            required = "" if self.tokens.named_any else " required"
            name = (
                f'<label>Your name <input name="name"{required} maxlength="100" '
                'autocomplete="username"></label>'
            )
        page = render(
            "login.html",
            root=esc(root),
            csrf=esc(auth.csrf_token(request)),
            next=esc(target),
            name_field=name,
            notice=f'<div class="notice error">{esc(notice or text)}</div>' if text else "",
        )
        return HTMLResponse(page, status)

    async def login(self, request: Request, ready: Callable[[], Awaitable[None]]) -> Response:
        """The sign-in page (GET), or a sign-in (POST); ``ready`` checks the ledger's schema."""
        try:
            await ready()
            return await self._login(request)
        except (StoreUnavailable, SchemaOutdated) as exc:
            return HTMLResponse(esc(f"The ledger is unavailable: {exc}"), 503)

    async def _login(self, request: Request) -> Response:
        if request.method != "POST":  # GET, or HEAD (a GET without the body)
            response: Response = self.page(request, "", 200)
            auth.set_cookies(request, response)
            return response
        unreadable = None
        try:
            form = await read_form(request)
        except BadRequest as exc:
            form, unreadable = {}, str(exc)
        refusal = unreadable or auth.csrf_refusal(request, form)
        credential = None
        if refusal is None:
            credential = self.tokens.check(form.get("token", ""))
            if credential is None:
                await asyncio.sleep(0.5)  # a guess costs time
                refusal = "wrong token"
        name = " ".join(form.get("name", "").split())[:100]
        if credential is not None and credential.name is not None:
            name = credential.name
        if refusal is None and not name:
            refusal = "give your name: it is recorded with every action you take"
        root = request.scope.get("root_path", "").rstrip("/")
        target = _within(form.get("next", ""), root)
        if refusal is not None or credential is None:
            status = 401 if refusal == "wrong token" else 400 if unreadable else 403
            response = self.page(request, refusal or "", status, target)
            auth.set_cookies(request, response)
            return response
        await end(self.store, request.cookies.get(auth.SESSION_COOKIE))
        secret = await start(self.store, name, credential.role, credential.fingerprint)
        response = RedirectResponse(target, 303)
        set_cookie(request, response, secret)
        auth.set_cookies(request, response)
        return response

    async def logout(self, request: Request) -> Response:
        try:
            return await self._logout(request)
        except (StoreUnavailable, SchemaOutdated) as exc:
            return HTMLResponse(esc(f"The ledger is unavailable: {exc}"), 503)

    async def _logout(self, request: Request) -> Response:
        try:
            form = await read_form(request)
        except BadRequest:
            form = {}
        root = request.scope.get("root_path", "").rstrip("/")
        if auth.csrf_refusal(request, form) is not None:
            return HTMLResponse("refused: no valid CSRF token", 403)
        await end(self.store, request.cookies.get(auth.SESSION_COOKIE))
        response = RedirectResponse(root + "/login", 303)
        response.delete_cookie(auth.SESSION_COOKIE, path=auth.cookie_path(request))
        auth.set_cookies(request, response)
        return response


def _within(target: str, root: str) -> str:
    """Where to go after signing in: a path of the console's own, else its front page. A
    browser reads a backslash as a slash (``/\\evil.example`` is another host), so a path
    holding one, a control character or ``//`` at its start goes to the front page too."""
    if (
        len(target) > 2000
        or not target.startswith(root + "/")
        or target.startswith("//")
        or "\\" in target
        or not target.isprintable()
    ):
        return root + "/"
    return target
