"""receiver.contrib.pydantic_ai under Pydantic AI's durable agents on DBOS (DBOSDurability),
through the real packages on PostgreSQL: an agent run inside a DBOS workflow whose tool refunds
an order in a fake payment service (a real process counting refunds), its process SIGKILLed
after the refund and before the run recorded the tool's result, then recovered by DBOS. The
recovered workflow replays the recorded model response, so the same call runs again: alone, a
second refund; through ActionTools keyed by the durable run, none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, ModelResponse, ToolCallPart
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from benchmarks.durable.experiment import Experiment, Runtime
from receiver import (
    ActionError,
    Actions,
    ConfigurationError,
    Connection,
    SQLiteStore,
    ToolCall,
    action_key,
)
from receiver._actions.action import downstream_key
from receiver.contrib.pydantic_ai import ActionTools, Turn

pytestmark = pytest.mark.slow


async def test_a_recovered_durable_agent_refunds_twice_alone_and_once_through_the_executor(
    experiment: Experiment, durable_db: str
) -> None:
    agents = Runtime("pydantic-ai", "benchmarks.durable.pydantic_ai_worker", ("--db", durable_db))
    alone = await experiment.crash_and_recover(agents, "alone")
    assert alone.refunds == 2
    keyed = await experiment.crash_and_recover(agents, "executor", run="agent-wf-1")
    assert keyed.refunds == 1
    (refund,) = await experiment.refunds("agent-wf-1")
    assert keyed.result["refund"] == refund
    # The turn is the durable run's id: the workflow id and the run's place in the workflow.
    assert refund["key"] == downstream_key(action_key("shop", "refund", "agent-wf-1:1.1"))


def refund_once(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart("refund", {"order": "A-1"})])


async def test_keyed_by_the_durable_run_it_refuses_to_act_outside_one(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "receipts.db") as store:
        actions = Actions(store, metrics=False)
        tools: ActionTools[None] = ActionTools(actions, durable_scope="shop")
        ran: list[str] = []

        @tools.tool
        async def refund(call: ToolCall, tx: Connection, order: str) -> Any:
            ran.append(order)
            return {"refunded": order}

        agent: Agent[None, str] = Agent(FunctionModel(refund_once), toolsets=[tools.toolset])
        with pytest.raises(ActionError, match="durable run"):
            await agent.run("refund A-1")
        assert ran == []
        with pytest.raises(ConfigurationError, match="not both"):
            ActionTools(actions, turn=lambda deps: Turn("s", 1), durable_scope="shop")
        with pytest.raises(ConfigurationError, match="durable_scope"):
            ActionTools(actions, durable_scope=" ")
