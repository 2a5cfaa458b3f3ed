"""What a store shows of its URL (in logs, ``receiver`` output): never the password, and the
hosts as written, a multi-host failover URL included."""

from __future__ import annotations

import pytest

from receiver import PostgresStore, store_from_url


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://app:s3cret@db:5432/app", "postgresql://app@db:5432/app"),
        ("postgresql://app@db/app?sslmode=require", "postgresql://app@db/app"),
        ("postgresql:///app", "postgresql://localhost/app"),
        (
            "postgresql://app:s3cret@10.0.0.1:5432,10.0.0.2:5432/app"
            "?target_session_attrs=read-write",
            "postgresql://app@10.0.0.1:5432,10.0.0.2:5432/app",
        ),
        ("postgresql://app:p%40ss@db1,db2/app", "postgresql://app@db1,db2/app"),
    ],
)
def test_a_postgres_store_shows_its_hosts_and_never_its_password(dsn: str, shown: str) -> None:
    assert PostgresStore(dsn).url == shown
    assert store_from_url(dsn).url == shown
