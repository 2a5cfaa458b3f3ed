"""The kit's tests run on both real stores, like the conformance suite: the kit's own
TestStores over a SQLite directory or this test process's PostgreSQL database."""

from __future__ import annotations

from pathlib import Path

import pytest

from receiver.testing import TestStores


@pytest.fixture(params=["sqlite", "postgresql"])
def kit_stores(request: pytest.FixtureRequest, pg_url: str, tmp_path: Path) -> TestStores:
    return TestStores(tmp_path, pg_url if request.param == "postgresql" else None)
