"""The files ``receiver init`` writes: a webhook receiver, or an agent's tool,
each with its three tests written with receiver.testing (a retry replays, 100 concurrent copies
run once, a crash mid-handler runs once after recovery) and a README that says how to run it
and how to move to PostgreSQL."""

from __future__ import annotations

CONFIG = """\
# The receiver's configuration (`receiver serve --config receiver.toml`). Every key is checked
# at start-up: a typo is an error, not a silent default.

# Where the ledger lives. The embedded SQLite default needs no server; for PostgreSQL:
#   store = "postgresql://app@db.internal/app"   (then `receiver migrate --config receiver.toml`)
# RECEIVER_STORE or --store override it.
store = "sqlite:///app.db"

# Modules whose register(rx) adds the handlers.
handlers = ["orders"]
# The app's own tables: the .sql files of this directory, applied in name order, each once, by
# `receiver migrate --config receiver.toml` as the database's owner (the serving role needs no
# CREATE). Add a new file for a change; never edit one that has been applied.
migrations = "sql"
# POST http://127.0.0.1:8000/shop
[providers.shop]
scheme = "standard-webhooks"
secrets_env = ["SHOP_WEBHOOK_SECRET"]   # the names of variables holding the secrets
schedule = "svix"                       # the sender's retry schedule: the dedup window's basis
"""

ORDERS = '''\
"""The webhook handlers: one order row per ``order.created`` event.

The table is sql/0001_orders.sql's, created by ``receiver migrate`` as the owner. The row is
written through ``tx``, so it commits in one transaction with the receipt: a
redelivery replays the stored answer and never inserts a second row, and a crash before the
commit leaves nothing behind. (The table has no unique constraint on purpose: the tests prove
that the ledger, not the table, keeps the effect to one.)
"""

from typing import Any

from starlette.responses import JSONResponse

from receiver import Connection, Event, Receiver


def valid(order: Any) -> bool:
    """What the table holds: an order_id of 1-200 characters without NUL (PostgreSQL's text
    has none), an amount_cents (whole cents) that fits INTEGER."""
    if not isinstance(order, dict):
        return False
    order_id, total = order.get("order_id"), order.get("amount_cents")
    return (
        isinstance(order_id, str)
        and 0 < len(order_id) <= 200
        and "\\x00" not in order_id
        and type(total) is int
        and 0 <= total < 2**31
    )


def register(rx: Receiver) -> None:
    # The orders table comes from sql/0001_orders.sql (`receiver migrate`), not from here.
    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> Any:
        order = event.payload.get("data")
        if not valid(order):
            # Final: the same event will never fit, so a 422 (a 5xx would be retried for nothing).
            detail = "data needs an order_id (text) and an amount_cents (whole cents)"
            return JSONResponse({{"error": detail}}, status_code=422)
        await tx.execute(
            "INSERT INTO orders (id, total) VALUES ($1, $2)",
            order["order_id"],
            order["amount_cents"],
        )
        return {{"order_id": order["order_id"], "status": "created"}}
'''

TEST_ORDERS = '''\
"""The three tests every receiver needs, with receiver.testing: a redelivery replays, 100
concurrent copies run once, a crash mid-handler runs once after recovery.

``receiver_store`` is a throwaway SQLite file, or a throwaway database on the PostgreSQL server
named by RECEIVER_TEST_PG_URL; ``receiver_clock`` is the fake clock it runs on.
"""

from pathlib import Path

import pytest

from receiver import generate_secret, load_config
from receiver.testing import (
    Fault,
    Faults,
    Sender,
    assert_count,
    assert_executed_once,
    assert_nothing_in_flight,
    assert_replayed,
)

SECRET = generate_secret()
CONFIG = Path(__file__).with_name("receiver.toml")
ORDERS = "SELECT count(*) FROM orders WHERE id = $1"


async def build(store, clock):
    config = load_config(CONFIG)
    await config.migrate(store)  # the app's tables (sql/), as `receiver migrate` makes them
    return config.receiver(store=store, clock=clock, environ={{"SHOP_WEBHOOK_SECRET": SECRET}})

@pytest.mark.asyncio
async def test_a_redelivery_replays(receiver_store, receiver_clock):
    rx = await build(receiver_store, receiver_clock)
    async with rx, Sender(rx, "shop", SECRET, clock=receiver_clock) as shop:
        created = shop.event("order.created", {{"order_id": "ord_1", "amount_cents": 1200}})
        first = await shop.send(created)
        again = [await shop.send(created) for _ in range(3)]
        assert first.outcome == "executed", first
        assert_replayed(first, again)
        await assert_count(rx.store, 1, ORDERS, "ord_1")


@pytest.mark.asyncio
async def test_a_hundred_concurrent_copies_run_once(receiver_store, receiver_clock):
    rx = await build(receiver_store, receiver_clock)
    async with rx, Sender(rx, "shop", SECRET, clock=receiver_clock) as shop:
        created = shop.event("order.created", {{"order_id": "ord_2", "amount_cents": 99}})
        assert_executed_once(await shop.twins(created, 100))  # one barrier
        await assert_count(rx.store, 1, ORDERS, "ord_2")


@pytest.mark.asyncio
async def test_a_crash_mid_handler_runs_once_after_recovery(receiver_store, receiver_clock):
    rx = await build(receiver_store, receiver_clock)
    async with rx, Sender(rx, "shop", SECRET, clock=receiver_clock) as shop:
        created = shop.event("order.created", {{"order_id": "ord_3", "amount_cents": 5}})
{crash}
        await assert_count(rx.store, 1, ORDERS, "ord_3")
        await assert_nothing_in_flight(rx.store)
'''

CRASH_INLINE = """\
        # The handler wrote its row, then the process "died" before the commit.
        Faults.of(rx).arm(created.id, Fault.BEFORE_COMMIT)
        died = await shop.send(created)
        assert died.outcome == "died", died
        receiver_clock.advance(61)  # the dead attempt's lease (60 s) runs out
        recovered = await shop.send(created)  # the sender's retry
        assert recovered.outcome == "executed", recovered
        assert_replayed(recovered, [await shop.send(created)])"""

AGENT = '''\
"""An agent's tool that runs once per action: ``create_order`` writes one order row.

The key is the system's (a scope such as the tenant, and an action id your code assigns, never
text the model wrote); the row is written through ``tx``, so it commits with the stored result.
Every retry of the action gets that stored result back.
"""

import os

from receiver import Actions, Store, store_from_url

ORDERS_DDL = "CREATE TABLE IF NOT EXISTS orders (id TEXT NOT NULL, total INTEGER NOT NULL)"


def register_tools(actions: Actions) -> None:
    @actions.tool("create_order", volatile=("note",))  # the model's own words: not the request
    async def create_order(call, tx):
        await tx.execute(
            "INSERT INTO orders (id, total) VALUES ($1, $2)",
            call.request["order_id"],
            call.request["amount_cents"],
        )
        return {"created": call.request["order_id"]}


async def build_actions(store: Store) -> Actions:
    async with store.acquire() as conn:
        await conn.execute(ORDERS_DDL)
    actions = Actions(store)
    register_tools(actions)
    return actions


async def main() -> None:
    async with store_from_url(os.environ.get("RECEIVER_STORE", "sqlite:///app.db")) as store:
        actions = await build_actions(store)
        action = actions.propose(
            "create_order", scope="tenant-1", action_id="order-1",
            request={"order_id": "order-1", "amount_cents": 1200, "note": "as the user asked"},
        )
        print(await actions.execute(action))  # run it twice: the same stored result


if __name__ == "__main__":
    import asyncio

    asyncio.run(main())
'''

TEST_AGENT = '''\
"""The three tests every tool needs, with receiver.testing: a retry replays, 100 concurrent
copies run once, a crash mid-tool runs once after recovery.

``receiver_store`` is a throwaway SQLite file, or a throwaway database on the PostgreSQL server
named by RECEIVER_TEST_PG_URL; ``receiver_clock`` is the fake clock it runs on.
"""

import pytest
from agent import build_actions

from receiver.testing import (
    Fault,
    Planner,
    assert_count,
    assert_executed_once,
    assert_replayed,
    crash_and_recover,
)

ORDERS = "SELECT count(*) FROM orders WHERE id = $1"


def order(planner, order_id):
    return planner.propose("create_order", order_id, {"order_id": order_id, "amount_cents": 1200})


@pytest.mark.asyncio
async def test_a_retry_replays(receiver_store):
    async with receiver_store as store:
        planner = Planner(await build_actions(store))
        action = order(planner, "order-1")
        first = await planner.execute(action)
        again = [await planner.execute(action), await planner.execute(planner.regenerate(action))]
        assert first.outcome == "executed", first
        assert_replayed(first, again)
        await assert_count(store, 1, ORDERS, "order-1")


@pytest.mark.asyncio
async def test_a_hundred_concurrent_copies_run_once(receiver_store):
    async with receiver_store as store:
        planner = Planner(await build_actions(store))
        assert_executed_once(await planner.twins(order(planner, "order-2"), 100))
        await assert_count(store, 1, ORDERS, "order-2")


@pytest.mark.asyncio
async def test_a_crash_mid_tool_runs_once_after_recovery(receiver_store, receiver_clock):
    async with receiver_store as store:
        planner = Planner(await build_actions(store))
        # The tool wrote its row, the process "died" before the commit, the lease ran out,
        # and the planner's retry ran it again: one row.
        await crash_and_recover(planner, order(planner, "order-3"), receiver_clock,
                                fault=Fault.BEFORE_COMMIT)
        await assert_count(store, 1, ORDERS, "order-3")
'''

README = """\
# {name}

Made with `receiver init`{option}. It runs on the embedded SQLite file `app.db`: no server.

```console
pip install "receiver-webhooks[testing]"
python -m pytest          # the three tests: a retry replays, 100 copies run once, a crash
{run}
```

## Move to PostgreSQL

The PostgreSQL driver (asyncpg) comes with the package: no extra to install.

```console
export RECEIVER_STORE=postgresql://app@db.internal/app   # or `store = ...` in receiver.toml
receiver migrate --config receiver.toml                # as the owner: the ledger's and sql/
RECEIVER_TEST_PG_URL=postgresql://postgres@127.0.0.1/postgres python -m pytest
```

The tests then run on a throwaway database of that server, as they run on SQLite by default.
"""

RUN_WEBHOOK = """\
receiver migrate --config receiver.toml   # the ledger's tables and the app's (sql/), once
export SHOP_WEBHOOK_SECRET=$(python -c 'import receiver; print(receiver.generate_secret())')
receiver serve --config receiver.toml
receiver send --url http://127.0.0.1:8000/shop --secret "$SHOP_WEBHOOK_SECRET" \\
  --type order.created --data '{"order_id": "ord_1", "amount_cents": 1200}' \\
  --id msg_1   # twice: a replay"""

RUN_AGENT = "python agent.py        # twice: the same stored result"

PYPROJECT = """\
# Run the tests with `python -m pytest` (receiver's pytest plugin provides the fixtures).
[tool.pytest.ini_options]
asyncio_default_fixture_loop_scope = "function"
"""

TEST_QUEUED = '''\
"""The three tests every receiver needs, with receiver.testing, in queued mode: a redelivery
replays the stored 202, 100 concurrent copies run once, a crash mid-handler (on a worker) runs
once after recovery. The workers run in the test's process, as ``receiver worker`` would.

``receiver_store`` is a throwaway SQLite file, or a throwaway database on the PostgreSQL server
named by RECEIVER_TEST_PG_URL; ``receiver_clock`` is the fake clock it runs on.
"""

import asyncio
import contextlib
from pathlib import Path

import pytest

from receiver import generate_secret, load_config
from receiver.testing import (
    Fault,
    Faults,
    Sender,
    assert_count,
    assert_executed_once,
    assert_nothing_in_flight,
    assert_replayed,
    count,
)

SECRET = generate_secret()
CONFIG = Path(__file__).with_name("receiver.toml")
ORDERS = "SELECT count(*) FROM orders WHERE id = $1"


async def build(store, clock):
    config = load_config(CONFIG)
    await config.migrate(store)  # the app's tables (sql/), as `receiver migrate` makes them
    return config.receiver(store=store, clock=clock, environ={"SHOP_WEBHOOK_SECRET": SECRET})


@contextlib.asynccontextmanager
async def workers(rx):
    worker = rx.worker(concurrency=2, poll_interval=0.05, stale_interval=0.05)
    assert await worker.open()
    running = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await running


async def ran(rx, order_id):
    """Wait (at most 10 s) for the workers to write the order, then let them go on a moment."""
    for _ in range(500):
        if await count(rx.store, ORDERS, order_id):
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)


@pytest.mark.asyncio
async def test_a_redelivery_replays(receiver_store, receiver_clock):
    rx = await build(receiver_store, receiver_clock)
    async with rx, Sender(rx, "shop", SECRET, clock=receiver_clock) as shop, workers(rx):
        created = shop.event("order.created", {"order_id": "ord_1", "amount_cents": 1200})
        first = await shop.send(created)
        assert first.status == 202, first
        assert_replayed(first, [await shop.send(created) for _ in range(3)])
        await ran(rx, "ord_1")
        await assert_count(rx.store, 1, ORDERS, "ord_1")


@pytest.mark.asyncio
async def test_a_hundred_concurrent_copies_run_once(receiver_store, receiver_clock):
    rx = await build(receiver_store, receiver_clock)
    async with rx, Sender(rx, "shop", SECRET, clock=receiver_clock) as shop, workers(rx):
        created = shop.event("order.created", {"order_id": "ord_2", "amount_cents": 99})
        assert_executed_once(await shop.twins(created, 100))  # one barrier
        await ran(rx, "ord_2")
        await assert_count(rx.store, 1, ORDERS, "ord_2")


@pytest.mark.asyncio
async def test_a_crash_mid_handler_runs_once_after_recovery(receiver_store, receiver_clock):
    rx = await build(receiver_store, receiver_clock)
    async with rx, Sender(rx, "shop", SECRET, clock=receiver_clock) as shop, workers(rx):
        created = shop.event("order.created", {"order_id": "ord_3", "amount_cents": 5})
        # The worker's handler writes its row, then the process "dies" before the commit.
        Faults.of(rx).arm(created.id, Fault.BEFORE_COMMIT)
        accepted = await shop.send(created)
        for _ in range(500):
            if not Faults.of(rx).pending(created.id):
                break
            await asyncio.sleep(0.02)
        assert not Faults.of(rx).pending(created.id), "the worker never took the delivery"
        await assert_count(rx.store, 0, ORDERS, "ord_3")  # rolled back with the attempt
        receiver_clock.advance(61)  # the dead attempt's lease (60 s) runs out
        await ran(rx, "ord_3")  # another attempt takes it over
        await assert_count(rx.store, 1, ORDERS, "ord_3")
        await assert_nothing_in_flight(rx.store)
        assert_replayed(accepted, [await shop.send(created)])
'''

APP_SQL = """\
-- The orders table (receiver.toml's `migrations = "sql"`): `receiver migrate --config
-- receiver.toml` applies it once, as the role that runs the migrations (the owner).
CREATE TABLE orders (id TEXT NOT NULL, total INTEGER NOT NULL);
"""

QUEUED_MODE = """\
mode = "queued"                         # answer 202 once stored; workers run the handler
"""
