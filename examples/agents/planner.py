"""A deterministic fake planner: a scripted conversation, no model, no network.

The "model" proposes tool calls for each user turn and words its prose differently on every
attempt (the way a regenerated answer does). The planner (the system) names every call with an
action id it derives from the conversation, the turn, the tool and the call's ordinal in the
turn, never from the model's words, and runs it through the executor. It retries on transient
failures, and can be thrown away mid-conversation and started again from the first turn (a
restart): every action already executed returns its stored result, nothing runs twice.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from receiver import ActionInProgress

from .tools import FunctionTool

# What the user says, and what the fake model proposes for it (prose filled in per attempt).
SCRIPT: Sequence[tuple[str, Sequence[tuple[str, dict[str, Any]]]]] = (
    (
        "My order A-1001 arrived broken. Please refund it and let me know.",
        (
            ("refund_order", {"order_id": "A-1001", "amount_cents": 2599, "reason": "{prose}"}),
            (
                "send_email",
                {"to": "ada@example.com", "subject": "Your refund", "body": "{prose}"},
            ),
        ),
    ),
    (
        "The courier was rude too. Can someone look into it?",
        (("create_ticket", {"subject": "Courier complaint A-1001", "details": "{prose}"}),),
    ),
    (
        "And order A-1002 never came at all.",
        (("refund_order", {"order_id": "A-1002", "amount_cents": 1250, "reason": "{prose}"}),),
    ),
)

PHRASINGS = (
    "The customer reports damage on arrival; refunding per policy.",
    "As requested, I'm taking care of this right away.",
    "Sorry about that! Processing it now.",
)


class FakeModel:
    """Proposes the scripted calls; the prose changes with every request it gets."""

    def __init__(self) -> None:
        self.requests = 0

    def propose(self, turn: int) -> list[tuple[str, dict[str, Any]]]:
        self.requests += 1
        prose = PHRASINGS[self.requests % len(PHRASINGS)]
        return [
            (name, {k: v.format(prose=prose) if isinstance(v, str) else v for k, v in args.items()})
            for name, args in SCRIPT[turn][1]
        ]


@dataclass
class Planner:
    conversation: str
    tools: dict[str, FunctionTool]
    model: FakeModel
    retries: int = 5

    async def run_turn(self, turn: int) -> list[Any]:
        """Plan the turn, and execute each proposed call; retried on transient failures, with
        the model asked again (and rephrasing) each time."""
        for attempt in range(self.retries):
            calls = self.model.propose(turn)
            ordinal: collections.Counter[str] = collections.Counter()
            try:
                results = []
                for name, arguments in calls:
                    ordinal[name] += 1
                    action_id = f"{self.conversation}.{turn}.{name}.{ordinal[name]}"
                    out = await self.tools[name].invoke(
                        json.dumps(arguments), action_id, f"{self.conversation}.{turn}"
                    )
                    results.append(json.loads(out))
                return results
            except (TimeoutError, ActionInProgress):
                await asyncio.sleep(0.05 * (attempt + 1))
        raise RuntimeError(f"turn {turn} kept failing")

    async def run(self, turns: range | None = None) -> list[list[Any]]:
        return [await self.run_turn(t) for t in turns or range(len(SCRIPT))]
