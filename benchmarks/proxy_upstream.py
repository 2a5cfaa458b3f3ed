"""The upstream of the proxy benchmark: a JSON endpoint that counts the calls it acts on."""

from __future__ import annotations

import itertools

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_CALLS = itertools.count(1)
_SEEN = [0]


async def payments(request: Request) -> Response:
    await request.body()
    _SEEN[0] = next(_CALLS)
    return Response(
        b'{"id":"pay_1","status":"succeeded","amount":1200}', 201, media_type="application/json"
    )


async def count(request: Request) -> Response:
    return Response(str(_SEEN[0]).encode())


async def root(request: Request) -> Response:
    return Response(b"ok")


app = Starlette(
    routes=[
        Route("/", root),
        Route("/payments", payments, methods=["POST"]),
        Route("/count", count),
    ]
)
