"""The real ``receiver`` command on the mistakes a person makes: each is one line on stderr and
exit status 2, with nothing created or changed; and ``send`` fails like ``curl --fail``."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from starlette.responses import Response

from receiver import Event, Provider, Receiver
from receiver._store.base import Connection
from tests.pgcluster import free_port
from tests.servers import RECEIVER, ROOT
from tests.support import PROVIDER, SECRET, body_of, signed


def receiver(
    *args: str | bytes, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    return subprocess.run(
        [RECEIVER, *args],
        cwd=cwd,
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        errors="replace",
        timeout=60,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The command failed with status 2 and a single ``receiver: ...`` line, no traceback."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("receiver"), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def a_completed_receipt(store_url: str) -> None:
    async def run() -> None:
        rx = Receiver(store_url, [Provider(PROVIDER, [SECRET])], sweep_interval=None)

        @rx.on("order.created")
        async def created(event: Event, tx: Connection) -> None:
            pass

        async with rx:
            body = body_of(order="o-1")
            assert (await rx.deliver(PROVIDER, signed("msg_1", body), body)).status_code == 200

    asyncio.run(run())


def test_a_non_utf8_id_is_a_one_line_error(store_url: str) -> None:
    a_completed_receipt(store_url)
    line = one_line_error(receiver("inspect", PROVIDER, b"msg_\xff\xfe", "--store", store_url))
    assert "not valid UTF-8" in line
    assert "msg_\\xff\\xfe" in line
    line = one_line_error(receiver("inspect", b"\xffacme", "msg_1", "--store", store_url))
    assert "provider" in line
    replayed = receiver("replay", PROVIDER, b"msg_\xff", "--app", "tests.apps.deadletter:rx")
    assert "not valid UTF-8" in one_line_error(replayed)
    # The receipt itself is still there, and still readable.
    shown = receiver("inspect", PROVIDER, "msg_1", "--store", store_url)
    assert shown.returncode == 0, shown.stderr
    assert "state        completed" in shown.stdout


@pytest.mark.parametrize("limit", ["-1", "0"])
def test_a_limit_that_is_not_positive_is_a_one_line_error(tmp_path: Path, limit: str) -> None:
    store = f"sqlite:///{tmp_path}/r.db"
    a_completed_receipt(store)
    for args in (["failed", "--store", store], ["replay", "--all-failed"]):
        done = receiver(*args, "--limit", limit)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.endswith(f"error: argument --limit: must be from 1 to 2147483647, not {limit}")


@pytest.mark.parametrize("command", ["inspect", "failed"])
def test_a_missing_sqlite_file_is_reported_not_created(tmp_path: Path, command: str) -> None:
    args = [PROVIDER, "msg_1"] if command == "inspect" else []
    line = one_line_error(receiver(command, *args, "--store", "sqlite:///typo.db", cwd=tmp_path))
    assert "no SQLite database at typo.db" in line
    assert list(tmp_path.iterdir()) == []


def test_a_store_without_a_scheme_suggests_the_url(tmp_path: Path) -> None:
    line = one_line_error(receiver("inspect", PROVIDER, "msg_1", "--store", "receiver.db"))
    assert "has no scheme" in line
    assert "sqlite:///receiver.db" in line
    assert "'receiver.db'://" not in line


def test_serve_refuses_a_store_its_app_would_ignore(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/other.db"
    line = one_line_error(
        receiver("serve", "--app", "tests.apps.deadletter:rx", "--store", store, cwd=tmp_path)
    )
    assert "--store is not applied to --app tests.apps.deadletter:rx" in line
    assert list(tmp_path.iterdir()) == []


def test_ttl_without_an_app_lists_every_preset() -> None:
    done = receiver("ttl")  # no RECEIVER_SECRET: the demo app is not built
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split() == ["preset", "schedule", "span", "margin", "window", "source"]
    names = [row.split()[0] for row in rows]
    assert names == [
        "svix",
        "standard-webhooks",
        "stripe",
        "github",
        "shopify",
        "slack",
        "paddle",
        "zoom",
        "linear",
        "twilio",
    ]
    svix = rows[0].split()
    assert svix[1:7] == ["svix", "(8", "attempts)", "27h", "35m", "5s"]
    assert svix[7:9] == ["1d", "52h"]  # the default review margin, and the window
    # With an app, its providers.
    demo = receiver("ttl", "--app", "handlers:app", env={"RECEIVER_SECRET": SECRET})
    assert demo.returncode == 0, demo.stderr
    assert demo.stdout.splitlines()[0].split()[0] == "provider"
    assert demo.stdout.splitlines()[1].split()[0] == "demo"


def test_send_advises_what_the_cli_can_do_with_a_bad_secret() -> None:
    line = one_line_error(receiver("send", "--secret", "notasecret", "--url", "http://x/demo"))
    assert "whsec_" in line
    assert "bytes" not in line


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--url", "http://[::1/demo"], "--url is not a URL"),
        (["--url", "http://127.0.0.1:9/demo", "--id", "caf\u00e9"], "--id must be printable ASCII"),
        (["--url", "http://127.0.0.1:9/demo", "--id", "msg\n1"], "--id must be printable ASCII"),
    ],
)
def test_send_refuses_a_url_or_id_it_cannot_send(options: list[str], says: str) -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    assert says in one_line_error(receiver("send", "--secret", secret, *options))


def test_failed_shows_a_meaningful_error_for_a_retryable_answer(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/r.db"

    async def run() -> None:
        rx = Receiver(store, [Provider(PROVIDER, [SECRET])], sweep_interval=None)

        @rx.on("order.created")
        async def busy(event: Event, tx: Connection) -> Response:
            return Response("slow down", 429)

        async with rx:
            body = body_of(order="o-1")
            assert (await rx.deliver(PROVIDER, signed("msg_1", body), body)).status_code == 429

    asyncio.run(run())
    shown = receiver("failed", "--store", store)
    assert shown.returncode == 0, shown.stderr
    assert "_Retryable" not in shown.stdout
    assert "HandlerAnswered: HTTP 429, not stored" in shown.stdout


@pytest.mark.slow
def test_send_exits_non_zero_on_non_2xx_and_new_ids_never_drift(tmp_path: Path) -> None:
    port = free_port()
    env = {"RECEIVER_SECRET": SECRET}
    log = (tmp_path / "serve.log").open("w+")
    base = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    server = subprocess.Popen(
        [RECEIVER, "serve", "--port", str(port)],
        cwd=tmp_path,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        root = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{root}/healthz", timeout=0.5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, Path(log.name).read_text()
                assert server.poll() is None, Path(log.name).read_text()
                time.sleep(0.1)
        send = ["send", "--url", f"{root}/demo", "--secret", SECRET]
        first = receiver(*send, "--id", "msg_demo_1", cwd=tmp_path)
        assert first.returncode == 0, first.stdout + first.stderr
        # The README's sample output, line for line (the port aside).
        readme = (ROOT / "README.md").read_text()
        sample = re.search(r"```console\n\$ receiver send [^\n]*\n(.*?)\$ ", readme, re.S)
        assert sample, "README has no receiver send sample"
        printed = first.stdout.replace(f":{port}/", ":8000/")
        assert printed == sample.group(1)
        second = receiver(*send, "--id", "msg_demo_1", cwd=tmp_path)
        assert second.returncode == 0
        assert "idempotent-replayed: true" in second.stdout
        # New ids with the default payload: each its own order, no key drift.
        for webhook_id in ("msg_demo_2", "msg_demo_3"):
            fresh = receiver(*send, "--id", webhook_id, cwd=tmp_path)
            assert fresh.returncode == 0, fresh.stdout
            assert f'"order_id":"o-demo_{webhook_id[-1]}"' in fresh.stdout
        # Non-2xx: exit status 1, the answer still printed.
        mismatch = receiver(*send, "--id", "msg_demo_1", "--data", '{"order_id": "x"}')
        assert (mismatch.returncode, "HTTP 422" in mismatch.stdout) == (1, True)
        forged = receiver(*send[:-1], "whsec_" + "A" * 32, "--id", "msg_x", cwd=tmp_path)
        assert (forged.returncode, "HTTP 401" in forged.stdout) == (1, True)
        nowhere = ["send", "--url", f"{root}/nobody", "--secret", SECRET]
        unknown = receiver(*nowhere, cwd=tmp_path)
        assert (unknown.returncode, "HTTP 404" in unknown.stdout) == (1, True)
        metrics = httpx.get(f"{root}/metrics", timeout=5).text
        drift = re.search(r'receiver_key_drift_total\{provider="demo"\} (\S+)', metrics)
        assert drift, metrics
        time.sleep(0.5)  # the drift check runs after the answer
        metrics = httpx.get(f"{root}/metrics", timeout=5).text
        assert 'receiver_key_drift_total{provider="demo"} 0.0' in metrics
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert "key drift" not in Path(log.name).read_text()


def test_a_database_that_is_missing_or_not_migrated_is_a_one_line_error(
    pg_admin_url: str,
) -> None:
    from tests import pgcluster

    name = f"receiver_cli_empty_{os.getpid()}"
    empty = asyncio.run(pgcluster.recreate_database(pg_admin_url, name))
    try:
        line = one_line_error(receiver("failed", "--store", empty))
        assert "UndefinedTableError" in line
        assert f"receiver migrate --store {empty}" in line
    finally:
        asyncio.run(pgcluster.drop_database(pg_admin_url, name))
    line = one_line_error(receiver("inspect", PROVIDER, "msg_1", "--store", empty))
    assert "InvalidCatalogNameError" in line
    assert "the database does not exist" in line
    assert "InvalidCatalogNameError" in line


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://app:s3cret@[::1/app", "the PostgreSQL store URL does not parse"),
        ("postgresql://app:s3cret@127.0.0.1:99999/app", "not a number from 1 to 65535"),
    ],
)
def test_a_postgres_url_that_names_no_server_is_a_one_line_error(url: str, says: str) -> None:
    line = one_line_error(receiver("migrate", "--store", url))
    assert says in line
    assert "s3cret" not in line


def test_a_setting_the_server_refuses_is_a_one_line_error(pg_url: str) -> None:
    line = one_line_error(receiver("migrate", "--check", "--store", f"{pg_url}?no_such_setting=1"))
    assert "refused a setting the store URL passes" in line


def test_init_into_a_file_or_a_name_too_long_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("kept = True\n")
    line = one_line_error(receiver("init", "app.py", cwd=tmp_path))
    assert "app.py is a file" in line
    assert (tmp_path / "app.py").read_text() == "kept = True\n"
    line = one_line_error(receiver("init", "n" * 300, cwd=tmp_path))
    assert "File name too long" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.py"]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--upstream", "http://[::1"], "upstream is not a URL"),
        (["--upstream", "http://127.0.0.1:99999"], "port must be 1-65535"),
        (["--upstream", "https://api.test", "--upstream-ca", "/nonexistent.pem"], "CA file"),
    ],
)
def test_an_upstream_the_proxy_cannot_use_is_a_one_line_error_at_start(
    tmp_path: Path, options: list[str], says: str
) -> None:
    store = f"sqlite:///{tmp_path / 'proxy.db'}"
    line = one_line_error(receiver("proxy", *options, "--store", store, "--port", "0"))
    assert says in line


def test_a_file_that_is_not_a_database_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "notes.db").write_text("not a database\n")
    store = f"sqlite:///{tmp_path / 'notes.db'}"
    for args in (["migrate"], ["migrate", "--check"], ["sweep"]):
        line = one_line_error(receiver(*args, "--store", store, cwd=tmp_path))
        assert "notes.db is not a SQLite database" in line, line
    assert (tmp_path / "notes.db").read_text() == "not a database\n"


def test_a_store_sweep_never_creates_the_file_it_was_given(tmp_path: Path) -> None:
    line = one_line_error(receiver("sweep", "--store", "sqlite:///typo.db", cwd=tmp_path))
    assert "no SQLite database at typo.db" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["send", "--secret", SECRET, "--type", b"order.\xff"], "--type 'order.\\xff' is not"),
        (["init", b"shop_\xff"], "directory 'shop_\\xff' is not valid UTF-8"),
        (["worker", "--factory", "--app", "json:dumps"], "json:dumps needs arguments"),
        (["proxy", "--upstream", "http://a.test", "--principal-header", "x y"], "a token"),
        (["proxy", "--upstream", "http://a.test", "--principal-header", "cl\u20ac"], "a token"),
        (["proxy", "--upstream", "http://a.test", "--reconcile", "nope:f"], "--reconcile nope:f"),
    ],
)
def test_arguments_no_command_can_use_are_one_line_errors(
    tmp_path: Path, args: list[str | bytes], says: str
) -> None:
    store = f"sqlite:///{tmp_path / 'r.db'}"
    options = ["--store", store, "--port", "0"] if args[0] == "proxy" else []
    line = one_line_error(receiver(*args, *options, cwd=tmp_path))
    assert says in line, line
    assert list(tmp_path.iterdir()) == []


def test_no_arguments_print_the_help() -> None:
    done = receiver()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: receiver")
    assert "serve" in done.stdout
    assert done.stderr == ""


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """``receiver ttl | head -n 1``: the pipe closes before the command writes, which is a
    quiet stop (141, as for a shell command killed by SIGPIPE), not a BrokenPipeError
    traceback."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        done = subprocess.run(
            [RECEIVER, "ttl"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert done.returncode == 141
    assert done.stderr == ""


def test_serve_without_an_app_outside_a_clone_offers_no_demo(tmp_path: Path) -> None:
    """Away from a clone there is no demo app: one line saying what to give, and not the
    demo's "Try it" line first, for a server that never starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECEIVER_", "PYTHONPATH"))}
    done = subprocess.run(
        [RECEIVER, "serve"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "no app to run: give --app module:attribute" in one_line_error(done)
    assert done.stdout == ""


def test_the_proxy_names_its_flags_not_its_parameters() -> None:
    done = receiver("proxy", "--upstream", "http://127.0.0.1:9", "--timeout", "90")
    assert done.returncode == 2
    line = one_line_error(done)
    assert "need --timeout (90 s) < --lease (60 s) <= --ttl (86400 s)" in line
    refused = receiver("proxy", "--upstream", "http://127.0.0.1:9", "--forward-key", "mine")
    assert refused.returncode == 2
    assert "--forward-key: invalid choice: 'mine'" in refused.stderr
    assert "forward_key" not in refused.stderr
