"""The pytest plugin of receiver.testing, registered through the ``pytest11`` entry point.

A top-level module, as hypothesis's own plugin is: pytest imports it in every test run of an
environment where receiver is installed, and a module inside the ``receiver`` package would
import all of receiver first. This one imports only pytest; receiver, hypothesis and the
database drivers are imported when one of its fixtures is requested. Its fixtures carry a
``receiver_`` prefix so that they never shadow a project's own (``store``, ``clock``, ...).

    receiver_clock   a FakeClock (function scope)
    receiver_stores  fresh empty stores: SQLite files, or a throwaway PostgreSQL database on the
                     server named by RECEIVER_TEST_PG_URL (created once per test process)
    receiver_store   one fresh, unopened store from receiver_stores, driven by receiver_clock
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from receiver import Store
    from receiver.testing import FakeClock, TestStores


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Before hypothesis's own pytest_configure loads --hypothesis-profile; and only when asked
    # for, since registering needs hypothesis imported, which is not free.
    if config.getoption("hypothesis_profile", None) == "deep":
        from receiver.testing import register_profiles

        register_profiles()


@pytest.fixture(scope="session")
def receiver_pg_url() -> Iterator[str | None]:
    """A throwaway database on the RECEIVER_TEST_PG_URL server, or None (SQLite) when unset."""
    from receiver.testing._stores import create_database, drop_database, pg_admin_url

    admin = pg_admin_url()
    if admin is None:
        yield None
        return
    url = asyncio.run(create_database(admin))
    yield url
    asyncio.run(drop_database(admin, url))


@pytest.fixture
def receiver_clock() -> FakeClock:
    """A fake clock at a fixed instant; move it with ``receiver_clock.advance(seconds)``."""
    from receiver.testing import FakeClock

    return FakeClock()


@pytest.fixture
def receiver_stores(receiver_pg_url: str | None, tmp_path: Path) -> TestStores:
    """Fresh empty stores for this test (``await receiver_stores.fresh(clock)``)."""
    from receiver.testing import TestStores

    return TestStores(tmp_path, receiver_pg_url)


@pytest.fixture
def receiver_store(receiver_stores: TestStores, receiver_clock: FakeClock) -> Store:
    """A fresh, empty, unopened store on the receiver_clock: give it to your Receiver."""
    return asyncio.run(receiver_stores.fresh(receiver_clock))
