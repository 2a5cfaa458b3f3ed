"""The pooled path against the direct one (``python -m benchmarks.pooler``), side by side.

Fresh deliveries (claim, a handler that writes one row through ``tx``, fenced completion) go
through ``Receiver.deliver`` (no HTTP, so that the figure is the store path's) at a fixed
concurrency, to two receivers on one database: one connected directly to PostgreSQL, one
through a real PgBouncer in transaction mode (``?pooler=transaction``: no statement cache),
started here on a free loopback port as the test suite starts it (tests/pgbouncer.py). Rounds
alternate direct, pooled, direct, ...; the figure is each side's best round, in deliveries per
second, and the ratio pooled/direct. The machine's noise moves both sides alike.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time

import orjson

from receiver import Event, PostgresStore, Provider, Receiver, generate_secret, sign
from receiver._store.base import Connection
from tests import pgcluster
from tests.pgbouncer import PgBouncer

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DATABASE = "receiver_bench_pooler"


async def prepare(admin_url: str) -> str:
    url = await pgcluster.recreate_database(admin_url, DATABASE)
    async with PostgresStore(url) as store:
        await store.migrate()
        async with store.acquire() as conn2:
            await conn2.execute("CREATE TABLE bench_orders (id TEXT PRIMARY KEY)")
    return url


def receiver(url: str, secret: str) -> Receiver:
    rx = Receiver(PostgresStore(url, max_size=20), [Provider("acme", [secret])], metrics=False,
                  sweep_interval=None)  # fmt: skip

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> None:
        await tx.execute("INSERT INTO bench_orders (id) VALUES ($1)", event.id)

    return rx


async def round_of(rx: Receiver, secret: str, prefix: str, count: int, concurrency: int) -> float:
    ids = iter(range(count))
    now = int(time.time())

    async def lane() -> None:
        for n in ids:
            webhook_id = f"{prefix}-{n}"
            body = orjson.dumps({"type": "order.created", "data": {"n": n}})
            headers = {
                "webhook-id": webhook_id,
                "webhook-timestamp": str(now),
                "webhook-signature": sign(secret, webhook_id, now, body),
            }
            reply = await rx.deliver("acme", headers, body)
            assert reply.status_code == 200, reply.body

    began = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return count / (time.perf_counter() - began)


async def main(rounds: int, count: int, concurrency: int) -> None:
    url = await prepare(ADMIN_URL)
    bouncer = PgBouncer(ADMIN_URL, "transaction")
    bouncer.start()
    try:
        secret = generate_secret()
        sides = {
            "direct": receiver(url, secret),
            "pooled": receiver(bouncer.url(DATABASE) + "?pooler=transaction", secret),
        }
        best = dict.fromkeys(sides, 0.0)
        for rx in sides.values():
            await rx.open()
        tag = itertools.count()
        for _ in range(rounds):
            for name, rx in sides.items():
                rate = await round_of(rx, secret, f"{name}{next(tag)}", count, concurrency)
                best[name] = max(best[name], rate)
        for rx in sides.values():
            await rx.close()
    finally:
        bouncer.stop()
    print(f"fresh deliveries with a writing handler, concurrency {concurrency}, best of {rounds}")
    for name, rate in best.items():
        print(f"  {name:7s} {rate:8.0f} deliveries/s")
    print(f"  pooled/direct: {best['pooled'] / best['direct']:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.count, args.concurrency))
