"""The live overview: per provider, the backlog's age, handler time percentiles, failure rate
and throughput over the last 1, 5 and 15 minutes, pushed to the page as server-sent events.

The numbers come from the ledger, read at a bounded cost however large it is: the backlog age
is one probe of ``receiver_receipts_backlog`` (the oldest queued or released delivery); the
handler times and throughput come from the provider's newest claims of the last 15 minutes
(``receiver_receipts_provider_claimed``, at most ``SCAN`` entries: from claim to completion,
the time an attempt took); the failures from the newest failed attempts
(``receiver_attempts_failed_at``, at most ``SCAN``). When a walk stops at ``SCAN`` entries
before the window's start, the window's counts are extrapolated from the span those entries
cover, and marked ``~``; the percentiles are then those of the newest entries.

The page is rendered with the numbers of the moment, so it works without a script (it then
refreshes itself every ``NOSCRIPT_REFRESH`` seconds); the console's own small script
(``live.js``, nothing from elsewhere) subscribes to ``/live/events`` and updates the cells. One
reading of the ledger serves every open page of a console for ``INTERVAL`` seconds.
"""

from __future__ import annotations

import asyncio
import datetime
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .._store.base import Connection, Store
from . import pages, queries
from .html import Html, esc, link, static, table, url

WINDOWS = (60, 300, 900)
SCAN = queries.SCAN
#: Seconds between two readings (and two events on an open page).
INTERVAL = 2.0
NOSCRIPT_REFRESH = 15
#: An event stream ends after this long; the browser's EventSource opens a new one.
STREAM_SECONDS = 300


@dataclass(frozen=True, slots=True)
class Window:
    seconds: int
    completed: float  # completions in the window (extrapolated when ``estimated``)
    failed: float  # failed attempts
    estimated: bool
    p50: float | None  # handler time, seconds
    p95: float | None
    p99: float | None

    @property
    def per_minute(self) -> float:
        return self.completed * 60 / self.seconds

    @property
    def failure_rate(self) -> float | None:
        attempts = self.completed + self.failed
        return None if attempts == 0 else self.failed / attempts


@dataclass(frozen=True, slots=True)
class ProviderLive:
    name: str
    backlog_age: float | None  # seconds the oldest queued or released delivery has waited
    windows: tuple[Window, ...]


@dataclass(frozen=True, slots=True)
class Reading:
    at: float
    providers: tuple[ProviderLive, ...]

    def cells(self) -> dict[str, str]:
        """Every cell of the page's table, by its ``data-live`` name, as shown."""
        found: dict[str, str] = {}
        for p in self.providers:
            found[f"{p.name}|backlog"] = _age(p.backlog_age)
            for w in p.windows:
                mark = "~" if w.estimated else ""
                base = f"{p.name}|{w.seconds}|"
                found[base + "throughput"] = f"{mark}{w.per_minute:.1f}/min"
                rate = w.failure_rate
                found[base + "failures"] = "-" if rate is None else f"{mark}{rate * 100:.1f} %"
                for name in ("p50", "p95", "p99"):
                    found[base + name] = _ms(getattr(w, name))
        return found


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "none"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The nearest-rank percentile (q in 0..100) of sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


async def read(conn: Connection, now: float, providers: Sequence[str]) -> Reading:
    start = now - max(WINDOWS)
    failures = await conn.run_all("live_failures", start, SCAN)
    failures_full = len(failures) >= SCAN
    fail_floor = float(failures[-1]["failed_at"]) if failures_full else start
    found = []
    for name in providers:
        row = await conn.run("live_backlog", name)
        oldest = None if row is None or row["oldest"] is None else float(row["oldest"])
        recent = await conn.run_all("live_recent", name, start, SCAN)
        full = len(recent) >= SCAN
        floor = float(recent[-1]["claimed_at"]) if full else start
        failed_at = [float(f["failed_at"]) for f in failures if f["provider"] == name]
        windows = []
        for seconds in WINDOWS:
            since = now - seconds
            done = [
                float(r["completed_at"]) - float(r["claimed_at"])
                for r in recent
                if r["state"] == "completed"
                and r["completed_at"] is not None
                and float(r["claimed_at"]) >= since
            ]
            times = sorted(max(0.0, d) for d in done)
            completed, estimated = _scaled(len(done), since, floor, now, full)
            failed_n = sum(1 for t in failed_at if t >= since)
            failed, failed_estimated = _scaled(failed_n, since, fail_floor, now, failures_full)
            windows.append(
                Window(
                    seconds,
                    completed,
                    failed,
                    estimated or failed_estimated,
                    percentile(times, 50),
                    percentile(times, 95),
                    percentile(times, 99),
                )
            )
        age = None if oldest is None else max(0.0, now - oldest)
        found.append(ProviderLive(name, age, tuple(windows)))
    return Reading(now, tuple(found))


def _scaled(n: int, since: float, floor: float, now: float, full: bool) -> tuple[float, bool]:
    """A count over [since, now) from a walk that read back to ``floor``: exact when the walk
    reached the window's start, else extrapolated from the span it covered."""
    if not full or floor <= since:
        return float(n), False
    covered = max(now - floor, 1e-3)
    return n * (now - since) / covered, True


class ConsoleLike(Protocol):
    @property
    def store(self) -> Store: ...
    def now(self) -> float: ...
    async def allowed(self, request: Request) -> bool: ...


class Live:
    """One console's live readings: shared by its open pages for ``INTERVAL`` seconds."""

    def __init__(self, console: ConsoleLike) -> None:
        self.console = console
        self._last: Reading | None = None
        self._lock = asyncio.Lock()

    async def reading(self) -> Reading:
        async with self._lock:
            now = self.console.now()
            if self._last is None or now - self._last.at >= INTERVAL * 0.9:
                store = self.console.store
                async with store.acquire() as conn:
                    names = [p for p in await queries.providers(conn) if ":" not in p]
                    self._last = await read(conn, now, names)
            return self._last

    def page(self) -> Any:
        async def handler(request: Request, view: pages.View) -> tuple[str, Html]:
            reading = await self.reading()
            request.state.head = (
                f'<noscript><meta http-equiv="refresh" content="{NOSCRIPT_REFRESH}"></noscript>'
                f'<script src="{esc(view.root)}/live.js" defer></script>'
            )
            return "Live", render(view, reading)

        return handler

    def events(self) -> Any:
        async def handler(request: Request, view: pages.View) -> Response:
            return StreamingResponse(
                self._stream(request),
                media_type="text/event-stream",
                headers={"cache-control": "no-store", "x-accel-buffering": "no"},
            )

        return handler

    async def _stream(self, request: Request) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        ends = loop.time() + STREAM_SECONDS
        yield f"retry: {int(INTERVAL * 1000)}\n\n".encode()
        while loop.time() < ends and not await request.is_disconnected():
            if not await self.console.allowed(request):
                return  # signed out (or the session ended) since the page opened
            reading = await self.reading()
            data = {"at": _clock(reading.at), "cells": reading.cells()}
            yield b"event: stats\ndata: " + orjson.dumps(data) + b"\n\n"
            await asyncio.sleep(INTERVAL)


def _clock(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%H:%M:%S UTC")


async def script(request: Request) -> Response:
    return Response(
        static("live.js"),
        media_type="text/javascript",
        headers={"cache-control": "max-age=3600"},
    )


def render(view: pages.View, reading: Reading) -> Html:
    cells = reading.cells()
    rows = []
    for p in reading.providers:
        for i, w in enumerate(p.windows):
            base = f"{p.name}|{w.seconds}|"
            first = [
                link(url(view.root, "/receipts", {"provider": p.name}), p.name),
                _cell(f"{p.name}|backlog", cells),
            ]
            rows.append(
                (first if i == 0 else ["", ""])
                + [f"{w.seconds // 60} min"]
                + [_cell(base + m, cells) for m in ("throughput", "failures", "p50", "p95", "p99")]
            )
    body = table(
        [
            "provider",
            "backlog age",
            "over",
            "completed",
            "failure rate",
            "p50",
            "p95",
            "p99",
        ],
        rows,
        cls="live",
        empty="no webhook deliveries yet",
    )
    return (
        f'<div data-live-source="{esc(view.root)}/live/events">'
        f'<p class="hint">As of <span id="live-at">{esc(_clock(reading.at))}</span>; updated '
        f"every {INTERVAL:g} s while this page is open (every {NOSCRIPT_REFRESH} s without "
        "scripts).</p>"
        f"{body}</div>"
        '<p class="hint">Backlog age: how long the oldest queued or released delivery has waited. '
        "Handler time: from an attempt's claim to its completion. Failure rate: failed attempts "
        "over failed and completed ones. A value marked ~ is extrapolated from the newest "
        f"{SCAN:,} entries of a busy window.</p>"
    )


def _cell(name: str, cells: dict[str, str]) -> Html:
    return f'<span data-live="{esc(name)}">{esc(cells[name])}</span>'
