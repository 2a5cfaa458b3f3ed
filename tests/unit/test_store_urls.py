"""What a store shows of its URL (in logs, ``receiver`` output): never the password, and the
hosts as written, a multi-host failover URL included."""

from __future__ import annotations

import pytest

from receiver import ConfigurationError, PostgresStore, store_from_url


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


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        ("postgresql://app:s3cret@[::1/app", "does not parse"),
        ("postgresql://app:s3cret@db:99999/app", "1 to 65535"),
        ("postgresql://app:s3cret@db:0/app", "1 to 65535"),
        ("postgresql://app:s3cret@db:five/app", "1 to 65535"),
        ("postgresql://app:s3cret@db1:5432,db2:\u0665/app", "1 to 65535"),
    ],
)
def test_a_url_that_names_no_server_is_refused_without_its_password(dsn: str, says: str) -> None:
    for make in (PostgresStore, store_from_url):
        with pytest.raises(ConfigurationError, match=says) as refused:
            make(dsn)
        assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql:/app:s3cret@db/app",  # one slash: no scheme
        "postgresql:app:s3cret@db/app",
        "postgres:app:s3cret@db",
        "mysql://app:s3cret@db/app",
        "mysql://app:p@ss:s3cret@db/app",
        "mysql://db/app?password=s3cret",
        "mysql://db/app?password=a@s3cret",
        "app:s3cret@db://x",
        "postgresql://app:s3\uff03cret@db/app",  # NFKC-normalizes to "#": urlsplit quotes it
    ],
)
def test_a_url_that_is_refused_never_shows_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        store_from_url(url)
    assert "s3" not in str(refused.value)
    assert "cret" not in str(refused.value)
