"""An upstream that accepts no Idempotency-Key of its own, for the proxy's tests: it counts
every call it acts on, by the key the proxy forwards, and keeps each answer so that a
``reconcile`` can ask it what happened (``GET /done/{key}``).

``POST /payments`` acts (a payment id from a counter) and answers 201; ``?sleep=S`` takes S
seconds first; ``?status=N`` answers N after acting (a 5xx that did act); ``?refuse=1`` answers
503 without acting. ``GET /calls`` lists the calls (``DELETE`` forgets them), ``GET /stream``
streams a body in chunks.
Run it with uvicorn; ``RECEIVER_TEST_KILL_PID`` and ``RECEIVER_TEST_KILL_KEY``: after acting
on that key, SIGKILL that process (the proxy) before answering.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

CALLS: list[dict[str, Any]] = []
DONE: dict[str, tuple[int, bytes]] = {}
_IDS = itertools.count(1)


async def payments(request: Request) -> Response:
    body = await request.body()
    key = request.headers.get("idempotency-key", "")
    if request.query_params.get("refuse"):
        return Response(b'{"error":"busy"}', 503, media_type="application/json")
    await asyncio.sleep(float(request.query_params.get("sleep", "0")))
    payment = f"pay_{next(_IDS)}"
    status = int(request.query_params.get("status", "201"))
    answer = orjson.dumps({"id": payment, "request": orjson.loads(body or b"null")})
    CALLS.append({"key": key, "path": request.url.path, "body": body.decode(), "id": payment})
    DONE[key] = (status, answer)
    if key and key == os.environ.get("RECEIVER_TEST_KILL_KEY"):
        os.kill(int(os.environ["RECEIVER_TEST_KILL_PID"]), signal.SIGKILL)
    return Response(answer, status, media_type="application/json", headers={"x-payment": payment})


async def done(request: Request) -> Response:
    found = DONE.get(request.path_params["key"])
    if found is None:
        return Response(b"", 404)
    return Response(found[1], found[0], media_type="application/json")


async def calls(request: Request) -> Response:
    if request.method == "DELETE":  # a fresh start for the next example of a property test
        CALLS.clear()
        DONE.clear()
    return Response(orjson.dumps(CALLS), media_type="application/json")


async def stream(request: Request) -> Response:
    async def chunks() -> Any:
        for i in range(5):
            yield f"chunk {i}\n".encode()
            await asyncio.sleep(0.01)

    return StreamingResponse(chunks(), media_type="text/plain")


async def echo(request: Request) -> Response:
    headers = {k: v for k, v in request.headers.items()}
    return Response(orjson.dumps(headers), media_type="application/json")


app = Starlette(
    routes=[
        Route("/payments", payments, methods=["POST", "PATCH"]),
        Route("/done/{key}", done),
        Route("/calls", calls, methods=["GET", "DELETE"]),
        Route("/stream", stream),
        Route("/echo", echo, methods=["GET", "POST"]),
    ]
)


async def reconcile(attempt: Any) -> Any:
    """Ask the upstream whether it acted on the attempt's key (``--reconcile`` of the CLI)."""
    from receiver import RUN_AGAIN

    answer = await attempt.client.get(f"done/{attempt.upstream_key}")
    return RUN_AGAIN if answer.status_code == 404 else answer
