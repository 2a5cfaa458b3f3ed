"""The proxy guide's reconcile example (docs/how-to/proxy.md), run as written, in front of a real
vendor on loopback (uvicorn) that takes longer to create a payment than the proxy waits.

The proxy times out while the vendor is still creating the first copy's payment; the client's
retry comes at once, the example's lookup finds nothing yet, and it must not forward a second
copy. Once the vendor is done, the retry gets the payment found by the lookup; the vendor
created one payment. A vendor that never acted gets the request forwarded again once the
example's SETTLED has passed, and creates one payment then. And the guide's test with the
testing kit passes with the example and the lease the guide gives it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from receiver import Connection, IdempotencyProxy, SQLiteStore, Store
from receiver.testing import FakeClock, check_requests
from tests.docs.blocks import DOCS, blocks
from tests.integration.test_proxy_framing import on_loopback
from tests.pgcluster import free_port

PAGE = DOCS / "how-to" / "proxy.md"


class Vendor:
    """Creates a payment ``work`` seconds after a POST arrives (or, ``acts`` False, drops the
    request after that long, having done nothing); lists payments by order."""

    def __init__(self, work: float, acts: bool = True) -> None:
        self.work, self.acts = work, acts
        self.created: list[dict[str, Any]] = []
        self.received = 0
        self._ids = itertools.count(1)
        self.app = Starlette(routes=[Route("/v1/payments", self.payments, methods=["GET", "POST"])])

    async def payments(self, request: Request) -> Response:
        if request.method == "GET":
            order = request.query_params["order"]
            data = [p for p in self.created if p["order"] == order]
            return Response(orjson.dumps({"data": data}), media_type="application/json")
        self.received += 1
        body = orjson.loads(await request.body())
        acts = self.acts
        self.acts = True  # a second copy is acted on
        await asyncio.sleep(self.work)
        if not acts:
            return Response(b'{"error":"dropped"}', 500, media_type="application/json")
        payment = {"id": f"pay_{next(self._ids)}", "order": body["order"]}
        self.created.append(payment)
        return Response(orjson.dumps(payment), 201, media_type="application/json")


def the_example(store: SQLiteStore | None) -> dict[str, Any]:
    """The guide's block that defines ``find_payment``, run as written (its ``store`` given)."""
    [block] = [b for b in blocks(PAGE) if "async def find_payment" in b.text]
    namespace: dict[str, Any] = {"__name__": "__docs__", "store": store}
    exec(compile(block.text, block.where(), "exec"), namespace)
    return namespace


@asynccontextmanager
async def proxied(tmp_path: Path, vendor: Vendor) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    store = SQLiteStore(tmp_path / "proxy.db")
    await store.open()
    example = the_example(store)
    await example["proxy"].aclose()  # the page's own, in front of the page's vendor
    async with on_loopback(vendor.app) as vendor_port:
        proxy = IdempotencyProxy(
            f"http://127.0.0.1:{vendor_port}",
            store=store,
            reconcile=example["find_payment"],
            timeout=0.5,
            lease=5,
            sweep_interval=None,
        )
        try:
            async with (
                on_loopback(proxy) as port,
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client,
            ):
                yield client, example
        finally:
            await proxy.aclose()
            await store.close()


async def pay(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post(
        "/v1/payments",
        content=orjson.dumps({"order": "8891", "amount": 1200}),
        headers={"idempotency-key": "order-8891", "content-type": "application/json"},
    )


async def test_a_retry_right_after_a_timeout_never_forwards_a_second_copy(tmp_path: Path) -> None:
    vendor = Vendor(work=2.0)
    async with proxied(tmp_path, vendor) as (client, _):
        first = await pay(client)
        assert first.status_code == 504  # the proxy gave up; the vendor is still working
        early = await pay(client)  # the vendor has not created the payment yet
        assert early.status_code == 502, early.text
        assert early.headers["retry-after"]
        assert vendor.received == 1
        assert vendor.created == []
        await asyncio.sleep(2.0)  # the vendor finishes the first copy
        assert len(vendor.created) == 1
        settled = await pay(client)
        again = await pay(client)
    assert settled.status_code == 200, settled.text
    assert orjson.loads(settled.content)["data"] == vendor.created
    assert (again.status_code, again.content) == (200, settled.content)
    assert vendor.received == 1  # forwarded once
    assert len(vendor.created) == 1


async def test_a_vendor_that_never_acted_gets_the_request_again_once_settled(
    tmp_path: Path,
) -> None:
    vendor = Vendor(work=1.0, acts=False)
    async with proxied(tmp_path, vendor) as (client, example):
        example["SETTLED"] = 1.5  # the page's 120 s, shortened for the test
        assert (await pay(client)).status_code == 504
        assert (await pay(client)).status_code == 502  # too early to tell
        await asyncio.sleep(1.6)  # the vendor dropped it without acting; SETTLED has passed
        assert vendor.created == []
        forwarded = await pay(client)
        assert forwarded.status_code == 504  # this copy is acted on, after the proxy's timeout
        await asyncio.sleep(1.0)
        settled = await pay(client)  # found by the lookup now
    assert settled.status_code == 200, settled.text
    assert vendor.received == 2
    assert len(vendor.created) == 1


@contextmanager
def in_a_thread(vendor: Vendor) -> Iterator[str]:
    """The vendor on uvicorn in a thread of its own (the kit runs its own event loops)."""
    port = free_port()
    config = uvicorn.Config(vendor.app, port=port, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),))
    thread.start()
    try:
        for _ in range(500):
            if server.started or not thread.is_alive():
                break
            threading.Event().wait(0.02)
        assert server.started, "the vendor did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        loop.close()


def test_the_guides_kit_test_passes_with_the_example() -> None:
    vendor = Vendor(work=0.0)
    example = the_example(None)
    asyncio.run(example["proxy"].aclose())
    find_payment, settled = example["find_payment"], example["SETTLED"]

    async def charged_each_order_once(conn: Connection) -> None:
        orders = [p["order"] for p in vendor.created]
        assert len(orders) == len(set(orders)), f"charged twice: {orders}"

    with in_a_thread(vendor) as sandbox:

        def build(store: Store, clock: FakeClock) -> IdempotencyProxy:
            vendor.created.clear()  # each example starts with a vendor that charged nothing
            return IdempotencyProxy(sandbox, store=store, reconcile=find_payment, lease=settled)

        check_requests(
            build,
            [("POST", "/v1/payments", {"order": "8891", "amount": 1200})],
            invariant=charged_each_order_once,
            max_examples=15,
        )
