"""receiver.contrib.dbos through DBOS itself, on PostgreSQL: a workflow whose step refunds an
order in a fake payment service (a real process counting refunds), its process SIGKILLed after
the refund and before DBOS recorded the step, then recovered by DBOS's own launch-time
recovery. Alone, DBOS refunds twice; with the executor under the step, once."""

from __future__ import annotations

from pathlib import Path

import pytest
from dbos import DBOS

from benchmarks.durable.experiment import Experiment, Runtime
from receiver import ActionError, Actions, ConfigurationError, SQLiteStore, action_key
from receiver._actions.action import downstream_key
from receiver.contrib.dbos import DBOSActions

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
