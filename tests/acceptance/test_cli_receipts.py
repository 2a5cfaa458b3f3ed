"""The real ``receiver`` command on a queued delivery, on both stores: ``inspect`` shows one no
worker has taken yet, ``replay`` puts a dead letter back in the queue and says so with exit
status 0, and each replay from the command line is one row of the console's audit, with its
outcome; ``--app`` naming a module that does not exist is one line and status 2; ``receiver
sweep --store`` takes its retentions; ``failed`` and ``inspect`` mask stored errors as the console
does."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from receiver import Backoff, Connection, Event, Provider, Receiver
from receiver._store.url import store_from_url
from tests.integration.test_queued import drain
from tests.servers import RECEIVER, ROOT
from tests.support import PROVIDER, SECRET, body_of, signed

APP = "tests.apps.queued:rx"


def receiver(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    return subprocess.run(
        [RECEIVER, *args],
        cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def queued_receiver(store_url: str) -> Receiver:
    """The provider of tests.apps.queued, with a handler that always fails, once."""
    rx = Receiver(
        store_url,
        [Provider(PROVIDER, [SECRET], mode="queued", retry=Backoff(attempts=1))],
        sweep_interval=None,
    )

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> None:
        raise RuntimeError("downstream is down")

    return rx


async def audit_rows(store_url: str) -> list[dict[str, object]]:
    async with store_from_url(store_url) as store, store.acquire() as conn:
        return [dict(r) for r in await conn.run_all("console_audit_list", None, 100)]


def test_a_queued_delivery_is_inspected_and_its_dead_letter_replayed(store_url: str) -> None:
    rx = queued_receiver(store_url)

    async def deliver() -> None:
        async with rx:
            body = body_of(order="q1")
            assert (await rx.deliver(PROVIDER, signed("q1", body), body)).status_code == 202

    asyncio.run(deliver())
    inspected = receiver("inspect", PROVIDER, "q1", "--store", store_url)
    assert inspected.returncode == 0, inspected.stderr
    assert "state        queued" in inspected.stdout
    assert "expires at   never" in inspected.stdout

    async def dead_letter() -> None:
        async with rx:
            await drain(rx)

    asyncio.run(dead_letter())
    env = {"RECEIVER_STORE": store_url, "RECEIVER_SECRET": SECRET}
    replayed = receiver(
        "replay", PROVIDER, "q1", "--app", APP, "--reason", "downstream is back", env=env
    )
    assert replayed.returncode == 0, (replayed.stdout, replayed.stderr)
    assert replayed.stdout.splitlines()[0] == (
        f"{PROVIDER}/q1: queued (HTTP 202, due now for the workers)"
    )
    assert "None" not in replayed.stdout
    (row,) = asyncio.run(audit_rows(store_url))
    assert (row["action"], row["provider"], row["webhook_id"]) == ("replay", PROVIDER, "q1")
    assert (row["outcome"], row["reason"]) == ("queued", "downstream is back")
    assert str(row["actor"]).endswith("(receiver replay)")


@pytest.mark.parametrize("command", ["serve", "worker", "replay", "console"])
def test_a_wrong_module_in_app_is_one_line_and_status_2(command: str, tmp_path: object) -> None:
    args = ["--app", "no_such_module.inner:rx"]
    if command == "replay":
        args += ["acme", "msg_1"]
    if command == "console":
        args += ["--store", "sqlite:///:memory:"]
    done = receiver(command, *args, env={"RECEIVER_CONSOLE_TOKEN": "x" * 32})
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("receiver: --app no_such_module.inner:rx: no module named")
    assert "Traceback" not in done.stderr


def test_a_store_sweep_takes_its_retentions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"

    async def audit(*ages: float) -> None:
        async with store_from_url(url) as store, store.acquire() as conn:
            for age in ages:
                at = time.time() - age * 86_400
                await conn.run(
                    "console_audit_add", at, "ada", "replay", "acme", f"w{age:g}", 1, "r", "x"
                )

    asyncio.run(audit(400, 30, 1))
    default = receiver("sweep", "--store", url)
    assert default.returncode == 0, default.stderr
    assert "1 old audit records" in default.stdout
    shorter = receiver("sweep", "--store", url, "--audit-retention", "7d")
    assert shorter.returncode == 0, shorter.stderr
    assert "1 old audit records" in shorter.stdout
    assert [r["webhook_id"] for r in asyncio.run(audit_rows(url))] == ["w1"]
    for args in (
        ["--app", APP, "--audit-retention", "1d"],
        ["--store", url, "--audit-retention", "3 weeks"],
    ):
        done = receiver("sweep", *args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().count("\n") == 0, done.stderr
        assert "--audit-retention" in done.stderr


def test_the_cli_masks_stored_errors_as_the_console_does(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    rx = Receiver(url, [Provider(PROVIDER, [SECRET])], sweep_interval=None)

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> None:
        raise RuntimeError("card 4111 1111 1111 1111 declined for Bearer abc.def-ghi")

    async def deliver() -> None:
        async with rx:
            body = body_of(order="o-1")
            assert (await rx.deliver(PROVIDER, signed("m1", body), body)).status_code == 500

    asyncio.run(deliver())
    for args in (["failed"], ["inspect", PROVIDER, "m1"]):
        done = receiver(*args, "--store", url)
        assert done.returncode == 0, done.stderr
        assert "RuntimeError: card •••" in done.stdout
        for secret in ("4111", "1111 1111", "abc.def"):
            assert secret not in done.stdout


def test_inspect_and_failed_take_the_store_of_a_config_file(tmp_path: Path) -> None:
    """A project run with ``--config`` reads its receipts the same way: ``inspect --config
    FILE PROVIDER ID`` (not FILE taken for the provider), and ``failed --config FILE``, whose
    advice names the file rather than ``--app``."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    rx = Receiver(url, [Provider(PROVIDER, [SECRET])], sweep_interval=None)

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> None:
        raise RuntimeError("downstream is down")

    async def deliver() -> None:
        async with rx:
            body = body_of(order="o-1")
            assert (await rx.deliver(PROVIDER, signed("m1", body), body)).status_code == 500

    asyncio.run(deliver())
    config = tmp_path / "receiver.toml"
    config.write_text(f'store = "{url}"\n[providers.{PROVIDER}]\nsecrets_env = ["NOT_READ"]\n')
    shown = receiver("inspect", "--config", str(config), PROVIDER, "m1")
    assert shown.returncode == 0, shown.stderr
    assert f"receipt      {PROVIDER}/m1" in shown.stdout
    assert "RuntimeError: downstream is down" in shown.stdout
    listed = receiver("failed", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert f"{PROVIDER}/m1  released" in listed.stdout
    assert f"--config {config}" in listed.stderr
    assert "--app" not in listed.stderr
    # --store still wins over the file's, as for every other command.
    elsewhere = receiver("failed", "--config", str(config), "--store", f"sqlite:///{tmp_path}/x.db")
    assert elsewhere.returncode == 2
    assert "no SQLite database at" in elsewhere.stderr
