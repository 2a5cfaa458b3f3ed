"""Log lines that stay useful under any formatter: with a plain ``logging.Formatter`` (what
``uvicorn module:rx`` gives the receiver's records), every line still names its provider,
webhook-id, event type and fence, because the fields are in the message text too."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from receiver import JSONFormatter, Store
from receiver._logging import TextFormatter
from tests.integration.test_logs import captured
from tests.support import PROVIDER, SimulatedCrash, body_of, make_receiver, signed

PLAIN = logging.Formatter("%(levelname)s %(name)s: %(message)s")


def fields(line: str) -> dict[str, str]:
    return dict(re.findall(r' (\w+)=("(?:[^"\\]|\\.)*"|\S+)', line))


async def test_every_line_carries_its_fields_under_a_plain_formatter(store: Store) -> None:
    rx, recorder = make_receiver(store, lease=1.0)
    body = body_of(order="o-1")
    with captured(PLAIN) as out, captured(JSONFormatter()) as json_out:
        async with rx:
            # A crash leaves the claim in flight; after its lease a redelivery recovers it.
            recorder.crash_next("msg_1")
            with pytest.raises(SimulatedCrash):
                await rx.deliver(PROVIDER, signed("msg_1", body), body)
            await asyncio.sleep(1.2)
            recovered = await rx.deliver(PROVIDER, signed("msg_1", body), body)
            assert recovered.status_code == 200
            # Served from this process's replay cache: the body is not even parsed.
            replayed = await rx.deliver(PROVIDER, signed("msg_1", body), body)
            assert replayed.headers["idempotent-replayed"] == "true"
            # The same payload under a new id: key drift, an alert.
            await rx.deliver(PROVIDER, signed("msg_2", body), body)
    lines = out.getvalue().splitlines()
    (recovery,) = [line for line in lines if "lease expired" in line]
    assert recovery.startswith("WARNING receiver: lease expired; running again under a new fence")
    assert fields(recovery) == {
        "provider": PROVIDER,
        "webhook_id": "msg_1",
        "event_type": "order.created",
        "fence": "2",
    }
    decisions = [fields(line) for line in lines if ": delivery " in line]
    assert [(d["webhook_id"], d["outcome"]) for d in decisions] == [
        ("msg_1", "executed"),
        ("msg_1", "replayed"),
        ("msg_2", "executed"),
    ]
    for decision in decisions:
        assert decision["provider"] == PROVIDER
        assert decision["event_type"] == "order.created"  # the cached replay too
        assert decision["status"] == "200"
    (drift,) = [line for line in lines if "key drift" in line]
    assert drift.startswith("WARNING receiver.metrics: ALERT: key drift")
    assert fields(drift)["webhook_id"] == "msg_2"
    # The JSON lines keep the message short and the fields apart.
    assert '"message":"lease expired; running again under a new fence"' in json_out.getvalue()


def test_field_values_cannot_break_or_forge_a_line() -> None:
    logger = logging.getLogger("receiver")
    with captured(PLAIN) as out, captured(TextFormatter()) as text:
        logger.warning(
            "something", extra={"webhook_id": 'a b\nWARNING receiver: forged="x"', "fence": 3}
        )
    (line,) = out.getvalue().splitlines()
    assert fields(line) == {"webhook_id": '"a b\\nWARNING receiver: forged=\\"x\\""', "fence": "3"}
    # The text formatter does not repeat the fields it finds in the message.
    (shown,) = text.getvalue().splitlines()
    assert shown.count("fence=3") == 1
