"""The MCP server the contrib tests talk to: keyed tools whose effects are rows in the
``effects`` table of a real store, over stdio (``python -m tests.contrib.mcp_server_app``) or
streamable HTTP (:func:`http_app`), with bearer tokens standing for principals.

``refund`` is external: it commits its row on a connection of its own (as a payment API would
act, outside the ledger's transaction) and then takes ``hold`` seconds more before it returns,
the window in which the tests drop the client's connection. Its reconcile finds the row. The
row's ``note`` is a token only that attempt knew: a result that carries it is the first
attempt's result, whether replayed or reconciled. ``ticket`` is transactional.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.fastmcp import FastMCP
from pydantic import BaseModel
from starlette.applications import Starlette

from receiver import RUN_AGAIN, ActionFailed, Actions, Connection, Store, ToolCall, store_from_url
from receiver.contrib.mcp import MCPActions, ScopeFunc, authenticated_principal
from tests.support import EFFECTS_DDL

KIND = "mcp-refund"

#: Bearer token -> (OAuth client id, subject, issuer): two tokens of one person, one of
#: another; and a subject of an issuer beside a subject, without an issuer, that spells it.
TOKENS: dict[str, tuple[str, str, str | None]] = {
    "token-ada-laptop": ("desktop-app", "ada", None),
    "token-ada-phone": ("mobile-app", "ada", None),
    "token-bob": ("desktop-app", "bob", None),
    "token-idp-ada": ("desktop-app", "ada", "https://idp.example"),
    "token-spelled": ("desktop-app", "https://idp.example|ada", None),
}


class Refund(BaseModel):
    refund: str
    order: str
    cents: int
    token: str


class Tokens:
    """A token verifier over :data:`TOKENS` (a real deployment asks its authorization server)."""

    async def verify_token(self, token: str) -> AccessToken | None:
        found = TOKENS.get(token)
        if found is None:
            return None
        client, subject, issuer = found
        claims = None if issuer is None else {"iss": issuer}
        return AccessToken(token=token, client_id=client, scopes=[], subject=subject, claims=claims)


def build(store: Store, scope: str | ScopeFunc, *, hold: float = 0.0, **fastmcp: Any) -> FastMCP:
    """The server, its tools running through an executor on ``store``."""
    server = FastMCP("receiver-mcp-tests", **fastmcp)
    actions = Actions(store, lease=1.0, wait=5.0, sweep_interval=None)
    keyed = MCPActions(server, actions, scope=scope)

    async def found(call: ToolCall) -> Any:
        async with store.acquire() as conn:
            token = await conn.fetchval(
                "SELECT note FROM effects WHERE provider = $1 AND webhook_id = $2",
                KIND,
                call.action.key,
            )
        if token is None:
            return RUN_AGAIN
        return result(call, str(call.request["order"]), int(call.request["cents"]), token)

    @keyed.tool(effects="external", reconcile=found, volatile=("reason",))
    async def refund(
        call: ToolCall, tx: Connection, order: str, cents: int, reason: str = ""
    ) -> Refund:
        """Refund an order (an external payment API)."""
        if cents <= 0:
            raise ActionFailed("a refund must be positive")
        token = secrets.token_hex(8)
        async with store.acquire() as conn:
            await conn.execute(
                "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
                KIND,
                call.action.key,
                call.fence,
                token,
            )
        await asyncio.sleep(hold)
        return result(call, order, cents, token)

    @keyed.tool(destructive=False)
    async def ticket(call: ToolCall, tx: Connection, subject: str) -> str:
        """Open a support ticket."""
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            "mcp-ticket",
            call.action.key,
            call.fence,
            subject,
        )
        return f"T-{call.fence}-{subject}"

    return server


def result(call: ToolCall, order: str, cents: int, token: str) -> Refund:
    return Refund(refund=call.downstream_key[:16], order=order, cents=cents, token=token)


async def prepare(store: Store) -> None:
    async with store.acquire() as conn:
        await conn.execute(EFFECTS_DDL)


def http_app(store: Store, port: int, *, hold: float = 0.0) -> Starlette:
    """The streamable HTTP app: the scope of a call is its bearer token's principal."""
    server = build(
        store,
        authenticated_principal,
        hold=hold,
        token_verifier=Tokens(),
        auth=AuthSettings(
            issuer_url="http://127.0.0.1/",  # type: ignore[arg-type]
            resource_server_url=f"http://127.0.0.1:{port}/mcp",  # type: ignore[arg-type]
            validate_token_resource=False,
        ),
    )
    return server.streamable_http_app()


async def serve_stdio(url: str, scope: str, hold: float) -> None:
    async with store_from_url(url) as store:
        await prepare(store)
        await build(store, scope, hold=hold).run_stdio_async()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.contrib.mcp_server_app")
    parser.add_argument("--store", required=True)
    parser.add_argument("--scope", required=True, help="the principal this stdio server runs for")
    parser.add_argument("--hold", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(serve_stdio(args.store, args.scope, args.hold))


if __name__ == "__main__":
    main()
