"""The operator's bad day in a real browser (Playwright driving Debian's Chromium) against
``receiver console`` served as a real process: sign-in and sign-out with operators' own
tokens and roles, and a bulk replay of 2,000 failed deliveries whose console is SIGKILLed
half-way, then started again: the job goes on by itself and every delivery runs exactly once.
The screenshots in docs/console/ are made here."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from receiver import Receiver

from . import bulkapp
from .conftest import SCREENSHOTS, free_port
from .shop import TOKEN

ROOT = Path(__file__).resolve().parents[2]
RECEIVER = str(Path(sys.executable).parent / "receiver")
BOB = "bob-read-only-token-987654321"
N = 2000
T = TypeVar("T")


def arun(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a loop of its own thread (Playwright's sync API holds this one's)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result(timeout=120)


class Console:
    """``receiver console --app tests.console.bulkapp:rx`` on a fixed port, started again at
    will (the same port, so that the browser's session cookie still applies)."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        operators = tmp / "operators.toml"
        operators.write_text(
            '[[operator]]\nname = "Bob"\nrole = "read-only"\n'
            f'token_sha256 = "{hashlib.sha256(BOB.encode()).hexdigest()}"\n'
        )
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
        self.env.update(
            RECEIVER_BULK_STORE=url,
            RECEIVER_CONSOLE_TOKEN=TOKEN,
            RECEIVER_CONSOLE_OPERATORS=str(operators),
            RECEIVER_BULK_RATE="300",
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                RECEIVER,
                "console",
                "--app",
                "tests.console.bulkapp:rx",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        import httpx

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/login", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the console did not start")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture
def ledger(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Receiver, Console]]:
    """A ledger of ``request.param`` failed deliveries (N unless the test says), and a console
    over it."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    rx = bulkapp.make(url)
    count = getattr(request, "param", N)

    async def seed() -> None:
        async with rx:
            await bulkapp.prepare(rx.store)
            await bulkapp.fail_many(rx, "shop", [f"ord_{n:04d}" for n in range(count)])

    arun(seed())
    console = Console(url, tmp_path)
    console.start()
    try:
        yield rx, console
    finally:
        console.stop()


def read(rx: Receiver, sql: str) -> list[Any]:
    async def run() -> list[Any]:
        async with rx.store, rx.store.acquire() as conn:
            return [dict(r) for r in await conn.fetch(sql)]

    return arun(run())


def open_again(page: Any, url: str) -> None:
    """Load ``url`` afresh. A running job's page refreshes itself (a meta refresh), and one
    that fires while Playwright navigates aborts that navigation (net::ERR_ABORTED, or "is
    interrupted by another navigation", as Chromium reports it): try again, a few times."""
    for attempt in range(5):
        try:
            page.goto(url)
            return
        except Exception as exc:  # playwright's Error, whose module is not imported here
            raced = any(sign in str(exc) for sign in _REFRESH_RACE)
            if not raced or attempt == 4:
                raise
            time.sleep(0.2)


# What Playwright says of a navigation the page's own refresh cut short.
_REFRESH_RACE = ("ERR_ABORTED", "is interrupted by another navigation")


def sign_in(page: Any, console: Console, token: str, name: str = "") -> None:
    page.goto(console.url + "/")
    if name:
        page.fill("input[name=name]", name)
    page.fill("input[name=token]", token)
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("header .who")


@pytest.mark.slow
def test_a_bulk_replay_survives_its_console_being_killed(
    page: Any, ledger: tuple[Receiver, Console]
) -> None:
    rx, console = ledger
    sign_in(page, console, TOKEN, "Ada Operator")
    page.click("header nav >> text=Needs attention")
    page.click("a:has-text('Released after failures')")
    page.click("a:has-text('Replay all matching deliveries')")
    assert page.locator("select[name=state]").input_value() == "released"
    page.fill("input[name=error]", "inventory")
    page.click("button:has-text('Count (dry run)')")
    assert "2,000 deliveries would run" in page.locator("h2.count").inner_text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "bulk-dry-run.png"), full_page=True)
    page.fill("form.confirm input[name=reason]", "inventory service is back (INC-4711)")
    page.fill("form.confirm input[name=count]", "1999")
    page.click("button:has-text('Replay them')")
    assert "not 1999" in page.content()
    page.go_back()
    page.fill("form.confirm input[name=reason]", "inventory service is back (INC-4711)")
    page.fill("form.confirm input[name=count]", "2000")
    page.click("button:has-text('Replay them')")
    page.wait_for_selector("dl.job")
    assert "Bulk replay 1 started" in page.locator(".notice").inner_text()
    job_page = page.url

    # Half-way: the console process is killed where it stands.
    deadline = time.monotonic() + 60
    while read(rx, "SELECT done FROM receiver_bulk_jobs")[0]["done"] < N // 2:
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.05)
    page.screenshot(path=str(SCREENSHOTS / "bulk-job.png"), full_page=True)
    console.kill()
    done = read(rx, "SELECT done, state FROM receiver_bulk_jobs")[0]
    assert done["state"] == "running"
    assert done["done"] < N

    # Started again: it takes the job over once the dead runner's lease ran out.
    console.start()
    open_again(page, job_page)  # the session is in the ledger: still signed in
    assert "Ada Operator" in page.locator("header .who").inner_text()
    deadline = time.monotonic() + 90
    while read(rx, "SELECT state FROM receiver_bulk_jobs")[0]["state"] != "done":
        assert time.monotonic() < deadline, "the job was not taken over"
        time.sleep(0.2)
    open_again(page, job_page)
    assert "2,000 / 2,000" in page.locator("dl.job").inner_text()
    assert "2000 executed" in page.locator("dl.job").inner_text()

    runs = read(rx, "SELECT webhook_id, count(*) AS n FROM bulk_runs GROUP BY webhook_id")
    assert len(runs) == N
    assert {r["n"] for r in runs} == {1}  # every delivery ran exactly once
    states = read(rx, "SELECT state, count(*) AS n FROM receiver_receipts GROUP BY state")
    assert states == [{"state": "completed", "n": N}]
    (audit,) = read(rx, "SELECT actor, action, outcome, detail FROM receiver_audit")
    assert audit == {
        "actor": "Ada Operator",
        "action": "bulk replay",
        "outcome": "done",
        "detail": "2000 executed",
    }


@pytest.mark.parametrize("ledger", [50], indirect=True)
def test_operators_sign_in_and_out_with_their_roles(
    page: Any, ledger: tuple[Receiver, Console]
) -> None:
    rx, console = ledger
    sign_in(page, console, BOB)
    who = page.locator("header .who").inner_text()
    assert "signed in as Bob" in who
    assert "read-only" in who
    page.goto(console.url + "/receipt?provider=shop&id=ord_0001")
    assert page.locator("form[action$='/replay']").count() == 0
    page.goto(console.url + "/bulk?state=released&count=1")
    assert "50 deliveries would run" in page.content()
    assert page.locator("form.confirm").count() == 0  # a read-only operator confirms nothing
    page.screenshot(path=str(SCREENSHOTS / "read-only-operator.png"), full_page=True)
    cookie = next(c for c in page.context.cookies() if c["name"] == "receiver_console_session")
    page.click("button:has-text('Sign out')")
    page.wait_for_selector("input[name=token]")
    # A copy of the cookie is dead: the server ended the session.
    page.context.add_cookies([cookie])
    answer = page.goto(console.url + "/receipts")
    assert answer is not None
    assert answer.status == 401
    sign_in(page, console, TOKEN, "Ada Operator")
    page.goto(console.url + "/sessions")
    assert "Ada Operator" in page.locator("table").inner_text()
    assert "Bob" not in page.locator("table").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "sessions.png"), full_page=True)
    assert read(rx, "SELECT count(*) AS n FROM receiver_audit") == [{"n": 0}]
