"""The mounting examples run as documented and serve deliveries end to end.

- examples/mounted.py: the receiver under /webhooks in a Starlette app (SQLite file), the host
  app's lifespan opening it.
- examples/fastapi_app.py: the receiver under /webhooks in a FastAPI app, its ledger on the
  app's own asyncpg pool: one pool, not two (PostgreSQL's pg_stat_activity shows only that
  pool's connections, and the handlers' writes are readable through the app's endpoint).
- examples/standalone.py: ``uvicorn examples.standalone:app --workers 2``, a real process with
  two workers on one PostgreSQL database; concurrent duplicates still execute once, and the
  health path examples/kong/kong.yml probes answers.
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
import yaml
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.pgcluster import free_port
from tests.servers import ROOT
from tests.support import SECRET, signed

UVICORN = str(Path(sys.executable).parent / "uvicorn")


def fresh_import(name: str) -> ModuleType:
    """Import an example anew: examples read their environment at import time."""
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def invoice(invoice_id: str) -> bytes:
    return orjson.dumps({"type": "invoice.paid", "data": {"id": invoice_id}})


@asynccontextmanager
async def served(app: ASGIApp) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, Any]]]:
    """Run ``app``'s lifespan as a server would, and a client whose requests carry its state."""
    state: dict[str, Any] = {}
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": state}
    lifespan = asyncio.create_task(app(scope, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    assert started["type"] == "lifespan.startup.complete", started

    async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
        await app({**scope, "state": dict(state)}, receive, send)

    try:
        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            yield client, state
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        stopped = await outbox.get()
        await lifespan
        assert stopped["type"] == "lifespan.shutdown.complete", stopped


async def test_starlette_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECEIVER_SECRET", SECRET)
    monkeypatch.setenv("RECEIVER_STORE", f"sqlite:///{tmp_path}/mounted.db")
    mounted = fresh_import("examples.mounted")
    body = invoice("in_1")
    headers = signed("msg_mounted_1", body)
    async with served(mounted.app) as (client, _):
        assert (await client.get("/")).json() == {"app": "host", "webhooks": "/webhooks/billing"}
        first = await client.post("/webhooks/billing", content=body, headers=headers)
        assert first.status_code == 200, first.text
        assert first.json() == {"invoice": "in_1", "status": "paid"}
        again = await client.post("/webhooks/billing", content=body, headers=headers)
        assert again.headers["idempotent-replayed"] == "true"
        assert again.content == first.content
        forged = {**headers, "webhook-id": "msg_other"}
        assert (
            await client.post("/webhooks/billing", content=body, headers=forged)
        ).status_code == 401
        assert (
            await client.post("/webhooks/nobody", content=body, headers=headers)
        ).status_code == 404
        assert (await client.post("/elsewhere", content=body, headers=headers)).status_code == 404


async def app_connections(url: str) -> collections.Counter[str]:
    """Backends connected to the test database, by application_name, except this one."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()
    return collections.Counter(r["application_name"] for r in rows)


async def test_fastapi_app_shares_its_pool(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"fastapi-example-{os.getpid()}"
    # asyncpg passes unknown DSN parameters to the server: every connection of the app's pool
    # carries this name in pg_stat_activity. The receiver is given the pool, not the URL.
    monkeypatch.setenv("DATABASE_URL", f"{pg_url}?application_name={name}")
    monkeypatch.setenv("RECEIVER_SECRET", SECRET)
    example = fresh_import("examples.fastapi_app")
    paid = f"in_{uuid.uuid4().hex[:8]}"
    body = invoice(paid)
    headers = signed(f"msg_fastapi_{paid}", body)

    async with served(example.app) as (client, state):
        pool, rx = state["pool"], state["receiver"]
        assert rx.store.url == "postgresql://(shared pool)"
        first = await client.post("/webhooks/billing", content=body, headers=headers)
        assert first.status_code == 200, first.text
        assert first.json() == {"invoice": paid, "status": "paid"}
        again = await client.post("/webhooks/billing", content=body, headers=headers)
        assert again.headers["idempotent-replayed"] == "true"
        assert again.content == first.content
        # The handler's write, through the receiver's tx, read back through the app's pool.
        row = (await client.get(f"/invoices/{paid}")).json()
        assert row == {"id": paid, "webhook_id": headers["webhook-id"], "client": "127.0.0.1"}

        connected = await app_connections(pg_url)
        assert set(connected) == {name}, f"connections from elsewhere: {connected}"
        assert 1 <= connected[name] <= pool.get_max_size(), connected

    assert (await app_connections(pg_url))[name] == 0  # the lifespan closed the one pool


# -- the standalone example under uvicorn with two workers ---------------------------------------


def workers(pid: int) -> list[int]:
    """uvicorn's worker processes under ``pid`` (not multiprocessing's resource tracker)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            stat = (cmdline.parent / "stat").read_text()
            command = cmdline.read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"spawn_main" in command:
            found.append(int(cmdline.parent.name))
    return found


def wait_for_workers(pid: int, count: int) -> list[int]:
    deadline = time.monotonic() + 15
    while len(found := workers(pid)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


@pytest.fixture
def standalone(pg_url: str, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """``uvicorn examples.standalone:app --workers 2`` as the example's docstring runs it."""
    port = free_port()
    log = (tmp_path / "uvicorn.log").open("wb")
    env = {
        **os.environ,
        "RECEIVER_STORE": pg_url,
        "RECEIVER_SECRET": SECRET,
        "RECEIVER_TRUSTED_PROXIES": "",
    }
    command = [UVICORN, "examples.standalone:app", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", "2", "--no-proxy-headers", "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / "uvicorn.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "uvicorn.log").read_text()
            try:
                httpx.get(f"{url}/", timeout=0.5)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url, process.pid
        assert process.poll() is None, (tmp_path / "uvicorn.log").read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.slow
async def test_standalone_with_two_workers(standalone: tuple[str, int]) -> None:
    url, pid = standalone
    started = wait_for_workers(pid, 2)
    assert len(started) == 2, f"uvicorn worker processes: {started}"

    run = uuid.uuid4().hex[:8]
    ids = [f"in_{run}_{i}" for i in range(30)]
    # No keep-alive: every request is a new connection, which either worker may accept.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def deliver(paid: str) -> list[httpx.Response]:
            body = invoice(paid)
            headers = signed(f"msg_{paid}", body)
            copies = (client.post("/webhooks/billing", content=body, headers=headers) for _ in "ab")
            return list(await asyncio.gather(*copies))

        answers = await asyncio.gather(*(deliver(paid) for paid in ids))
        # What Kong's active health check probes (examples/kong/kong.yml) is there.
        kong = yaml.safe_load((ROOT / "examples" / "kong" / "kong.yml").read_text())
        probe = kong["upstreams"][0]["healthchecks"]["active"]["http_path"]
        assert (await client.get(probe)).status_code == 200

    for paid, got in zip(ids, answers, strict=True):
        statuses = sorted(g.status_code for g in got)
        fresh = [g for g in got if g.status_code == 200 and "idempotent-replayed" not in g.headers]
        assert len(fresh) == 1, (paid, statuses, [g.content for g in got])
        assert fresh[0].json() == {"invoice": paid, "status": "paid"}
        assert statuses in ([200, 200], [200, 409]), (paid, statuses)
    assert sorted(workers(pid)) == sorted(started), "a worker died or was replaced"


def test_the_examples_need_their_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECEIVER_SECRET", raising=False)
    with pytest.raises(KeyError, match="RECEIVER_SECRET"):
        fresh_import("examples.standalone")


def test_standalone_trusts_the_proxies_it_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECEIVER_SECRET", SECRET)
    monkeypatch.setenv("RECEIVER_STORE", "sqlite:///:memory:")
    monkeypatch.setenv("RECEIVER_TRUSTED_PROXIES", "10.0.0.0/24, ::1")
    standalone = fresh_import("examples.standalone")
    assert [str(n) for n in standalone.rx.trusted_proxies.networks] == ["10.0.0.0/24", "::1/128"]
