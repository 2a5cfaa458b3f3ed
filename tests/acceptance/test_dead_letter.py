"""The dead-letter workflow with the real ``receiver`` command: deliveries fail while a
downstream system is down; ``receiver failed`` lists them; once it is back, ``receiver replay``
runs one, then ``--all-failed`` the rest, each exactly once more; a completed one is refused."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
from pathlib import Path

from tests.apps.deadletter import build
from tests.servers import RECEIVER, ROOT
from tests.support import PROVIDER, body_of, signed

APP = "tests.apps.deadletter:rx"


def receiver(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RECEIVER, *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def fail_deliveries(store: str, ids: list[str]) -> None:
    async def run() -> None:
        async with build(store) as rx:
            for webhook_id in ids:
                body = body_of(order=webhook_id)
                answer = await rx.deliver(PROVIDER, signed(webhook_id, body), body)
                assert answer.status_code == 500

    asyncio.run(run())


def test_failed_then_replayed_once(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/receipts.db"
    broken = tmp_path / "downstream-is-down"
    invocations = tmp_path / "invocations"
    env = {
        "RECEIVER_STORE": store,
        "RECEIVER_TEST_BROKEN": str(broken),
        "RECEIVER_TEST_INVOCATIONS": str(invocations),
    }
    os.environ.update(env)  # for the in-process deliveries below
    try:
        broken.touch()
        fail_deliveries(store, ["msg_1", "msg_2", "msg_3"])
    finally:
        for name in env:
            os.environ.pop(name)
    broken.unlink()

    listed = receiver("failed", "--store", store, env=env)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[:2] for line in listed.stdout.splitlines()] == [
        [f"{PROVIDER}/msg_{i}", "released"] for i in (1, 2, 3)
    ]
    assert "RuntimeError: downstream is down" in listed.stdout
    assert "receiver replay" in listed.stderr

    one = receiver("replay", PROVIDER, "msg_1", "--app", APP, env=env)
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == [
        f"{PROVIDER}/msg_1: executed (HTTP 200, fence 2)",
        '{"fence":2}',
    ]

    again = receiver("replay", PROVIDER, "msg_1", "--app", APP, env=env)
    assert again.returncode == 1
    assert "completed receipts are never run again" in again.stderr

    batch = receiver("replay", "--all-failed", "--limit", "10", "--app", APP, env=env)
    assert batch.returncode == 0, batch.stderr
    assert batch.stdout.splitlines() == [
        f"{PROVIDER}/msg_2: executed (HTTP 200, fence 2)",
        f"{PROVIDER}/msg_3: executed (HTTP 200, fence 2)",
        "replayed 2: 2 executed",
    ]
    assert receiver("failed", "--store", store, env=env).stdout == "no failed receipts\n"
    lines = sorted(invocations.read_text().splitlines())
    assert lines == [f"msg_{i} {fence}" for i in (1, 2, 3) for fence in (1, 2)]

    usage = receiver("replay", "--app", APP, env=env)
    assert usage.returncode == 2
    assert "PROVIDER WEBHOOK_ID, or --all-failed" in usage.stderr


def test_a_batch_on_a_terminal_shows_a_progress_bar(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/receipts.db"
    broken = tmp_path / "downstream-is-down"
    env = {
        "RECEIVER_STORE": store,
        "RECEIVER_TEST_BROKEN": str(broken),
        "RECEIVER_TEST_INVOCATIONS": str(tmp_path / "invocations"),
    }
    os.environ.update(env)
    try:
        broken.touch()
        fail_deliveries(store, ["msg_a", "msg_b"])
    finally:
        for name in env:
            os.environ.pop(name)
    broken.unlink()

    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [RECEIVER, "replay", "--all-failed", "--app", APP],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            timeout=60,
            check=False,
        )
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert done.returncode == 0
    assert done.stdout == "replayed 2: 2 executed\n"
    bar = shown.decode()
    assert "[###############...............] 1/2 acme/msg_a executed" in bar
    assert "[##############################] 2/2 acme/msg_b executed" in bar
