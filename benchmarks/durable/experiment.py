"""The side-by-side experiment: per runtime, the refund step killed (SIGKILL) after its effect
and before the runtime records the step, then recovered by the runtime's own mechanism; N runs
with the runtime alone, N with the executor under it, interleaved. Each run refunds an order of
its own, so the fake payment service's refunds of that order are the run's effects: more than
one is a duplicate.

Used by ``python -m benchmarks.durable`` and, with a small N, by the test suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .refunds import CRASH_ENV, Payments

ROOT = Path(__file__).resolve().parents[2]
SIDES = ("alone", "executor")


@dataclass(frozen=True)
class Runtime:
    """How to start a runtime's worker: ``python -m <module> <args> start|recover|latency``."""

    name: str
    module: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def command(self, payments: str, *rest: str) -> list[str]:
        return [sys.executable, "-m", self.module, *self.args, "--payments", payments, *rest]


@dataclass(frozen=True)
class Run:
    runtime: str
    side: str
    crash: str
    refunds: int
    result: dict[str, Any]

    @property
    def duplicates(self) -> int:
        return max(self.refunds - 1, 0)


class Experiment:
    """The fake payment service (a process of its own) and the runs against it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.payments_url = ""
        self._service: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Experiment:
        ready = self.workdir / "payments.url"
        self._service = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.durable.payments", "--ready", str(ready), cwd=ROOT
        )
        for _ in range(500):
            if ready.exists():
                self.payments_url = ready.read_text()
                return self
            await asyncio.sleep(0.02)
        await self.__aexit__()
        raise RuntimeError("the fake payment service did not start in 10 s")

    async def __aexit__(self, *exc: object) -> None:
        if self._service is not None and self._service.returncode is None:
            self._service.kill()
            await self._service.wait()

    async def refunds(self, order: str) -> list[dict[str, Any]]:
        payments = Payments(self.payments_url)
        return await payments.find(order=order)

    async def crash_and_recover(
        self, runtime: Runtime, side: str, *, crash: str = "effect", run: str | None = None
    ) -> Run:
        """One run: start the workflow, kill its process at the crash point, recover it with
        the runtime's own mechanism, count the order's refunds."""
        run = run or f"{runtime.name}-{side}-{uuid.uuid4().hex[:10]}"
        marker = self.workdir / f"{run}.crashed"
        log = self.workdir / f"{run}.log"
        env = {**os.environ, **runtime.env, CRASH_ENV: f"{crash}:{marker}"}
        with log.open("wb") as out:
            worker = await asyncio.create_subprocess_exec(
                *runtime.command(self.payments_url, "start", side, run),
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=out,
            )
            try:
                for _ in range(3000):
                    if marker.exists() or worker.returncode is not None:
                        break
                    await asyncio.sleep(0.02)
            finally:
                if worker.returncode is None:
                    worker.send_signal(signal.SIGKILL)
                await worker.wait()
        if not marker.exists():
            raise RuntimeError(f"{run}: the worker never reached the crash point:\n{_tail(log)}")
        result = await self._recover(runtime, run, log)
        return Run(runtime.name, side, crash, len(await self.refunds(run)), result)

    async def _recover(self, runtime: Runtime, run: str, log: Path) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items() if k != CRASH_ENV} | runtime.env
        with log.open("ab") as out:
            worker = await asyncio.create_subprocess_exec(
                *runtime.command(self.payments_url, "recover", run),
                cwd=ROOT,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=out,
            )
            try:
                stdout, _ = await asyncio.wait_for(worker.communicate(), 180)
            except TimeoutError as exc:
                worker.kill()
                await worker.wait()
                raise RuntimeError(f"{run}: recovery did not finish:\n{_tail(log)}") from exc
        if worker.returncode != 0:
            raise RuntimeError(f"{run}: recovery failed:\n{_tail(log)}")
        recovered: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
        return recovered

    async def latency(self, runtime: Runtime, count: int) -> dict[str, list[float]]:
        """The step's latency, ``count`` runs of each side interleaved in one process."""
        log = self.workdir / f"{runtime.name}-latency.log"
        with log.open("wb") as out:
            worker = await asyncio.create_subprocess_exec(
                *runtime.command(self.payments_url, "latency", str(count)),
                cwd=ROOT,
                env={**os.environ, **runtime.env},
                stdout=asyncio.subprocess.PIPE,
                stderr=out,
            )
            stdout, _ = await worker.communicate()
        if worker.returncode != 0:
            raise RuntimeError(f"{runtime.name}: latency run failed:\n{_tail(log)}")
        samples: dict[str, list[float]] = json.loads(stdout.decode().strip().splitlines()[-1])
        return samples


async def side_by_side(experiment: Experiment, runtime: Runtime, runs: int) -> list[Run]:
    """``runs`` runs of each side, alternating (a busy machine slows both alike)."""
    done: list[Run] = []
    for n in range(runs):
        for side in SIDES if n % 2 == 0 else SIDES[::-1]:
            done.append(await experiment.crash_and_recover(runtime, side))
    return done


def summary(
    runtime: str, runs: Sequence[Run], latency: dict[str, list[float]] | None
) -> list[dict[str, Any]]:
    rows = []
    for side in SIDES:
        mine = [r for r in runs if r.side == side]
        row: dict[str, Any] = {
            "runtime": runtime,
            "side": side,
            "runs": len(mine),
            "runs_with_duplicate": sum(r.duplicates > 0 for r in mine),
            "duplicate_refunds": sum(r.duplicates for r in mine),
        }
        if latency and latency.get(side):
            ms = sorted(s * 1000 for s in latency[side])
            row["step_p50_ms"] = statistics.median(ms)
            row["step_p95_ms"] = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
        rows.append(row)
    return rows


@contextlib.asynccontextmanager
async def experiment(workdir: Path) -> AsyncIterator[Experiment]:
    async with Experiment(workdir) as running:
        yield running


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
