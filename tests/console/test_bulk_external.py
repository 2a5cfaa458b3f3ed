"""A bulk replay of external handlers whose ``receiver replay --job`` process is SIGKILLed
while a handler is inside its external call (its effect made, its answer not stored), then
taken over by another ``receiver replay --job`` process or by a console: the interrupted item
is reconciled (or, without ``reconcile``, held for review), never run again blindly; an item
the dead runner never reached runs once; and one that a sender's retry ran meanwhile is
counted ``changed``, not as the job's. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from receiver import State, Store
from receiver._console import Console, bulk
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Key
from tests.conftest import truncate

from . import externalapp
from .externalapp import PROVIDER, lines

ROOT = Path(__file__).resolve().parents[2]
RECEIVER = str(Path(sys.executable).parent / "receiver")
APP = "tests.console.externalapp:rx"
# In the job's order: the one killed inside its call, one a sender's retry runs before the
# job is taken over, one nobody touched.
IDS = ["a_killed", "b_retried", "c_untouched"]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The ledger's URL, for this process and the ``receiver`` processes alike."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    pg_url: str = request.getfixturevalue("pg_url")
    asyncio.run(truncate(pg_url))
    return pg_url


def command(url: str, outside: Path, job: int) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    env.update(EXTERNAL_APP_STORE=url, EXTERNAL_APP_DIR=str(outside))
    return [RECEIVER, "replay", "--app", APP, "--job", str(job)], env


async def wait_until(check: Callable[[], object], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def finished(store: Store, job: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        async with store.acquire() as conn:
            row = await conn.run("bulk_job_get", job, store.now())
        assert row is not None
        if row["state"] == "done":
            return
        assert time.monotonic() < deadline, f"the job was not taken over: {dict(row)}"
        await asyncio.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("takeover", ["receiver replay --job", "console"])
@pytest.mark.parametrize("handler", ["payment.created", "transfer.created"])
async def test_a_resumed_bulk_replay_never_runs_an_interrupted_external_handler_again(
    url: str, tmp_path: Path, takeover: str, handler: str
) -> None:
    """``payment.created`` has a reconcile(), ``transfer.created`` none."""
    outside = tmp_path / "outside"
    outside.mkdir()
    rx = externalapp.make(url, outside)
    async with rx:
        await externalapp.fail_many(rx, IDS, handler)
        job = await bulk.create(
            rx.store, "ada", bulk.Filter(provider=PROVIDER), "3", "the bank is back", "j" * 16, 50
        )

    # The job's first runner, killed inside its first item's external call.
    (outside / "hold").touch()
    args, env = command(url, outside, job)
    first = await asyncio.create_subprocess_exec(
        *args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        await wait_until(lambda: lines(outside, "effects"), "the handler was never called")
    finally:
        first.send_signal(signal.SIGKILL)
        await asyncio.wait_for(first.wait(), 10)
    assert lines(outside, "effects") == ["a_killed"]
    (outside / "hold").unlink()

    async with rx:
        # Before anyone takes the job over, the sender retries an item the job never reached.
        assert await externalapp.redeliver(rx, "b_retried") == 200
        if takeover == "console":
            async with Console(rx.store, receiver=rx).lifespan():  # its runner takes the job
                await finished(rx.store, job)
        else:
            taken = await asyncio.create_subprocess_exec(
                *args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            out, err = await asyncio.wait_for(taken.communicate(), 90)
            stdout, stderr = out.decode(), err.decode()
            assert f"bulk replay {job} done" in stdout, stderr[-2000:]
            assert taken.returncode == (0 if handler == "payment.created" else 1)
        counts = await bulk.outcomes(rx.store, job)
        async with rx.store.acquire() as conn:
            killed = await ledger.lookup(conn, Key(PROVIDER, "a_killed"))
            others = [await ledger.lookup(conn, Key(PROVIDER, i)) for i in IDS[1:]]

    # Each effect happened once outside, whoever ran it.
    assert collections.Counter(lines(outside, "effects")) == dict.fromkeys(IDS, 1)
    assert [r.state if r else None for r in others] == [State.COMPLETED, State.COMPLETED]
    assert killed is not None
    if handler == "payment.created":
        assert lines(outside, "reconciles") == ["a_killed"]
        assert counts == {"reconciled": 1, "changed": 1, "executed": 1}
        assert killed.state is State.COMPLETED
        assert killed.response is not None
        assert killed.response.body == b'{"paid":"a_killed","reconciled":true}'
    else:
        assert lines(outside, "reconciles") == []
        assert counts == {"needs_review": 1, "changed": 1, "executed": 1}
        assert killed.state is State.FAILED  # held for a person to look at
