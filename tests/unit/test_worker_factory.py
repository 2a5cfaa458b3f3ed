"""``receiver worker --app module:factory --factory`` builds its app (issue 19, item 16)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from receiver import Receiver, ReceiverError
from receiver._cli.loading import build_receiver as _build_receiver
from receiver._cli.main import build_parser

FACTORIES = """
from receiver import Provider, Receiver

def build(store=None):
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    return Receiver(store or "sqlite:///default.db", [Provider("acme", [secret])])

def build_bare():
    return Receiver("sqlite:///bare.db")

def not_a_receiver():
    return 42
"""


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "worker_factories.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "worker_factories"
    sys.modules.pop("worker_factories", None)


def test_the_store_reaches_the_factory(factories: str, tmp_path: Path) -> None:
    rx = _build_receiver(f"{factories}:build", f"sqlite:///{tmp_path}/w.db")
    assert isinstance(rx, Receiver)
    assert str(tmp_path / "w.db") in rx.store.url
    assert "bare.db" in _build_receiver(f"{factories}:build_bare", None).store.url


def test_clear_errors(factories: str) -> None:
    with pytest.raises(ReceiverError, match="takes no 'store' argument"):
        _build_receiver(f"{factories}:build_bare", "sqlite:///x.db")
    with pytest.raises(ReceiverError, match="not a Receiver"):
        _build_receiver(f"{factories}:not_a_receiver", None)


def test_the_worker_options() -> None:
    args = build_parser().parse_args(
        ["worker", "--app", "m:build", "--factory", "--stale-interval", "2"]
    )
    assert (args.factory, args.stale_interval) == (True, 2.0)
