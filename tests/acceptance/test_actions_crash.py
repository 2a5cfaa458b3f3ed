"""Crash, for agent actions: a real process (tests/apps/actions_worker.py) is SIGKILLed inside
a tool, then fresh processes on the same store execute the same action again.

- transactional tool, killed after its write and before the commit: the write died with the
  transaction; after the lease the action runs once more, and one effect is committed;
- external tool, killed after its call and before its result is stored: it is reconciled (the
  outside world's record says the call happened), never re-run; without a reconcile it is
  marked for review, never re-run.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import query

pytestmark = pytest.mark.slow

LEASE = 1.0


def worker(url: str, tool: str, calls: Path, *, hang: bool = False) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.apps.actions_worker", url, tool, "a-1", str(calls)]
    command += ["--lease", str(LEASE)] + (["--hang"] if hang else [])
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def killed_inside_the_tool(url: str, tool: str, calls: Path) -> None:
    proc = worker(url, tool, calls, hang=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "HANG"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def run(url: str, tool: str, calls: Path) -> dict[str, Any]:
    proc = worker(url, tool, calls)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    answer: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return answer


def runs(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def effects(url: str) -> int:
    rows = asyncio.run(query(url, "SELECT count(*) FROM effects WHERE provider = 'action'"))
    return int(rows[0][0])


def test_killed_before_commit_runs_once_more_with_one_effect(
    store_url: str, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    killed_inside_the_tool(store_url, "book", calls)
    assert effects(store_url) == 0
    # (Within the lease a retry is ActionInProgress: tests/integration/test_actions.py, with a
    # clock the test controls; a process started here may already be past a short lease.)
    time.sleep(LEASE + 0.5)
    first = run(store_url, "book", calls)
    assert first == {"result": {"booked": "12", "fence": 2}, "replayed": False}
    assert run(store_url, "book", calls) == {"result": first["result"], "replayed": True}
    assert runs(calls) == 2
    assert effects(store_url) == 1


def test_external_call_then_kill_is_reconciled_never_rerun(store_url: str, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    killed_inside_the_tool(store_url, "pay", calls)
    time.sleep(LEASE + 0.5)
    answer = run(store_url, "pay", calls)
    assert answer == {"result": {"paid": True, "reconciled": True}, "replayed": False}
    assert run(store_url, "pay", calls)["replayed"] is True
    assert runs(calls) == 1
    assert len((tmp_path / "calls.external").read_text().split()) == 1


def test_external_without_reconcile_is_marked_for_review(store_url: str, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    killed_inside_the_tool(store_url, "mail", calls)
    time.sleep(LEASE + 0.5)
    assert run(store_url, "mail", calls) == {"error": "ActionNeedsReview"}
    assert run(store_url, "mail", calls) == {"error": "ActionNeedsReview"}
    assert runs(calls) == 1
