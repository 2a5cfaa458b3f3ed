"""receiver.contrib.prefect through Prefect 3 itself (a local API server on loopback, SQLite):
a flow whose task refunds an order in a fake payment service (a real process counting refunds),
its process SIGKILLed after the refund and before Prefect recorded the task's result, then the
same flow run retried as ``prefect flow-run retry`` does. Alone, Prefect refunds twice; with the
executor under the task, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.durable.experiment import Experiment, Runtime
from receiver import ActionError, Actions, ConfigurationError, SQLiteStore
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
