"""The idempotency proxy as it runs: a real ``receiver proxy`` process in front of a real
upstream process (tests/apps/upstream.py, uvicorn on loopback) that counts what it acts on.

Retries replay byte for byte and reach the upstream once; 100 concurrent copies through one
barrier reach it once; another body with the same key is 422; a proxy SIGKILLed after the
upstream answered and before the answer was stored never has the retry forwarded again (it
is reconciled, or needs review and the console lists it); the upstream down (released), slow
and answering 5xx (kept for reconcile, never re-forwarded blindly), or 503 (released); headers,
streaming, the body limit, TLS to the upstream and the proxy's metrics.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from receiver import Console, store_from_url
from tests.conftest import truncate
from tests.pgcluster import free_port
from tests.servers import RECEIVER, ROOT

pytestmark = pytest.mark.slow

PAYMENT = {"order": "8891", "amount": 1200}


class Process:
    def __init__(self, argv: Sequence[str], port: int, log: Path, env: dict[str, str]) -> None:
        self.port = port
        self.log = log
        handle = log.open("wb")
        self.process = subprocess.Popen(
            list(argv), cwd=ROOT, env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, scheme: str = "http", verify: Any = False) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"exited {self.process.returncode}:\n{self.log.read_text()}")
            try:
                httpx.get(f"{scheme}://127.0.0.1:{self.port}/calls", timeout=0.5, verify=verify)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextmanager
def upstream(
    tmp_path: Path,
    port: int | None = None,
    tls: tuple[Path, Path] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Process]:
    port = port or free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "tests.apps.upstream:app",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    if tls is not None:
        argv += ["--ssl-certfile", str(tls[0]), "--ssl-keyfile", str(tls[1])]
    up = Process(argv, port, tmp_path / f"upstream-{port}.log", env or {})
    try:
        up.wait_ready("https" if tls else "http")
        yield up
    finally:
        up.stop()


@contextmanager
def proxy(
    tmp_path: Path,
    upstream_url: str,
    store: str,
    *options: str,
    app: str | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Process]:
    port = free_port()
    if app is None:
        argv = [
            RECEIVER,
            "proxy",
            "--upstream",
            upstream_url,
            "--store",
            store,
            "--port",
            str(port),
            "--log-level",
            "warning",
            *options,
        ]
    else:
        env = {**(env or {}), "RECEIVER_STORE": store}
        argv = [RECEIVER, "serve", "--app", app, "--port", str(port), "--log-level", "warning"]
    p = Process(
        argv,
        port,
        tmp_path / f"proxy-{port}.log",
        {"RECEIVER_TEST_UPSTREAM": upstream_url, **(env or {})},
    )
    try:
        p.wait_ready()
        yield p
    finally:
        p.stop()


def calls(up: Process) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.get(f"{up.url}/calls").json()
    return found


def pay(
    p: Process, key: str, body: Any = PAYMENT, query: str = "", **headers: str
) -> httpx.Response:
    return httpx.post(
        f"{p.url}/payments{query}",
        content=orjson.dumps(body),
        headers={"idempotency-key": key, "content-type": "application/json", **headers},
        timeout=30,
    )


def sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'proxy.db'}"


async def state(url: str, key: str, principal: str = "anonymous") -> tuple[str, int | None]:
    async with store_from_url(url) as store, store.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT state, response_status FROM receiver_receipts WHERE provider = $1 "
            "AND webhook_id = $2",
            "proxy:default",
            orjson.dumps([principal, key]).decode(),
        )
    assert row is not None, key
    return str(row["state"]), row["response_status"]


def test_retries_replay_the_stored_answer_and_reach_the_upstream_once(tmp_path: Path) -> None:
    with upstream(tmp_path) as up, proxy(tmp_path, up.url, sqlite(tmp_path)) as p:
        first = pay(p, "k-1")
        again = [pay(p, "k-1") for _ in range(3)]
        assert first.status_code == 201
        for r in again:
            assert (r.status_code, r.content) == (201, first.content)
            assert r.headers["content-type"] == first.headers["content-type"]
            assert r.headers["x-payment"] == first.headers["x-payment"]
            assert r.headers["idempotent-replayed"] == "true"
        assert "idempotent-replayed" not in first.headers
        made = calls(up)
        assert len(made) == 1
        # The upstream got a derived key, stable per client and key, never the client's.
        assert made[0]["key"].startswith("rcv_")
        assert made[0]["key"] != "k-1"
        # Another body with the same key: 422, not forwarded.
        other = pay(p, "k-1", {"order": "8891", "amount": 1300})
        assert other.status_code == 422
        assert other.headers["content-type"] == "application/problem+json"
        # Another client (another Authorization) with the same key: its own request.
        theirs = pay(p, "k-1", authorization="Bearer other")
        assert theirs.status_code == 201
        assert theirs.content != first.content
        assert len(calls(up)) == 2


def test_a_hundred_concurrent_copies_reach_the_upstream_once(tmp_path: Path, pg_url: str) -> None:
    asyncio.run(truncate(pg_url))
    with upstream(tmp_path) as up, proxy(tmp_path, up.url, pg_url) as p:

        async def race() -> list[httpx.Response]:
            barrier = asyncio.Barrier(100)
            limits = httpx.Limits(max_connections=100)
            async with httpx.AsyncClient(limits=limits, timeout=30) as client:

                async def one() -> httpx.Response:
                    await barrier.wait()
                    return await client.post(
                        f"{p.url}/payments?sleep=0.5",
                        content=orjson.dumps(PAYMENT),
                        headers={"idempotency-key": "race-1"},
                    )

                return list(await asyncio.gather(*(one() for _ in range(100))))

        answers = asyncio.run(race())
        statuses = sorted(r.status_code for r in answers)
        assert statuses.count(201) >= 1
        assert set(statuses) <= {201, 409}
        fresh = [
            r for r in answers if r.status_code == 201 and "idempotent-replayed" not in r.headers
        ]
        assert len(fresh) == 1
        assert all(int(r.headers["retry-after"]) >= 1 for r in answers if r.status_code == 409)
        assert len(calls(up)) == 1
        after = pay(p, "race-1", query="?sleep=0.5")
        assert (after.status_code, after.content) == (201, fresh[0].content)
        assert len(calls(up)) == 1


@pytest.mark.parametrize("reconcile", [False, True])
def test_a_proxy_killed_after_the_upstream_answered_never_forwards_again(
    tmp_path: Path, reconcile: bool
) -> None:
    store = sqlite(tmp_path)
    with upstream(tmp_path) as up:
        with proxy(
            tmp_path,
            up.url,
            store,
            app="tests.apps.proxy_crash:app",
            env={"RECEIVER_TEST_LEASE": "3"},
        ) as dying:
            with pytest.raises(httpx.TransportError):
                pay(dying, "crash-1")
            dying.process.wait(timeout=10)
            assert dying.process.returncode == -9  # SIGKILL, after the upstream acted
        assert len(calls(up)) == 1
        assert asyncio.run(state(store, "crash-1")) == ("in_flight", None)
        options = ["--lease", "3", "--timeout", "1"]
        if reconcile:
            options += ["--reconcile", "tests.apps.upstream:reconcile"]
        with proxy(tmp_path, up.url, store, *options) as survivor:
            early = pay(survivor, "crash-1")
            if b"in-flight" in early.content:  # within the dead attempt's lease
                assert early.status_code == 409
                assert early.headers["retry-after"]
            time.sleep(3.2)
            settled = pay(survivor, "crash-1")
            again = pay(survivor, "crash-1")
            assert len(calls(up)) == 1  # never forwarded again
            if reconcile:
                original = calls(up)[0]
                assert settled.status_code == 201
                assert orjson.loads(settled.content)["id"] == original["id"]
                assert asyncio.run(state(store, "crash-1")) == ("completed", 201)
            else:
                assert settled.status_code == 409
                assert orjson.loads(settled.content)["error"] == "needs_review"
                assert asyncio.run(state(store, "crash-1")) == ("failed", 409)
                asyncio.run(_console_lists_it(store))
            assert (again.status_code, again.content) == (settled.status_code, settled.content)


async def _console_lists_it(url: str) -> None:
    async with store_from_url(url) as store:
        console = Console(store)
        transport = httpx.ASGITransport(app=console, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            page = await client.get("/attention", params={"list": "needs_review"})
            assert page.status_code == 200, page.text
            assert "proxy:default" in page.text
            overview = await client.get("/")
            assert "proxy:default" in overview.text
            key = orjson.dumps(["anonymous", "crash-1"]).decode()
            shown = await client.get("/receipt", params={"provider": "proxy:default", "id": key})
            assert shown.status_code == 200
            assert "needs review" in shown.text
            listed = await client.get("/keys", params={"provider": "proxy:default"})
            assert "crash-1" in listed.text


def test_upstream_down_slow_and_failing(tmp_path: Path) -> None:
    store = sqlite(tmp_path)
    port = free_port()
    down = f"http://127.0.0.1:{port}"
    with proxy(
        tmp_path, down, store, "--lease", "3", "--timeout", "1", "--connect-timeout", "1"
    ) as p:
        # Down: nothing was sent, so the key is given back, and the retry goes through later.
        refused = pay(p, "down-1")
        assert refused.status_code == 502
        assert refused.headers["retry-after"]
        assert asyncio.run(state(store, "down-1"))[0] == "released"
        with upstream(tmp_path, port) as up:
            later = pay(p, "down-1")
            assert later.status_code == 201
            assert len(calls(up)) == 1
            # Slow: the upstream acted after the proxy gave up. Kept, never forwarded again.
            slow = pay(p, "slow-1", query="?sleep=2")
            assert slow.status_code == 504
            assert asyncio.run(state(store, "slow-1"))[0] == "in_flight"
            time.sleep(1.5)
            assert len(calls(up)) == 2
            retried = pay(p, "slow-1", query="?sleep=2")
            assert retried.status_code == 409
            assert b"needs_review" in retried.content
            assert len(calls(up)) == 2
            # A 500 that acted: passed on, not stored as the answer, not forwarded again.
            failed = pay(p, "err-1", query="?status=500")
            assert failed.status_code == 500
            assert "idempotent-replayed" not in failed.headers
            assert asyncio.run(state(store, "err-1")) == ("in_flight", None)
            assert pay(p, "err-1", query="?status=500").status_code == 409
            assert len(calls(up)) == 3
            # A 503 says "not now": given back, and the retry is forwarded.
            busy = pay(p, "busy-1", query="?refuse=1")
            assert busy.status_code == 503
            assert asyncio.run(state(store, "busy-1"))[0] == "released"
            assert pay(p, "busy-1", query="?refuse=1").status_code == 503
            assert len(calls(up)) == 3


def test_headers_streaming_limits_and_metrics(tmp_path: Path) -> None:
    metrics_port = free_port()
    with (
        upstream(tmp_path) as up,
        proxy(
            tmp_path,
            up.url,
            sqlite(tmp_path),
            "--max-body-size",
            "100",
            "--metrics-port",
            str(metrics_port),
            "--required",
            "/payments",
        ) as p,
    ):
        echoed = httpx.get(
            f"{p.url}/echo",
            headers={
                "connection": "x-private",
                "x-private": "1",
                "x-kept": "2",
                "proxy-authorization": "Basic c2VjcmV0",
                "x-forwarded-host": "bank.example",
                "x-forwarded-proto": "https",
            },
        ).json()
        assert echoed["x-kept"] == "2"
        assert "x-private" not in echoed
        assert "proxy-authorization" not in echoed
        assert echoed["x-forwarded-for"] == "127.0.0.1"
        assert echoed["host"] == f"127.0.0.1:{up.port}"
        # What the proxy saw, not what a client that is no trusted proxy claims.
        assert echoed["x-forwarded-host"] == f"127.0.0.1:{p.port}"
        assert echoed["x-forwarded-proto"] == "http"
        assert "transfer-encoding" not in echoed  # a GET goes on without a body
        posted = httpx.post(f"{p.url}/echo", content=b"abc").json()  # no key: passed through
        assert posted["content-length"] == "3"
        assert "transfer-encoding" not in posted
        with httpx.stream("GET", f"{p.url}/stream") as streamed:
            parts = list(streamed.iter_raw())
        assert b"".join(parts) == b"".join(f"chunk {i}\n".encode() for i in range(5))
        big = pay(p, "big-1", {"note": "x" * 200})
        assert big.status_code == 413
        keyless = httpx.post(f"{p.url}/payments", content=b"{}")
        assert keyless.status_code == 400
        # One Date and one Server, the proxy's server's: the upstream's are not forwarded
        # beside them, whether passed through, forwarded or replayed.
        for answer in (httpx.get(f"{p.url}/echo"), pay(p, "m-1"), pay(p, "m-1")):
            assert answer.status_code in (200, 201)
            assert len(answer.headers.get_list("date")) == 1, answer.headers
            assert answer.headers.get_list("server") == ["uvicorn"], answer.headers
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert 'receiver_proxy_requests_total{outcome="forwarded"} 1.0' in scraped
        assert 'receiver_proxy_requests_total{outcome="replayed"} 1.0' in scraped
        assert 'receiver_proxy_requests_total{outcome="refused"} 2.0' in scraped
        assert len(calls(up)) == 1


def test_a_trusted_proxys_forwarding_headers_are_passed_on(tmp_path: Path) -> None:
    claims = {"x-forwarded-host": "bank.example", "x-forwarded-proto": "https"}
    with (
        upstream(tmp_path) as up,
        proxy(tmp_path, up.url, sqlite(tmp_path), "--trusted-proxies", "127.0.0.0/8") as p,
    ):
        echoed = httpx.get(f"{p.url}/echo", headers=claims).json()
    assert echoed["x-forwarded-host"] == "bank.example"
    assert echoed["x-forwarded-proto"] == "https"


def test_tls_to_the_upstream(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    up = Process(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "tests.apps.upstream:app",
            "--port",
            str(port),
            "--ssl-certfile",
            str(cert),
            "--ssl-keyfile",
            str(key),
            "--log-level",
            "warning",
        ],
        port,
        tmp_path / "tls-upstream.log",
        {},
    )
    try:
        up.wait_ready("https", verify=False)
        url = f"https://127.0.0.1:{port}"
        with proxy(tmp_path, url, sqlite(tmp_path), "--upstream-ca", str(cert)) as trusted:
            assert pay(trusted, "tls-1").status_code == 201
        with proxy(tmp_path, url, sqlite(tmp_path), "--namespace", "untrusted") as untrusted:
            # An unknown certificate: no TLS session, nothing sent, the key given back.
            assert pay(untrusted, "tls-2").status_code == 502
        seen = httpx.get(f"{url}/calls", verify=False).json()
        assert [c["body"] for c in seen] == [orjson.dumps(PAYMENT).decode()]
    finally:
        up.stop()
