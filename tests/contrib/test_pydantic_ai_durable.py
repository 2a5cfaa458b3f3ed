"""receiver.contrib.pydantic_ai under Pydantic AI's durable agents on DBOS (DBOSDurability),
through the real packages on PostgreSQL: an agent run inside a DBOS workflow whose tool refunds
an order in a fake payment service (a real process counting refunds), its process SIGKILLed
after the refund and before the run recorded the tool's result, then recovered by DBOS. The
recovered workflow replays the recorded model response, so the same call runs again: alone, a
second refund; through ActionTools keyed by the durable run, none."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS, SetWorkflowID
from prefect import flow
from prefect.context import FlowRunContext
from prefect.settings import PREFECT_API_URL, PREFECT_LOGGING_TO_API_ENABLED, temporary_settings
from pydantic_ai import Agent, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.durable_exec.dbos import DBOSAgent, DBOSDurability
from pydantic_ai.durable_exec.prefect import PrefectAgent, PrefectDurability
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


async def test_inside_a_dbos_workflow_only_an_agent_with_dbos_durability_may_act(
    tmp_path: Path, durable_db: str
) -> None:
    """A plain Agent and the deprecated DBOSAgent wrapper, run inside a DBOS workflow, draw a
    random run id (a recovered workflow would act again under a new key): refused before
    anything is claimed. The agent with DBOSDurability acts, keyed by the workflow."""
    DBOS(
        config={
            "name": "receiver-durable-check",
            "system_database_url": durable_db,
            "log_level": "ERROR",
            "enable_otlp": False,
        }
    )
    try:
        async with SQLiteStore(tmp_path / "receipts.db") as store:
            tools, ran = refunds(Actions(store, metrics=False))
            model = FunctionModel(refund_then_answer)
            plain: Agent[None, str] = Agent(model, name="plain", toolsets=[tools.toolset])
            with pytest.warns(match="DBOSAgent. is deprecated"):
                legacy = DBOSAgent(Agent(model, name="legacy", toolsets=[tools.toolset]))
            durable: Agent[None, str] = Agent(
                model, name="durable", toolsets=[tools.toolset], capabilities=[DBOSDurability()]
            )
            agents: dict[str, Agent[None, str]] = {"plain": plain, "durable": durable}

            @DBOS.workflow(name="durable_check")
            async def settle(which: str) -> str:
                return (await agents[which].run("refund A-1")).output

            DBOS.launch()
            for which, run in [
                ("plain", lambda: settle("plain")),
                ("legacy", lambda: legacy.run("refund A-1")),
            ]:
                with (
                    SetWorkflowID(f"check-{which}-{uuid.uuid4().hex[:8]}"),
                    pytest.raises(ActionError, match=r"no DBOSDurability capability") as refused,
                ):
                    await run()
                assert "capabilities=[DBOSDurability()]" in str(refused.value)
                assert ran == []
                assert await receipts(store) == 0
            wid = f"check-durable-{uuid.uuid4().hex[:8]}"
            with SetWorkflowID(wid):
                assert await settle("durable") == "refunded A-1"
            assert ran == [action_key("shop", "refund", f"{wid}:1.1")]
    finally:
        DBOS.destroy(destroy_registry=True)


async def test_inside_a_prefect_flow_only_an_agent_with_prefect_durability_may_act(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    """The same under Prefect: a plain Agent and the deprecated PrefectAgent inside a flow run
    are refused; the agent with PrefectDurability acts, keyed by the flow run."""
    async with SQLiteStore(tmp_path / "receipts.db") as store:
        tools, ran = refunds(Actions(store, metrics=False), id="refunds")
        model = FunctionModel(refund_then_answer)
        plain: Agent[None, str] = Agent(model, name="plain", toolsets=[tools.toolset])
        with pytest.warns(match="PrefectAgent. is deprecated"):
            legacy = PrefectAgent(Agent(model, name="legacy", toolsets=[tools.toolset]))
        durable: Agent[None, str] = Agent(
            model, name="durable", toolsets=[tools.toolset], capabilities=[PrefectDurability()]
        )
        agents: dict[str, Agent[None, str]] = {"plain": plain, "durable": durable}

        @flow
        async def settle(which: str) -> tuple[str, str]:
            context = FlowRunContext.get()
            assert context is not None
            assert context.flow_run is not None
            return str(context.flow_run.id), (await agents[which].run("refund A-1")).output

        settings = {
            PREFECT_API_URL: prefect_env["PREFECT_API_URL"],
            PREFECT_LOGGING_TO_API_ENABLED: False,
        }
        with temporary_settings(updates=settings):
            for run in (lambda: settle("plain"), lambda: legacy.run("refund A-1")):
                with pytest.raises(ActionError, match="no PrefectDurability capability") as refused:
                    await run()
                assert "capabilities=[PrefectDurability()]" in str(refused.value)
                assert ran == []
                assert await receipts(store) == 0
            flow_run, output = await settle("durable")
        assert output == "refunded A-1"
        assert ran == [action_key("shop", "refund", f"{flow_run}:0.1")]


def refunds(actions: Actions, id: str | None = None) -> tuple[ActionTools[None], list[str]]:
    """A refund tool keyed by the durable run, and the keys its body ran under."""
    tools: ActionTools[None] = ActionTools(actions, durable_scope="shop", id=id)
    ran: list[str] = []

    @tools.tool
    async def refund(call: ToolCall, tx: Connection, order: str) -> Any:
        ran.append(call.action.key)
        return {"refunded": order}

    return tools, ran


def refund_then_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    answered = [
        part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    if answered:
        return ModelResponse(parts=[TextPart(f"refunded {answered[-1]['refunded']}")])
    return ModelResponse(parts=[ToolCallPart("refund", {"order": "A-1"})])


async def receipts(store: SQLiteStore) -> int:
    async with store.acquire() as conn:
        count: int = await conn.fetchval("SELECT count(*) FROM receiver_receipts")
    return count
