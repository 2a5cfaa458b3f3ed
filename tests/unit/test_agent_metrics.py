"""The per-turn key metrics stay bounded and recent (issue 19, item 14)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from receiver._actions import metrics as _agent_metrics
from receiver._actions.metrics import ActionMetrics


def gauge(metrics: ActionMetrics) -> float:
    value = metrics.registry.get_sample_value(
        "receiver_action_max_keys_per_turn", {"action": "refund"}
    )
    assert value is not None
    return value


def test_a_long_lived_turn_keeps_a_bounded_set_of_keys() -> None:
    metrics = ActionMetrics(CollectorRegistry())
    for n in range(_agent_metrics._KEYS_PER_TURN + 500):
        metrics.turn("refund", "forever", f"k-{n}")
    assert len(metrics._seen[("refund", "forever")]) == _agent_metrics._KEYS_PER_TURN
    assert gauge(metrics) == _agent_metrics._KEYS_PER_TURN


def test_the_max_gauge_falls_when_its_turn_is_forgotten_and_recent_use_keeps_a_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_agent_metrics, "_TURNS_KEPT", 3)
    metrics = ActionMetrics(CollectorRegistry())
    for n in range(5):
        metrics.turn("refund", "big", f"k-{n}")
    assert gauge(metrics) == 5
    metrics.turn("refund", "t1", "a")
    metrics.turn("refund", "t2", "a")
    metrics.turn("refund", "big", "k-0")  # used again: the oldest is t1 now
    metrics.turn("refund", "t3", "a")
    assert ("refund", "big") in metrics._seen
    assert ("refund", "t1") not in metrics._seen
    metrics.turn("refund", "t4", "a")
    metrics.turn("refund", "t5", "a")  # big is forgotten
    assert ("refund", "big") not in metrics._seen
    assert gauge(metrics) == 1  # recent turns had one key each
