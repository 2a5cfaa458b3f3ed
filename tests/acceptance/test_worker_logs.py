"""The lines of a real ``receiver worker`` process, on SQLite and PostgreSQL: one line per
attempt (provider, webhook-id, event type, outcome, attempt, duration) and one summary line at
SIGTERM, all in the ``--log-format`` asked for; ``auto`` (the default) is text on a terminal
and JSON on a pipe. Neither a payload value nor a secret in a handler's error reaches them."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.apps.logged import build
from tests.conftest import truncate
from tests.servers import RECEIVER, ROOT
from tests.support import PROVIDER, body_of, signed

pytestmark = pytest.mark.slow

# What the app's handler makes of each delivery: (webhook-id, outcome, attempt).
ATTEMPTS = {
    ("ok-1", "executed", 1),
    ("ok-2", "executed", 1),
    ("reject-1", "handler_rejected", 1),
    ("fail-1", "handler_failed", 1),
    ("fail-1", "dead_letter", 2),
}
SUMMARY = {"attempts": 5, "executed": 2, "handler_rejected": 1, "handler_failed": 1}
PAYLOAD_VALUE = "card-4111-payload-value"
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) receiver\S*: ")


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A ledger holding the four queued deliveries of :data:`ATTEMPTS`."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/r.db"
    else:
        url = request.getfixturevalue("pg_url")
        asyncio.run(truncate(url))
    asyncio.run(queue_deliveries(url))
    return url


async def queue_deliveries(url: str) -> None:
    async with build(url) as rx:
        for webhook_id in ("ok-1", "ok-2", "reject-1", "fail-1"):
            body = body_of(order=webhook_id, card=PAYLOAD_VALUE)
            answer = await rx.deliver(PROVIDER, signed(webhook_id, body), body)
            assert answer.status_code == 202


def worker(url: str, *options: str, stderr: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(RECEIVER, "worker", "--app", "tests.apps.logged:rx", "--poll-interval", "0.1"),
            *("--log-level", "info", *options),
        ],
        cwd=ROOT,
        env={**os.environ, "RECEIVER_STORE": url},
        stdout=stderr,
        stderr=stderr,
    )


def run_until_done(url: str, log: Path, log_format: str) -> list[str]:
    """Run a worker until it logged the five attempts, SIGTERM it, and return its lines."""
    with log.open("wb") as out:
        process = worker(url, "--log-format", log_format, stderr=out)
        try:
            deadline = time.monotonic() + 60
            while log.read_bytes().count(b"queued attempt") < len(ATTEMPTS):
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
    text = log.read_text()
    assert PAYLOAD_VALUE not in text
    assert "hunter2" not in text
    return text.splitlines()


def test_json_lines_carry_each_attempt_and_the_summary(ledger: str, tmp_path: Path) -> None:
    lines = [orjson.loads(line) for line in run_until_done(ledger, tmp_path / "w", "json")]
    attempts = [line for line in lines if line["message"].startswith("queued attempt ")]
    assert {(a["webhook_id"], a["outcome"], a["attempt"]) for a in attempts} == ATTEMPTS
    for a in attempts:
        assert a["message"] == f"queued attempt {a['outcome']}"
        assert (a["provider"], a["event_type"], a["level"]) == (PROVIDER, "order.created", "info")
        assert isinstance(a["fence"], int)
        assert a["duration_ms"] >= 0
    assert lines[0]["message"] in (
        "worker started",
        "worker on SQLite: run a single worker process (SQLite has one writer)",
    )
    assert any(line["message"] == "worker started" and line["store"] for line in lines)
    (summary,) = [line for line in lines if line["message"] == "worker stopped"]
    assert summary == {**summary, **SUMMARY, "dead_letter": 1, "level": "info"}
    assert summary is lines[-1]


def test_text_lines_are_for_people(ledger: str, tmp_path: Path) -> None:
    lines = run_until_done(ledger, tmp_path / "w", "text")
    assert not [line for line in lines if line.startswith("{")]
    heads = [line for line in lines if TEXT_LINE.match(line)]
    assert len(heads) >= len(ATTEMPTS) + 2
    for webhook_id, outcome, attempt in ATTEMPTS:
        wanted = (
            f"INFO receiver.worker: queued attempt {outcome} provider={PROVIDER} "
            f"webhook_id={webhook_id} event_type=order.created outcome={outcome} fence="
        )
        found = [line for line in heads if wanted in line and f" attempt={attempt} " in line]
        assert len(found) == 1, (wanted, lines)
        assert re.search(r" duration_ms=\d+(\.\d+)?$", found[0])
    assert heads[-1].endswith(
        "INFO receiver.worker: worker stopped attempts=5 dead_letter=1 executed=2 "
        "handler_failed=1 handler_rejected=1"
    )


def _read_pty(fd: int, process: subprocess.Popen[bytes], until: bytes) -> bytes:
    """What the worker wrote to its terminal: SIGTERM once ``until`` appeared, read to exit."""
    got = b""
    deadline = time.monotonic() + 60
    stopped = False
    while time.monotonic() < deadline:
        if not stopped and until in got:
            process.send_signal(signal.SIGTERM)
            stopped = True
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the process closed its end
                break
            if not chunk:
                break
            got += chunk
        elif stopped and process.poll() is not None:
            break
    return got


def test_auto_is_text_on_a_terminal_and_json_on_a_pipe(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    main, terminal = pty.openpty()
    process = worker(url, stderr=terminal)  # no --log-format: auto
    os.close(terminal)
    try:
        seen = _read_pty(main, process, b"worker started")
    finally:
        os.close(main)
        if process.poll() is None:
            process.kill()
    assert process.wait(timeout=30) == 0
    lines = seen.decode().splitlines()
    assert lines
    assert all(TEXT_LINE.match(line) for line in lines), lines
    assert "worker stopped attempts=0" in lines[-1]

    piped = worker(url, stderr=subprocess.PIPE)
    assert piped.stderr is not None
    first = b""
    while b"worker started" not in first:  # the signal handlers are installed by then
        line = piped.stderr.readline()
        assert line, first
        first += line
    piped.send_signal(signal.SIGTERM)
    _, rest = piped.communicate(timeout=30)
    assert piped.returncode == 0
    objects = [orjson.loads(line) for line in (first + rest).splitlines()]
    assert objects[-1]["message"] == "worker stopped"
    assert objects[-1]["attempts"] == 0
