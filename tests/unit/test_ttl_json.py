"""``receiver ttl --json``: the same rows as the table, as one JSON document for scripts."""

from __future__ import annotations

import orjson
import pytest

from receiver._cli.main import main
from receiver._webhooks.schedules import PRESETS, dedup_window, format_duration


def test_ttl_json_is_the_table_as_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ttl"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert main(["ttl", "--json"]) == 0
    document = orjson.loads(capsys.readouterr().out)
    rows = document["windows"]
    assert [row["preset"] for row in rows] == list(PRESETS)
    keys = ["preset", "schedule", "attempts", "jitter", "span", "margin", "window"]
    assert all(list(row) == [*keys, "explicit_ttl", "source"] for row in rows)
    for line, row in zip(table[1:], rows, strict=True):
        window = dedup_window(PRESETS[row["preset"]], provider=row["preset"])
        assert line.split()[0] == row["preset"]
        assert row["window"] == window.window
        assert row["span"] == window.span
        assert row["attempts"] == window.schedule.attempts
        assert format_duration(row["window"]) in line
