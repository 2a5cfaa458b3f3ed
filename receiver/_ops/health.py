"""The receiver's own GET routes: ``/healthz``, ``/readyz`` and ``/metrics``.

- ``GET /healthz``: the process is alive and serving. Touches nothing else.
- ``GET /readyz``: the store answers, its schema is there (the ``schema_ready`` statement
  reads the receipts table's definition, no row), it accepts writes (not a standby) and the role
  holds the ledger's privileges, within 2 seconds; else 503 with ``Retry-After`` and what to
  fix. A load balancer (Kong's health checks) stops sending deliveries to a replica whose
  database is gone, instead of collecting 503s from it.
- ``GET /metrics``: Prometheus exposition of the Receiver's registry (receiver/_ops/metrics.py).

They sit beside ``POST /{provider}``, so a provider may not be named like one of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .._exceptions import (
    ConfigurationError,
    StoreMisconfigured,
    StoreReadOnly,
    StoreUnavailable,
)
from .._ledger.responses import json_response
from .._store.base import Store
from .metrics import CONTENT_TYPE, Metrics

HEALTHZ = "/healthz"
READYZ = "/readyz"

_NO_STORE = {"cache-control": "no-store"}


async def healthz(request: Request) -> Response:
    return json_response(200, {"status": "ok"}, _NO_STORE)


def readyz(store: Store, limit: float = 2.0, retry_after: int = 5) -> Callable[..., object]:
    async def ready(request: Request) -> Response:
        problem = await check_ready(store, limit)
        if problem is None:
            return json_response(200, {"status": "ready"}, _NO_STORE)
        headers = {**_NO_STORE, "retry-after": str(retry_after)}
        return json_response(503, {"status": "not_ready", "detail": problem}, headers)

    return ready


async def check_ready(store: Store, limit: float = 2.0) -> str | None:
    """None if the store answers with its schema in place, writable and with the privileges the
    ledger needs, else what is wrong and how to fix it (no secrets: never the driver's text,
    which may carry a DSN)."""
    try:
        async with asyncio.timeout(limit):
            async with store.acquire() as conn:
                row = await conn.run("schema_ready")
    except TimeoutError:
        return f"the store did not answer within {limit:g} s"
    except (StoreMisconfigured, StoreReadOnly) as exc:
        return str(exc)
    except StoreUnavailable:
        return "the store is unavailable"
    except Exception as exc:
        name = type(exc).__name__
        return f"the ledger's schema is missing or unreadable ({name}): run `receiver migrate`"
    if row is not None and row["read_only"]:
        return "the store is read-only (a standby, or after a failover): point it at the primary"
    if row is not None and not row["privileged"]:
        return (
            "the store's role lacks privileges on the ledger's tables: GRANT SELECT, INSERT, "
            "UPDATE, DELETE ON receiver_receipts, receiver_attempts TO the store URL's role"
        )
    return None


def metrics_endpoint(
    metrics: Metrics, store: Store, clock: Callable[[], float]
) -> Callable[..., object]:
    async def scrape(request: Request) -> Response:
        body = await metrics.render(store, clock())
        return Response(body, 200, headers=_NO_STORE, media_type=CONTENT_TYPE)

    return scrape


def observability_routes(
    store: Store,
    metrics: Metrics | None,
    metrics_path: str | None,
    health: bool,
    clock: Callable[[], float],
    retry_after: int = 5,
) -> list[BaseRoute]:
    routes: list[BaseRoute] = []
    if health:
        routes.append(Route(HEALTHZ, healthz, methods=["GET"]))
        routes.append(Route(READYZ, readyz(store, retry_after=retry_after), methods=["GET"]))
    if metrics is not None and metrics_path is not None:
        if not metrics_path.startswith("/") or metrics_path == "/":
            raise ConfigurationError(
                f"metrics_path must be a path such as '/metrics', not {metrics_path!r} "
                "(metrics_path=None collects without serving: serve rx.metrics.registry yourself)"
            )
        routes.append(Route(metrics_path, metrics_endpoint(metrics, store, clock), methods=["GET"]))
    return routes


def reserved_names(routes: Sequence[BaseRoute]) -> frozenset[str]:
    """Single-segment paths of ``routes``: names a provider (``/{provider}``) may not take."""
    paths = (getattr(r, "path", "") for r in routes)
    return frozenset(p.strip("/") for p in paths if p.count("/") == 1 and p != "/")
