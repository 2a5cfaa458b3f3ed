"""Micro-benchmark of tracing's cost per delivery (``python -m benchmarks.tracing``).

The same signed deliveries go through ``Receiver.deliver`` (no HTTP) on a SQLite store in a
temporary directory, with three receivers side by side:

- ``off``: only ``opentelemetry-api`` installed and no SDK configured (the default): the
  receiver finds the API's no-op provider and makes no span at all;
- ``sdk``: an SDK ``TracerProvider`` with no span processor: every span is made, recorded and
  ended, and goes nowhere (the cost that is the receiver's own);
- ``export``: the same with a ``SimpleSpanProcessor`` into the SDK's in-memory exporter (what a
  synchronous exporter adds; a real deployment uses a batch processor and a network exporter).

Two paths: ``replay`` (redeliveries answered from the replay cache, the cheapest path, where a
fixed cost shows most) and ``fresh`` (a new id each time: claim, handler, completion on SQLite).
The figure is the best of interleaved rounds (off, sdk, export, off, ...), in microseconds per
delivery; the overhead is each traced figure minus ``off``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
import timeit
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.datastructures import Headers

from receiver import Event, Provider, Receiver, SQLiteStore, generate_secret, sign
from receiver._store.base import Connection
from receiver._webhooks.tracing import annotate, handler_span

_ids = itertools.count()


def _receiver(path: Path, secret: str, tracer_provider: TracerProvider | None) -> Receiver:
    rx = Receiver(
        SQLiteStore(str(path)),
        [Provider("bench", [secret])],
        metrics=False,
        sweep_interval=None,
        tracer_provider=tracer_provider,
    )

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> dict[str, Any]:
        return {"id": event.payload["data"]["order_id"]}

    return rx


def _deliveries(secret: str, count: int) -> list[tuple[dict[str, str], bytes]]:
    now = int(time.time())
    out = []
    for _ in range(count):
        webhook_id = f"msg_{next(_ids)}"
        body = orjson.dumps({"type": "order.created", "data": {"order_id": webhook_id}})
        headers = {
            "content-type": "application/json",
            "webhook-id": webhook_id,
            "webhook-timestamp": str(now),
            "webhook-signature": sign(secret, webhook_id, now, body),
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        }
        out.append((headers, body))
    return out


async def _time(rx: Receiver, items: list[tuple[dict[str, str], bytes]]) -> float:
    """Microseconds per delivery."""
    began = time.perf_counter()
    for headers, body in items:
        response = await rx.deliver("bench", headers, body)
        if response.status_code != 200:
            raise AssertionError(f"delivery answered {response.status_code}: {response.body!r}")
    return (time.perf_counter() - began) * 1e6 / len(items)


async def _measure(rounds: int, count: int) -> dict[str, dict[str, float]]:
    secret = generate_secret()
    exported = InMemorySpanExporter()
    with_export = TracerProvider()
    with_export.add_span_processor(SimpleSpanProcessor(exported))
    sides: dict[str, TracerProvider | None] = {
        "off": None,
        "sdk": TracerProvider(),
        "export": with_export,
    }
    best: dict[str, dict[str, float]] = {"replay": {}, "fresh": {}}
    with tempfile.TemporaryDirectory() as tmp:
        receivers = {
            name: _receiver(Path(tmp) / f"{name}.db", secret, provider)
            for name, provider in sides.items()
        }
        for rx in receivers.values():
            await rx.open()
        try:
            seeded = {}
            for name, rx in receivers.items():
                seeded[name] = _deliveries(secret, count)
                await _time(rx, seeded[name])  # completed, and in the replay cache
            for _ in range(rounds):
                for name, rx in receivers.items():
                    paths: dict[str, Callable[[], Awaitable[float]]] = {
                        "replay": lambda rx=rx, name=name: _time(rx, seeded[name]),
                        "fresh": lambda rx=rx: _time(rx, _deliveries(secret, count)),
                    }
                    for path, run in paths.items():
                        took = await run()
                        best[path][name] = min(best[path].get(name, took), took)
                    exported.clear()
        finally:
            for rx in receivers.values():
                await rx.close()
    return best


def _no_sdk_hooks_ns() -> float:
    """What tracing adds to a delivery without an SDK: the provider check, the annotation
    call and one handler's null context (nanoseconds, best of 5)."""
    rx = Receiver("sqlite:///unused.db", metrics=False, sweep_interval=None)
    handler = rx.registry.add("t", _noop)
    event = Event(provider="p", id="i", type="t", payload={}, body=b"", headers=Headers())

    def hooks() -> None:
        rx.tracing.tracer()
        annotate("i", "t")
        with handler_span(handler, event):
            pass

    timer = timeit.Timer(hooks)
    loops = timer.autorange()[0]
    return min(timer.repeat(5, loops)) * 1e9 / loops


async def _noop(event: Event, tx: Connection) -> None:
    pass


def run(rounds: int = 5, count: int = 500) -> dict[str, Any]:
    best = asyncio.run(_measure(rounds, count))
    result: dict[str, Any] = {"rounds": rounds, "deliveries": count, "statistic": "best round"}
    result["no_sdk_hooks_ns"] = round(_no_sdk_hooks_ns())
    for path, sides in best.items():
        for side, us in sides.items():
            result[f"{path}_{side}_us"] = round(us, 1)
        result[f"{path}_sdk_overhead_us"] = round(sides["sdk"] - sides["off"], 1)
        result[f"{path}_export_overhead_us"] = round(sides["export"] - sides["off"], 1)
    return result


def describe(result: dict[str, Any]) -> str:
    r = result
    lines = [
        f"tracing (us per delivery, Receiver.deliver on SQLite, {r['statistic']}):",
        f"  without an SDK the hooks cost {r['no_sdk_hooks_ns']} ns per delivery",
    ]
    for path in ("replay", "fresh"):
        lines.append(
            f"  {path:<6}  no SDK {r[f'{path}_off_us']:7.1f}   "
            f"SDK {r[f'{path}_sdk_us']:7.1f} ({r[f'{path}_sdk_overhead_us']:+.1f})   "
            f"SDK + in-memory export {r[f'{path}_export_us']:7.1f} "
            f"({r[f'{path}_export_overhead_us']:+.1f})"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=500)
    args = parser.parse_args()
    print(describe(run(args.rounds, args.count)))


if __name__ == "__main__":
    main()
