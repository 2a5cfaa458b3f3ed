"""Prometheus metrics of the action executor, labelled by action (a registered tool's name,
so the label values are bounded by the code, never chosen by a model).

Next to the receiver's own (receiver/_ops/metrics.py), in the same registry when the executor is
built from a Receiver. The fifth metric of the seed document is here as two counters: distinct
conversation turns and distinct (turn, key) pairs; their ratio is the distinct keys per turn,
and a climbing ratio shows key derivation drifting (a rephrased intent getting a new key).
"""

from __future__ import annotations

import collections

from prometheus_client import CollectorRegistry, Counter, Gauge

#: The ``result`` label of stale action claims (as the receiver's stale leases).
STALE_RESULTS = ("recovered", "failed", "released", "skipped")

# How many recent turns are remembered to tell a new key of a turn from a repeated one (least
# recently used forgotten first), and how many keys of one turn: a turn past that is already an
# anomaly the gauge shows, and memory stays bounded however long a ``turn=`` lives.
_TURNS_KEPT = 10_000
_KEYS_PER_TURN = 1_000


class ActionMetrics:
    """The executor's instruments (``actions.metrics``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.executions = Counter(
            "receiver_action_executions",
            "Actions whose tool ran to the end and whose result was stored.",
            ["action"],
            registry=r,
        )
        self.replays = Counter(
            "receiver_action_replays",
            "Executes answered with the stored result of an earlier attempt.",
            ["action"],
            registry=r,
        )
        self.conflicts = Counter(
            "receiver_action_conflicts",
            "Executes refused: the action key was used before with another request.",
            ["action"],
            registry=r,
        )
        self.double_executions = Counter(
            "receiver_action_double_executions",
            "Evidence that one action's tool ran to the end twice. Must stay 0.",
            ["action"],
            registry=r,
        )
        self.stale_claims = Counter(
            "receiver_action_stale_claims",
            "Claims of actions whose lease ran out (the attempt died or stalled), by result.",
            ["action", "result"],
            registry=r,
        )
        self.turns = Counter(
            "receiver_action_turns",
            "Distinct conversation turns that executed actions.",
            ["action"],
            registry=r,
        )
        self.turn_keys = Counter(
            "receiver_action_turn_keys",
            "Distinct action keys per conversation turn, summed over turns: divided by "
            "receiver_action_turns it is the keys per turn, which climbs when keys drift.",
            ["action"],
            registry=r,
        )
        self.max_keys_per_turn = Gauge(
            "receiver_action_max_keys_per_turn",
            "The most distinct action keys seen in one recent conversation turn.",
            ["action"],
            registry=r,
        )
        self._seen: collections.OrderedDict[tuple[str, str], set[str]] = collections.OrderedDict()
        self._max: dict[str, int] = {}

    def add_action(self, action: str) -> None:
        """Create the action's series at 0, so that the first event is an increase."""
        for counter in (self.executions, self.replays, self.conflicts, self.double_executions):
            counter.labels(action)
        for result in STALE_RESULTS:
            self.stale_claims.labels(action, result)
        self.turns.labels(action)
        self.turn_keys.labels(action)
        self.max_keys_per_turn.labels(action)

    def turn(self, action: str, turn: str, key: str) -> None:
        """An execute of ``key`` in conversation turn ``turn``."""
        seen = (action, turn)
        keys = self._seen.get(seen)
        if keys is None:
            keys = self._seen[seen] = set()
            self.turns.labels(action).inc()
            while len(self._seen) > _TURNS_KEPT:
                self._forget(*self._seen.popitem(last=False))
        else:
            self._seen.move_to_end(seen)  # recently used: kept longest
        if key in keys or len(keys) >= _KEYS_PER_TURN:
            return
        keys.add(key)
        self.turn_keys.labels(action).inc()
        if len(keys) > self._max.get(action, 0):
            self._max[action] = len(keys)
            self.max_keys_per_turn.labels(action).set(len(keys))

    def _forget(self, seen: tuple[str, str], keys: set[str]) -> None:
        """A turn left the remembered ones: if it held its action's maximum, the gauge falls to
        the largest of the turns still remembered (it reports recent turns only)."""
        action = seen[0]
        if len(keys) < self._max.get(action, 0):
            return
        largest = max((len(k) for (a, _), k in self._seen.items() if a == action), default=0)
        self._max[action] = largest
        self.max_keys_per_turn.labels(action).set(largest)
