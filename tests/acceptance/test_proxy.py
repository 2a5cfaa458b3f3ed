"""Behind a gateway: real ``receiver serve`` replicas on one PostgreSQL database, behind a real
reverse proxy, and the Kong configuration in examples/kong/.

Kong itself cannot be installed from the package registries here, so the proxy is an nginx
stand-in for Kong's proxy behaviour (tests/acceptance/nginx/kong-like.conf: buffered request
bodies with Kong's 8k memory buffer, X-Forwarded-For appended, X-Real-IP, X-Kong-Request-Id,
the next upstream on a connection error, a short read timeout). nginx comes from Debian's
package (scripts/ensure-tools); these tests fail, never skip, without it.

The sender connects from 127.0.0.2, a loopback address of its own, so that it is not mistaken
for the proxy (127.0.0.1, the only trusted proxy). The replicas run with uvicorn's own
proxy-header handling off (FORWARDED_ALLOW_IPS empty): the receiver's ``trusted_proxies`` alone
decides who the client is.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
import yaml

from receiver._webhooks.app import DEFAULT_MAX_BODY
from tests.pgcluster import free_port
from tests.servers import ROOT, Server, running, start_server
from tests.support import PROVIDER, SECRET, body_of, signed

NGINX_CONF = Path(__file__).parent / "nginx" / "kong-like.conf"
KONG_DIR = ROOT / "examples" / "kong"
SENDER = "127.0.0.2"  # "the internet"
BALANCER = "127.0.0.3"  # a load balancer in front of the proxy, trusted like the proxy
KONG_DEFAULT = "error timeout"  # Kong's, i.e. nginx's, proxy_next_upstream
NON_IDEMPOTENT = "error timeout non_idempotent"  # Kong with nginx_proxy_proxy_next_upstream set


# -- nginx ---------------------------------------------------------------------------------------


def nginx_binary() -> str:
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if found is None:
        pytest.fail("nginx not found: run scripts/ensure-tools (installs Debian's nginx package)")
    return found


class Nginx:
    """nginx on a loopback port with everything (config, pid, logs, temp files) in ``prefix``."""

    def __init__(
        self,
        prefix: Path,
        upstreams: list[str],
        *,
        read_timeout: str = "10s",
        next_upstream: str = KONG_DEFAULT,
    ) -> None:
        self.prefix = prefix
        self.port = free_port()
        prefix.mkdir(parents=True, exist_ok=True)
        values = {
            "PREFIX": str(prefix),
            "PORT": str(self.port),
            # Workers must reach the 0700 temp prefix; as an ordinary user nginx has no choice.
            "USER": "user root;" if os.geteuid() == 0 else "",
            "SERVERS": "\n".join(f"        server {u};" for u in upstreams),
            "READ_TIMEOUT": read_timeout,
            "NEXT_UPSTREAM": next_upstream,
        }
        text = NGINX_CONF.read_text()
        for name, value in values.items():
            text = text.replace(f"@@{name}@@", value)
        assert "@@" not in text, text
        (prefix / "nginx.conf").write_text(text)
        command = [nginx_binary(), "-p", str(prefix), "-c", str(prefix / "nginx.conf")]
        command += ["-e", str(prefix / "error.log")]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=(prefix / "stderr").open("wb")
        )
        deadline = time.monotonic() + 10
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.process.returncode}:\n{self.errors()}")
            try:  # connect only: a request would already mark a dead upstream as failed
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"nginx did not start:\n{self.errors()}") from None
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def errors(self) -> str:
        logs = [self.prefix / "stderr", self.prefix / "error.log"]
        return "\n".join(p.read_text(errors="replace") for p in logs if p.exists())

    def access(self, request_id: str) -> dict[str, str]:
        """The access log line of one request: its upstream addresses and statuses. nginx
        writes it after the answer is sent, so it may take a moment to appear."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for line in (self.prefix / "access.log").read_text().splitlines():
                if line.startswith(request_id + " "):
                    found = re.search(r"upstream=\[(.*?)\] upstream_status=\[(.*?)\]", line)
                    assert found is not None, line
                    return {"upstream": found[1], "upstream_status": found[2]}
            time.sleep(0.02)
        raise AssertionError(f"{request_id} not in the access log:\n{self.errors()}")

    def __enter__(self) -> Nginx:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Site:
    """Receiver replicas on one database, and what they record."""

    pg_url: str
    root: Path
    a: Server
    b: Server

    @property
    def invocations(self) -> Path:
        return self.root / "invocations"

    def env(self, name: str, **extra: str) -> dict[str, str]:
        """A replica's environment: this site's database, invocations file and log file."""
        return replica_env(self.root, self.pg_url, name, **extra)

    def executions(self, webhook_id: str) -> list[str]:
        """Handler invocations of one delivery, committed or not (from the test app's file)."""
        lines = self.invocations.read_text().splitlines() if self.invocations.exists() else []
        return [line for line in lines if line.split()[0] == webhook_id]

    async def effects(self, webhook_id: str) -> int:
        conn = await asyncpg.connect(self.pg_url)
        try:
            return int(
                await conn.fetchval(
                    "SELECT count(*) FROM effects WHERE webhook_id = $1", webhook_id
                )
            )
        finally:
            await conn.close()


def replica_env(site: Path, pg_url: str, name: str, **extra: str) -> dict[str, str]:
    return {
        "RECEIVER_STORE": pg_url,
        "RECEIVER_SECRET": SECRET,
        "RECEIVER_TEST_INVOCATIONS": str(site / "invocations"),
        "RECEIVER_TEST_CRASH": "",
        "RECEIVER_TEST_CRASH_IDS": "",
        "RECEIVER_TEST_SLOW": "0",
        "RECEIVER_TEST_EXTERNAL": "",
        "RECEIVER_TEST_TRUSTED_PROXIES": f"127.0.0.1,{BALANCER}",
        "RECEIVER_TEST_LOG": str(site / f"{name}.jsonl"),
        "FORWARDED_ALLOW_IPS": "",  # uvicorn: trust no proxy itself
        **extra,
    }


@pytest.fixture(scope="module")
def site(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    nginx_binary()  # fail first, and clearly, without nginx
    root = tmp_path_factory.mktemp("site")
    a = start_server(replica_env(root, pg_url, "a"), root / "a.log")
    try:
        b = start_server(replica_env(root, pg_url, "b"), root / "b.log")
    except BaseException:
        a.stop()
        raise
    try:
        yield Site(pg_url, root, a, b)
    finally:
        a.stop()
        b.stop()


@pytest.fixture(scope="module")
def proxy(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    """Kong-like defaults in front of both replicas, round robin."""
    nginx = Nginx(
        tmp_path_factory.mktemp("nginx"),
        [f"127.0.0.1:{site.a.port}", f"127.0.0.1:{site.b.port}"],
    )
    yield nginx
    nginx.stop()


@pytest.fixture
async def sender() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.AsyncHTTPTransport(local_address=SENDER)
    async with httpx.AsyncClient(transport=transport, timeout=30) as client:
        yield client


def new_id(label: str) -> str:
    return f"msg_{label}_{uuid.uuid4().hex[:12]}"


def is_replay(answer: httpx.Response) -> bool:
    return answer.headers.get("idempotent-replayed") == "true"


async def post(
    client: httpx.AsyncClient, url: str, body: bytes, webhook_id: str, **headers: str
) -> httpx.Response:
    extra = {k.replace("_", "-"): v for k, v in headers.items()}
    return await client.post(
        f"{url}/{PROVIDER}", content=body, headers={**signed(webhook_id, body), **extra}
    )


def echo_body(size: int) -> bytes:
    """A JSON body of exactly ``size`` bytes that no re-serialization would reproduce: odd
    whitespace and key order, escapes, raw UTF-8, CRLF."""
    head = '{ "type" :"echo.request",\n\t"data": {"z": 1, "a": "\\u00e9\\/ é€", "pad": "'
    tail = b'"}\r\n}'
    start = head.encode()
    body = start + b"0123456789 " * (size // 11) + tail
    body = start + body[len(start) : size - len(tail)] + tail
    assert len(body) == size
    assert orjson.loads(body)["type"] == "echo.request"
    return body


# -- through the proxy ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("size", [300, 60 * 1024, DEFAULT_MAX_BODY], ids=["small", "60KiB", "1MiB"])
async def test_signed_bodies_arrive_byte_for_byte(
    proxy: Nginx, site: Site, sender: httpx.AsyncClient, size: int
) -> None:
    body = echo_body(size)
    webhook_id = new_id("bytes")
    answer = await post(sender, proxy.url, body, webhook_id)
    # 200 means the signature verified over the bytes the receiver got; the digest says so twice.
    assert answer.status_code == 200, (answer.status_code, answer.text, proxy.errors())
    seen = answer.json()
    assert (seen["size"], seen["sha256"]) == (size, hashlib.sha256(body).hexdigest())
    assert len(site.executions(webhook_id)) == 1
    again = await post(sender, proxy.url, body, webhook_id)
    assert is_replay(again)
    assert again.content == answer.content


@pytest.mark.slow
async def test_the_proxy_and_the_receiver_refuse_the_same_sizes(
    proxy: Nginx, site: Site, sender: httpx.AsyncClient
) -> None:
    body = echo_body(DEFAULT_MAX_BODY + 1)
    webhook_id = new_id("too_big")
    answer = await post(sender, proxy.url, body, webhook_id)
    assert answer.status_code == 413
    assert proxy.access(answer.headers["x-kong-request-id"])["upstream"] == "-"  # not forwarded
    assert site.executions(webhook_id) == []


@pytest.mark.slow
async def test_the_client_is_the_sender_whatever_it_claims(
    proxy: Nginx, site: Site, sender: httpx.AsyncClient
) -> None:
    spoof = {"x_forwarded_for": "203.0.113.66, 127.0.0.1", "x_real_ip": "203.0.113.66"}

    async def client_seen(via: httpx.AsyncClient, url: str, label: str, **headers: str) -> Any:
        webhook_id = new_id(label)
        answer = await post(via, url, body_of("echo.request", id=webhook_id), webhook_id, **headers)
        assert answer.status_code == 200, answer.text
        return answer.json()["client"]

    # Through the proxy: the proxy appended the sender's address; all left of it is the sender's.
    assert await client_seen(sender, proxy.url, "spoof", **spoof) == SENDER
    # Straight to a replica: an untrusted peer's headers count for nothing.
    assert await client_seen(sender, site.a.url, "direct", **spoof) == SENDER
    # Through a trusted load balancer, then the proxy: the balancer's peer is the client.
    transport = httpx.AsyncHTTPTransport(local_address=BALANCER)
    async with httpx.AsyncClient(transport=transport, timeout=30) as balancer:
        forwarded = {"x_forwarded_for": "203.0.113.66, 198.51.100.23"}
        assert await client_seen(balancer, proxy.url, "balanced", **forwarded) == "198.51.100.23"


@pytest.mark.slow
async def test_the_request_id_reaches_the_logs(
    proxy: Nginx, site: Site, sender: httpx.AsyncClient
) -> None:
    webhook_id = new_id("logged")
    body = body_of("echo.request", id=webhook_id)
    headers = {**signed(webhook_id, body), "x-kong-request-id": "from-the-sender"}
    answer = await sender.post(f"{proxy.url}/{PROVIDER}", content=body, headers=headers)
    request_id = answer.headers["x-kong-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id), request_id  # the proxy's, not the sender's
    assert answer.json()["request_id"] == request_id  # what the handler saw

    logs = ""
    deadline = time.monotonic() + 5
    while webhook_id not in logs and time.monotonic() < deadline:
        logs = "".join(p.read_text() for p in site.root.glob("*.jsonl"))
        await asyncio.sleep(0.05)
    records = [orjson.loads(line) for line in logs.splitlines() if webhook_id in line]
    decisions = [(r["outcome"], r["request_id"], r["provider"]) for r in records if "outcome" in r]
    assert decisions == [("executed", request_id, PROVIDER)], records
    signature = headers["webhook-signature"].split(",", 1)[1]
    for secret in (SECRET, SECRET.removeprefix("whsec_"), signature):
        assert secret not in logs


# -- upstream retries ----------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_refused_connection_moves_on_to_the_next_replica(
    site: Site, sender: httpx.AsyncClient, tmp_path: Path
) -> None:
    """Kong's defaults: a replica that died refuses the connection; the proxy sends the delivery
    to the next one, which runs it once."""
    with running(site.env("doomed"), tmp_path / "doomed.log") as doomed:
        doomed.kill()
    webhook_id = new_id("refused")
    upstreams = [f"127.0.0.1:{doomed.port}", f"127.0.0.1:{site.b.port} backup"]
    with Nginx(tmp_path / "nginx", upstreams) as nginx:
        answer = await post(sender, nginx.url, body_of(order="o-1"), webhook_id)
        assert answer.status_code == 200, answer.text
        assert not is_replay(answer)
        tried = nginx.access(answer.headers["x-kong-request-id"])
        assert tried["upstream_status"] == "502, 200", tried
        assert tried["upstream"] == f"127.0.0.1:{doomed.port}, 127.0.0.1:{site.b.port}"
    assert len(site.executions(webhook_id)) == 1
    assert await site.effects(webhook_id) == 1


@pytest.mark.slow
@pytest.mark.parametrize("next_upstream", [KONG_DEFAULT, NON_IDEMPOTENT])
async def test_a_connection_dropped_after_the_commit(
    site: Site, sender: httpx.AsyncClient, tmp_path: Path, next_upstream: str
) -> None:
    """The first replica commits the delivery and dies before answering: the proxy sees the
    connection drop. With Kong's defaults the POST is not re-sent: the sender gets a 502 and its
    retry reaches the other replica, which replays. With non_idempotent the proxy re-sends it to
    the other replica at once: a replay again. One execution either way."""
    webhook_id = new_id("dropped")
    env = site.env(
        "crash",
        RECEIVER_TEST_CRASH="after_commit",
        RECEIVER_TEST_CRASH_IDS=webhook_id,
    )
    body = body_of(order="o-dropped")
    with (
        running(env, tmp_path / "crash.log") as crashing,
        Nginx(
            tmp_path / "nginx",
            [f"127.0.0.1:{crashing.port}", f"127.0.0.1:{site.b.port} backup"],
            next_upstream=next_upstream,
        ) as nginx,
    ):
        answer = await post(sender, nginx.url, body, webhook_id)
        tried = nginx.access(answer.headers["x-kong-request-id"])
        if next_upstream == KONG_DEFAULT:
            assert answer.status_code == 502, answer.text
            assert tried["upstream_status"] == "502", tried
            answer = await post(sender, nginx.url, body, webhook_id)  # the sender's retry
        else:
            assert tried["upstream_status"] == "502, 200", tried
        assert answer.status_code == 200, answer.text
        assert is_replay(answer)
        assert answer.json() == {"order": "o-dropped", "fence": 1}
    runs = site.executions(webhook_id)
    assert [run.split()[2] for run in runs] == [str(crashing.process.pid)], runs
    assert await site.effects(webhook_id) == 1


@pytest.mark.slow
@pytest.mark.parametrize("next_upstream", [KONG_DEFAULT, NON_IDEMPOTENT])
async def test_a_read_timeout_shorter_than_the_handler(
    site: Site, sender: httpx.AsyncClient, tmp_path: Path, next_upstream: str
) -> None:
    """The proxy gives up on a slow handler after 1 s; the handler goes on and commits at 3 s.
    With Kong's defaults the sender sees 504; with non_idempotent the proxy re-sends the POST to
    the other replica, which answers 409 (in flight). The sender retries while the handler runs
    (409 with Retry-After) and after it finished (the replay). One execution."""
    webhook_id = new_id("slow")
    body = body_of(order="o-slow")
    with (
        running(site.env("slow", RECEIVER_TEST_SLOW="3"), tmp_path / "slow.log") as slow,
        Nginx(
            tmp_path / "nginx",
            [f"127.0.0.1:{slow.port}", f"127.0.0.1:{site.b.port} backup"],
            read_timeout="1s",
            next_upstream=next_upstream,
        ) as nginx,
    ):
        started = time.monotonic()
        first = await post(sender, nginx.url, body, webhook_id)
        assert time.monotonic() - started < 2.5, "the proxy waited for the handler"
        assert first.status_code == (504 if next_upstream == KONG_DEFAULT else 409), first.text
        statuses = [first.status_code]
        answer = first
        while answer.status_code != 200 and time.monotonic() - started < 20:
            answer = await post(sender, nginx.url, body, webhook_id)
            statuses.append(answer.status_code)
            if answer.status_code == 409:
                assert int(answer.headers["retry-after"]) >= 1
                await asyncio.sleep(0.25)  # a patient sender would wait Retry-After seconds
        assert 409 in statuses[1:], statuses  # retried while the handler still ran
        assert answer.status_code == 200, statuses
        assert is_replay(answer)
        assert answer.json() == {"order": "o-slow", "fence": 1}
    runs = site.executions(webhook_id)
    assert [run.split()[2] for run in runs] == [str(slow.process.pid)], runs
    assert await site.effects(webhook_id) == 1


# -- the Kong configuration ----------------------------------------------------------------------


def kong() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((KONG_DIR / "kong.yml").read_text())
    return config


def plugin(service: dict[str, Any], name: str) -> dict[str, Any]:
    found = [p for p in service.get("plugins", []) if p["name"] == name]
    assert len(found) == 1, (name, service.get("plugins"))
    config: dict[str, Any] = found[0]["config"]
    return config


UNITS = {"bytes": 1, "kilobytes": 1024, "megabytes": 1024 * 1024}


def test_kong_config_routes_webhooks_to_the_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    config = kong()
    assert config["_format_version"] == "3.0"
    [upstream] = config["upstreams"]
    [service] = config["services"]
    [route] = service["routes"]
    assert service["host"] == upstream["name"]

    # The path the sender uses reaches the receiver as it is: the example replica mounts the
    # receiver at the route's path.
    assert route["methods"] == ["POST"]
    assert route["strip_path"] is False
    [path] = route["paths"]
    monkeypatch.setenv("RECEIVER_SECRET", SECRET)
    monkeypatch.setenv("RECEIVER_STORE", "sqlite:///:memory:")
    import examples.standalone as replica

    [mount] = replica.app.routes
    assert path.rstrip("/") == mount.path == "/webhooks"

    targets = [t["target"] for t in upstream["targets"]]
    assert len(targets) == 2
    assert all(re.fullmatch(r"[\w.-]+:\d+", t) for t in targets), targets
    checks = upstream["healthchecks"]
    # Kong's default interval 0 means "off": both must be set for active checks to run.
    assert checks["active"]["healthy"]["interval"] > 0
    assert checks["active"]["unhealthy"]["interval"] > 0
    assert checks["active"]["http_path"].startswith(path)
    # A delivery's own 500 (handler failed) or 503 (store away) says nothing about the replica.
    passive = checks["passive"]["unhealthy"]
    assert not {500, 503} & set(passive["http_statuses"]), passive
    assert passive["tcp_failures"] > 0
    assert passive["timeouts"] > 0


def test_kong_config_limits_match_the_receiver() -> None:
    [service] = kong()["services"]
    size = plugin(service, "request-size-limiting")
    assert size["allowed_payload_size"] * UNITS[size["size_unit"]] == DEFAULT_MAX_BODY
    # The worst case (every retry's connect times out, then a full read) stays below the 15 s
    # that the shortest-waiting Standard Webhooks senders allow.
    worst = service["retries"] * service["connect_timeout"] + service["read_timeout"]
    assert worst < 15_000, worst
    assert 0 < service["read_timeout"] <= 10_000
    # The request id the receiver logs: X-Kong-Request-Id (Kong 3.5+), else X-Request-Id.
    assert plugin(service, "correlation-id")["header_name"].lower() == "x-request-id"
    # Not enabled: README.md explains why, and what it would need (a 1m body buffer).
    assert "standard-webhooks" not in [p["name"] for p in service["plugins"]]


def test_kong_readme_describes_this_config() -> None:
    readme = (KONG_DIR / "README.md").read_text()
    config = kong()
    [upstream] = config["upstreams"]
    [service] = config["services"]
    mentioned = [upstream["name"], service["name"], *(p["name"] for p in service["plugins"])]
    mentioned += [t["target"] for t in upstream["targets"]] + ["standard-webhooks", "retries"]
    mentioned += ["client_body_buffer_size", "nginx stand-in"]
    assert [m for m in mentioned if m not in readme] == []


def test_the_nginx_stand_in_keeps_kongs_limits() -> None:
    conf = NGINX_CONF.read_text()
    [service] = kong()["services"]
    size = plugin(service, "request-size-limiting")
    assert re.search(r"client_max_body_size 1m;", conf)  # nginx's m is MiB
    assert size["allowed_payload_size"] * UNITS[size["size_unit"]] == 1024 * 1024
    assert re.search(r"client_body_buffer_size 8k;", conf)  # Kong's default
    assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in conf
    assert "proxy_set_header X-Kong-Request-Id $request_id;" in conf
