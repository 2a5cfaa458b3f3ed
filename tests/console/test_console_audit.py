"""The console's audit of operator actions, on both stores: a replay whose handlers fail again
is recorded and shown as a failure, never as a success."""

from __future__ import annotations

import httpx

from receiver import Store

from .shop import Shop


async def test_a_failed_replay_is_shown_and_recorded_as_failed(store: Store) -> None:
    shop = Shop(store)
    async with store.acquire() as conn:
        await conn.execute("DELETE FROM receiver_audit")
    shop.failing.add("msg_1")
    assert await shop.send("msg_1") == 500
    console = shop.rx.console()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console), base_url="http://console.test"
    ) as client:
        await client.get("/")
        form = {
            "csrf": client.cookies["receiver_console_csrf"],
            "provider": "shop",
            "id": "msg_1",
            "fence": "1",
            "reason": "try again",
            "operator": "Ada",
        }
        failed = await client.post("/replay", data=form)
        assert failed.status_code == 303
        shown = (await client.get(failed.headers["location"])).text
        shop.failing.clear()
        fixed = await client.post("/replay", data={**form, "fence": "2"})
        assert fixed.status_code == 303
        succeeded = (await client.get(fixed.headers["location"])).text
    assert "Replay FAILED: handler_failed" in shown
    assert "Replayed:" not in shown
    assert "Replayed: executed (HTTP 200, fence 3)" in succeeded
    async with store.acquire() as conn:
        rows = [dict(r) for r in await conn.run_all("console_audit_list", None, 10)]
    assert [(r["action"], r["outcome"], r["fence"]) for r in rows] == [
        ("replay", "executed", 2),
        ("replay", "handler_failed", 1),
    ]
    assert shop.runs["msg_1"] == 3
