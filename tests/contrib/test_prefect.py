"""receiver.contrib.prefect through Prefect 3 itself (a local API server on loopback, SQLite):
a flow whose task refunds an order in a fake payment service (a real process counting refunds),
its process SIGKILLed after the refund and before Prefect recorded the task's result, then the
same flow run retried as ``prefect flow-run retry`` does. Alone, Prefect refunds twice; with the
executor under the task, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.context import FlowRunContext
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_LOGGING_TO_API_ENABLED,
    temporary_settings,
)

from benchmarks.durable.experiment import Experiment, Runtime
from receiver import ActionError, Actions, ConfigurationError, Connection, SQLiteStore, ToolCall
from receiver.contrib.prefect import PrefectActions

pytestmark = pytest.mark.slow


def prefect(db: str, env: dict[str, str]) -> Runtime:
    return Runtime("prefect", "benchmarks.durable.prefect_worker", ("--db", db), env)


async def test_a_retried_flow_run_refunds_twice_alone_and_once_with_the_executor(
    experiment: Experiment, durable_db: str, prefect_env: dict[str, str]
) -> None:
    alone = await experiment.crash_and_recover(prefect(durable_db, prefect_env), "alone")
    # Prefect alone: the task had no cached result, so the retried flow run ran it again.
    assert alone.refunds == 2
    keyed = await experiment.crash_and_recover(prefect(durable_db, prefect_env), "executor")
    # The executor: the task's action (flow run id, task key) was reconciled, not run again.
    assert keyed.refunds == 1
    (refund,) = await experiment.refunds(keyed.result["refund"]["order"])
    assert keyed.result["refund"] == refund
    assert refund["key"].startswith("rcv_")


async def test_misuse_is_refused_before_anything_runs(tmp_path: Path) -> None:
    actions = Actions(SQLiteStore(tmp_path / "receipts.db"), metrics=False)
    with pytest.raises(ConfigurationError, match="Actions"):
        PrefectActions(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="tenant"):
        PrefectActions(actions, tenant="")
    prefect_actions = PrefectActions(actions)
    with pytest.raises(ConfigurationError, match="async def"):

        @prefect_actions.task()
        def sync_task() -> None: ...

    with pytest.raises(ActionError, match=r"@prefect_actions\.task"):
        await prefect_actions.run("refund", {"order": "A-1"})


async def test_keys_are_the_flow_run_and_the_tasks_key_and_a_task_without_one_is_refused(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    """In this process, against the session's Prefect server: two calls of a tool in one task
    are the task's actions 1 and 2 in the flow run's scope; a NO_CACHE task has no key."""
    async with SQLiteStore(tmp_path / "receipts.db") as store:
        actions = Actions(store, metrics=False)
        ran: list[str] = []

        @actions.tool("note")
        async def note(call: ToolCall, tx: Connection) -> Any:
            ran.append(call.action.key)
            return {"noted": call.request["text"]}

        prefect_actions = PrefectActions(actions, tenant="t-1")

        @prefect_actions.task()
        async def two_notes(text: str) -> list[Any]:
            return [
                (await prefect_actions.run("note", {"text": text})).value,
                (await prefect_actions.run("note", {"text": text})).value,
            ]

        @prefect_actions.task(persist_result=False)  # Prefect turns the cache off: no key
        async def keyless(text: str) -> Any:
            return (await prefect_actions.run("note", {"text": text})).value

        @flow
        async def notes(text: str) -> tuple[str, Any]:
            context = FlowRunContext.get()
            assert context is not None
            assert context.flow_run is not None
            return str(context.flow_run.id), await two_notes(text)

        @flow
        async def refused(text: str) -> Any:
            return await keyless(text)

        settings = {
            PREFECT_API_URL: prefect_env["PREFECT_API_URL"],
            PREFECT_LOGGING_TO_API_ENABLED: False,
        }
        with temporary_settings(updates=settings):
            run_id, got = await notes("hello")
            with pytest.raises(ConfigurationError, match="no cache key"):
                await refused("hello")
        assert got == [{"noted": "hello"}, {"noted": "hello"}]
        assert [k.split(":")[0] for k in ran] == [f"t-1%2F{run_id}"] * 2
        assert [k.split(":")[2].rsplit(".", 1)[1] for k in ran] == ["1", "2"]
        assert ran[0].split(":")[2].startswith("two_notes-")
