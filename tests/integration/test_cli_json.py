"""``--json`` on ``inspect``, ``failed``, ``sweep`` and ``migrate --check``: one JSON document on
stdout with the text's facts under stable keys, the same exit status, and errors masked as the
text masks them (a password in a handler's error never reaches the document)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from receiver import Actions, SQLiteStore, ToolCall
from receiver._cli.main import main
from receiver._console.redaction import error_line
from receiver._store.base import Connection

ERROR = "the bank refused: password=hunter2-secret at db://x"


def fill(path: Path) -> str:
    async def run() -> str:
        async with SQLiteStore(path) as store:
            actions = Actions(store, registry=CollectorRegistry(), sweep_interval=None)

            @actions.tool("refund")
            async def refund(call: ToolCall, tx: Connection) -> Any:
                raise RuntimeError(ERROR)

            action = actions.propose("refund", scope="t", action_id="o-1", request={"n": 1})
            with pytest.raises(RuntimeError):
                await actions.execute(action)
            return action.key

    return asyncio.run(run())


def document(capsys: pytest.CaptureFixture[str]) -> Any:
    out = capsys.readouterr().out
    assert "hunter2" not in out
    return orjson.loads(out)  # one document, nothing else on stdout


def test_failed_and_inspect_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.db"
    key = fill(path)
    url = f"sqlite:///{path}"

    assert main(["failed", "--store", url, "--json"]) == 0
    (row,) = document(capsys)["receipts"]
    assert list(row) == [
        "provider", "webhook_id", "state", "rejected_status", "kind", "event_type", "attempts",
        "claimed_at", "error",
    ]  # fmt: skip
    assert (row["provider"], row["webhook_id"], row["kind"]) == ("action:refund", key, "action")
    assert row["state"] == "released"
    assert row["attempts"] == 1
    assert row["error"].startswith("RuntimeError: the bank refused: password=")
    assert main(["failed", "--store", url]) == 0
    text = capsys.readouterr().out
    assert row["error"] in text  # masked and cut as the text's

    assert main(["inspect", "action:refund", key, "--store", url, "--json"]) == 0
    receipt = document(capsys)["receipt"]
    assert receipt["state"] == "released"
    assert receipt["kind"].startswith("agent action of tool refund")
    assert receipt["needs_review"] is False
    assert receipt["rejected_status"] is None
    assert receipt["completed_at"] is None
    assert receipt["claimed_at"].endswith("+00:00")
    assert len(receipt["payload_hash"]) == 64
    (attempt,) = receipt["failed_attempts"]
    assert attempt["fence"] == 1
    assert attempt["error"] == error_line(f"RuntimeError: {ERROR}", None)
    assert set(receipt) >= {"lease_until", "expires_at", "attempts", "response", "event_type"}

    assert main(["inspect", "action:refund", "nope", "--store", url, "--json"]) == 1
    assert document(capsys) == {"receipt": None}

    assert main(["failed", "--store", url, "--provider", "other", "--json"]) == 0
    assert document(capsys) == {"receipts": []}


def test_sweep_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.db"
    fill(path)
    assert main(["sweep", "--store", f"sqlite:///{path}", "--json"]) == 0
    report = document(capsys)
    assert list(report) == [
        "recovered",
        "failed",
        "released",
        "skipped",
        "deleted",
        "audit_deleted",
    ]
    assert all(type(n) is int for n in report.values())


def test_migrate_check_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.db"
    fill(path)
    assert main(["migrate", "--check", "--store", f"sqlite:///{path}", "--json"]) == 0
    ready = document(capsys)
    assert ready == {"store": ready["store"], "up_to_date": True, "missing": [], "layout": None}
    assert str(path) in ready["store"]

    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    assert main(["migrate", "--check", "--store", f"sqlite:///{empty}", "--json"]) == 1
    behind = document(capsys)
    assert behind["up_to_date"] is False
    assert behind["missing"]
    assert all(isinstance(name, str) for name in behind["missing"])

    assert main(["migrate", "--store", f"sqlite:///{empty}", "--json"]) == 2  # only a check
    assert capsys.readouterr().out == ""
