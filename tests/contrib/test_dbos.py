"""receiver.contrib.dbos through DBOS itself, on PostgreSQL: a workflow whose step refunds an
order in a fake payment service (a real process counting refunds), its process SIGKILLed after
the refund and before DBOS recorded the step, then recovered by DBOS's own launch-time
recovery. Alone, DBOS refunds twice; with the executor under the step, once."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS, SetWorkflowID

from benchmarks.durable.experiment import Experiment, Runtime
from benchmarks.durable.refunds import Payments, register
from receiver import (
    ActionError,
    Actions,
    ConfigurationError,
    PostgresStore,
    SQLiteStore,
    action_key,
)
from receiver._actions.action import downstream_key
from receiver.contrib.dbos import DBOSActions
from receiver.testing import Resumed, crash_and_resume

pytestmark = pytest.mark.slow


def dbos(db: str) -> Runtime:
    return Runtime("dbos", "benchmarks.durable.dbos_worker", ("--db", db))


async def test_recovery_after_the_effect_refunds_twice_alone_and_once_with_the_executor(
    experiment: Experiment, durable_db: str
) -> None:
    alone = await experiment.crash_and_recover(dbos(durable_db), "alone")
    # DBOS alone: the recovered workflow ran the unrecorded step again (at-least-once).
    assert alone.refunds == 2
    keyed = await experiment.crash_and_recover(dbos(durable_db), "executor", run="wf-keyed-1")
    # The executor: the recovered step's action was reconciled, not called again.
    assert keyed.refunds == 1
    refund = keyed.result["refund"]
    assert refund == (await experiment.refunds("wf-keyed-1"))[0]
    # Keyed by the workflow id and the step's position in it (the workflow's first step).
    assert refund["key"] == downstream_key(action_key("wf-keyed-1", "refund", "step-1.1"))


async def test_killed_after_the_executor_stored_the_result_recovery_replays_it(
    experiment: Experiment, durable_db: str
) -> None:
    run = await experiment.crash_and_recover(dbos(durable_db), "executor", crash="recorded")
    assert run.refunds == 1
    assert run.result["refund"] == (await experiment.refunds(run.result["refund"]["order"]))[0]


async def test_misuse_is_refused_before_anything_runs(tmp_path: Path) -> None:
    actions = Actions(SQLiteStore(tmp_path / "receipts.db"), metrics=False)
    with pytest.raises(ConfigurationError, match="Actions"):
        DBOSActions(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="tenant"):
        DBOSActions(actions, tenant=" ")
    dbos_actions = DBOSActions(actions)
    with pytest.raises(ConfigurationError, match="async def"):

        @dbos_actions.step()
        def sync_step() -> None: ...

    with pytest.raises(ActionError, match=r"@dbos_actions\.step"):
        await dbos_actions.run("refund", {"order": "A-1"})
    assert DBOS.workflow_id is None


async def test_the_kit_drives_dbos_recovery_and_catches_a_bypass_and_a_drifting_key(
    experiment: Experiment, durable_db: str
) -> None:
    """receiver.testing.crash_and_resume under DBOS in this process: the first refund dies after
    the payment answered (SimulatedCrash: DBOS leaves the workflow pending), then
    DBOS.resume_workflow_async recovers it. Through DBOSActions: one refund. A step that
    refunds without the executor, or keys its action by something recovery changes, fails."""
    payments = Payments(experiment.payments_url)
    DBOS(
        config={
            "name": "receiver-kit",
            "system_database_url": durable_db,
            "log_level": "ERROR",
            "enable_otlp": False,
        }
    )
    store = PostgresStore(durable_db, max_size=4)
    await store.open()
    try:
        actions = Actions(store, metrics=False, lease=0.5, sweep_interval=None)
        register(actions, payments)
        dbos_actions = DBOSActions(actions)

        @dbos_actions.step(retries_allowed=True, interval_seconds=0.2)
        async def keyed_step(order: str) -> Any:
            return (await dbos_actions.run("refund", {"order": order, "cents": 5})).value

        @DBOS.step()
        async def bypassing_step(order: str) -> Any:
            return await payments.refund(order, 5)

        @DBOS.step()
        async def drifting_step(order: str) -> Any:
            # Keyed by a fresh id each time the step runs: a recovered step asks for another.
            action = actions.propose(
                "refund",
                scope="shop",
                action_id=uuid.uuid4().hex,
                request={"order": order, "cents": 5},
            )
            return (await actions.execute(action)).value

        steps = {"keyed": keyed_step, "bypassing": bypassing_step, "drifting": drifting_step}

        @DBOS.workflow(name="kit_settle")
        async def settle(how: str, order: str) -> Any:
            return await steps[how](order)

        DBOS.launch()

        async def prove(how: str) -> tuple[str, Resumed]:
            wid = f"kit-{how}-{uuid.uuid4().hex[:8]}"

            async def start() -> Any:
                with SetWorkflowID(wid):
                    return await settle(how, wid)

            async def resume() -> Any:
                return await (await DBOS.resume_workflow_async(wid)).get_result()

            return wid, await crash_and_resume(actions, "refund", start, resume)

        wid, resumed = await prove("keyed")
        assert resumed.body_runs == 1
        assert resumed.reconciled == 1
        assert resumed.keys == (resumed.key, resumed.key)
        assert resumed.key == action_key(wid, "refund", "step-1.1")
        assert len(await experiment.refunds(wid)) == 1
        assert resumed.result == (await experiment.refunds(wid))[0]
        with pytest.raises(AssertionError, match="never called tool 'refund'"):
            await prove("bypassing")
        with pytest.raises(AssertionError, match="asked for another action"):
            await prove("drifting")
    finally:
        DBOS.destroy(destroy_registry=True)
        await store.close()
