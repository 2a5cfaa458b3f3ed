"""The console's routes that act on one receipt: replay, the confirmed re-run, and settling
what needs review (the work itself, and its audit record, is :mod:`receiver._console.actions`).

Each answers with a redirect to the receipt's page, and the notice that page shows is left in
the operator's session (receiver/_console/sessions.py), never in the URL.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from .._ledger import receipts as ledger
from .._ledger.receipts import Key, State
from .._store.base import Store
from . import actions, pages, receipt
from .forms import BadRequest
from .html import Html, url

Handler = Callable[[Request, pages.View], Awaitable[Response | tuple[str, Html]]]


class ReplayerLike(Protocol):
    async def replay(self, provider: str, webhook_id: str) -> actions.ReplyLike: ...


class Console(Protocol):
    """What these routes use of the console (receiver._console.app.Console), named
    structurally so that the app imports this module and not the other way round."""

    @property
    def store(self) -> Store: ...
    @property
    def receiver(self) -> ReplayerLike | None: ...
    async def lookup(self, request: Request) -> tuple[ledger.Receipt, list[Any], list[Any]]: ...
    async def redirect(self, request: Request, href: str, notice: str) -> Response: ...


def replayer(console: Console) -> actions.Replayer:
    if console.receiver is None:
        raise actions.ActionRefused(
            "this console has no handlers (started with a store only): start it with "
            "--app, or run `receiver replay`"
        )
    return console.receiver.replay


def actor_of(view: pages.View, form: dict[str, str]) -> str:
    """Who acts: the signed-in operator or the host's user, else the name typed in the form."""
    if view.actor is not None:
        return view.actor
    typed = " ".join(form.get("operator", "").split())[:100]
    if not typed:
        raise BadRequest("say who you are: your name is recorded with the action")
    return f"{typed} (as typed)"


def action_input(request: Request, view: pages.View) -> tuple[dict[str, str], Key, int, str]:
    form: dict[str, str] = request.state.form
    provider, webhook_id = form.get("provider", ""), form.get("id", "")
    if not provider or not webhook_id:
        raise BadRequest("the form names no receipt")
    try:
        fence = int(form.get("fence", ""))
    except ValueError:
        raise BadRequest("the form carries no fence") from None
    return form, Key(provider, webhook_id), fence, actor_of(view, form)


def rerun(console: Console) -> Handler:
    async def handler(request: Request, view: pages.View) -> Response | tuple[str, Html]:
        # HEAD is a GET without the body (Starlette routes it with GET): only a POST acts.
        if request.method != "POST":
            if view.read_only or console.receiver is None:
                raise actions.ActionRefused("re-runs need a console with handlers, not read-only")
            found, _, _ = await console.lookup(request)
            if found.state is not State.COMPLETED:  # the form would only be refused
                raise actions.ActionRefused(
                    f"{found.key.provider}/{found.key.webhook_id} is {found.state.value}, not "
                    "completed: replay it instead"
                )
            return "Run a completed delivery again", receipt.rerun(view, found)
        form, key, fence, actor = action_input(request, view)
        done = await actions.rerun(
            console.store,
            replayer(console),
            actor,
            key,
            fence,
            form.get("reason", ""),
            form.get("payload", "").encode(),
            form.get("confirm", ""),
        )
        return await _done(console, request, view, key, done.notice("rerun"))

    return handler


def replay(console: Console) -> Handler:
    async def handler(request: Request, view: pages.View) -> Response:
        form, key, fence, actor = action_input(request, view)
        done = await actions.replay(
            console.store, replayer(console), actor, key, fence, form.get("reason", "")
        )
        return await _done(console, request, view, key, done.notice("replay"))

    return handler


def settle(console: Console, decision: str) -> Handler:
    async def handler(request: Request, view: pages.View) -> Response:
        form, key, fence, actor = action_input(request, view)
        done = await actions.settle(
            console.store,
            actor,
            key,
            fence,
            decision,
            form.get("reason", ""),
            form.get("answer", ""),
        )
        message = f"{done.outcome.capitalize()}: {done.detail}"
        return await _done(console, request, view, key, message)

    return handler


async def _done(
    console: Console, request: Request, view: pages.View, key: Key, message: str
) -> Response:
    href = url(view.root, "/receipt", {"provider": key.provider, "id": key.webhook_id})
    return await console.redirect(request, href, message)
