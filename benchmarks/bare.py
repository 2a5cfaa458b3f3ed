"""The yardstick: a bare Starlette POST endpoint that reads the body and answers a small JSON.

Served by the runner exactly like the receiver (``uvicorn benchmarks.bare:app``, same workers,
loop, HTTP parser and logging), at the same path shape ``POST /{provider}``.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def endpoint(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/{provider}", endpoint, methods=["POST"])])
