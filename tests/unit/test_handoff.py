"""Handoff's settings: ``Provider(handoff=)``, the configuration key, and the budget a delivery
runs within before it is handed off, and when it may be handed off (receiver/_webhooks/
handoff.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from starlette.responses import Response

from receiver import ConfigurationError, Provider
from receiver._config.loader import load_config
from receiver._webhooks.handoff import Handoffs, Turn, budget
from receiver._webhooks.outcomes import Outcome, Reply
from tests.support import SECRET


def test_handoff_is_a_provider_option_off_by_default() -> None:
    assert Provider("p", [SECRET]).handoff is False
    assert Provider("p", [SECRET], handoff=True).handoff is True
    for bad in (1, "yes", None):
        with pytest.raises(ConfigurationError, match="handoff must be True or False"):
            Provider("p", [SECRET], handoff=bad)  # type: ignore[arg-type]


def test_the_configuration_file_sets_it(tmp_path: Path) -> None:
    path = tmp_path / "receiver.toml"
    path.write_text(
        '[providers.chat]\nscheme = "slack"\nsecrets_env = ["S"]\nhandoff = true\n'
        '[providers.own]\nsecrets_env = ["O"]\n'
    )
    config = load_config(path)
    assert {p.name: p.handoff for p in config.providers} == {"chat": True, "own": False}
    rx = config.receiver(environ={"S": "8f742231b10e8888abcd99yyyzzz85a5", "O": SECRET})
    assert rx.providers["chat"].handoff is True
    assert rx.providers["own"].handoff is False
    path.write_text('[providers.own]\nsecrets_env = ["O"]\nhandoff = "yes"\n')
    with pytest.raises(ConfigurationError, match=r"providers\.own\.handoff: expected true or"):
        load_config(path)


def test_the_budget_keeps_a_margin_for_the_answer() -> None:
    assert budget(3.0, 0.0) == 2.5  # Slack: 0.5 s kept back
    assert budget(10.0, 0.0) == 9.0  # GitHub: a tenth, 1 s
    assert budget(10.0, 2.0) == 7.0  # what the delivery already waited counts
    assert budget(3.0, 4.0) == 0.0  # never negative


async def test_a_delivery_is_handed_off_only_while_its_handlers_run() -> None:
    handoffs = Handoffs()
    reply = Reply(Response(b"own answer"), Outcome.EXECUTED)

    # Still claiming its key at the limit (its answer may yet be a replay or a conflict, which
    # a 202 would contradict): handed off once its handlers begin, not before.
    turn = Turn()
    claimed, finish = asyncio.Event(), asyncio.Event()

    async def claiming() -> Reply:
        await claimed.wait()
        turn.begin()
        await finish.wait()
        assert turn.answer() is True  # told 202: the 202 is what it stores
        return reply

    request = asyncio.create_task(handoffs.run(claiming(), 0.01, turn))
    await asyncio.sleep(0.1)
    assert not request.done()
    claimed.set()
    assert await request is None
    assert turn.handed_off
    finish.set()
    await asyncio.wait(set(handoffs.tasks))
    assert not turn.answered

    # Its own answer fixed (being stored) by the limit: the sender waits for that answer.
    turn = Turn()
    committed = asyncio.Event()

    async def storing() -> Reply:
        turn.begin()
        assert turn.answer() is False
        await committed.wait()
        return reply

    request = asyncio.create_task(handoffs.run(storing(), 0.01, turn))
    await asyncio.sleep(0.1)
    assert not request.done()
    assert not turn.hand_off()
    committed.set()
    assert await request is reply
    assert not turn.handed_off
    assert not handoffs.tasks
