"""Each fenced statement of the ledger, called directly on the real stores: what it changes, and
what it refuses (a stale fence, a state it must not touch, a boundary of the lease or the
window), one contract at a time.

These are the tests that kill the mutants of the claim, fence, completion, release and
recovery statements (tests/mutation.py; CONTRIBUTING.md, "Mutation testing"); the state
machine (test_state_machine.py) checks the same through a Receiver, by random sequences.
"""

from __future__ import annotations

import pytest

from receiver import Connection, LeaseLost, SQLiteStore, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Claimed, Key, Receipt, State, StoredResponse
from receiver._queue import receipts as queue
from receiver._verification.payload import parse
from tests.support import EFFECTS_DDL, PROVIDER, T0, body_of, effects

LEASE = 60.0
WINDOW = 3600.0
ANSWER = StoredResponse(200, "application/json", b'{"ok":1}', (("x-answer", "1"),))
FAILED = StoredResponse(422, "text/plain", b"no", (("retry-after", "5"),))


def claim_of(
    webhook_id: str,
    now: float,
    *,
    order: str = "o-1",
    lease: float = LEASE,
    window: float = WINDOW,
    event_type: str = "order.created",
) -> Claim:
    body = body_of(order=order)
    return Claim(
        Key(PROVIDER, webhook_id),
        parse(body, None).payload_hash,
        event_type,
        body,
        now,
        lease,
        window,
    )


async def claimed(conn: Connection, c: Claim) -> Claimed:
    got = await ledger.claim(conn, c)
    assert isinstance(got, Claimed), got
    return got


async def found(conn: Connection, webhook_id: str, now: float) -> Receipt:
    receipt = await ledger.lookup(conn, Key(PROVIDER, webhook_id), now)
    assert receipt is not None
    return receipt


async def a_queued_receipt(conn: Connection, webhook_id: str, now: float) -> Receipt:
    """A receipt of queued mode, waiting for a worker (fence 0)."""
    c = claim_of(webhook_id, now, order=f"queued-{webhook_id}")
    assert await queue.enqueue(conn, [c], now) == {c.key: False}
    receipt = await found(conn, webhook_id, now)
    assert receipt.state is State.QUEUED
    return receipt


# The claim


async def test_a_key_never_claimed_is_not_found(store: Store) -> None:
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        assert await ledger.lookup(conn, Key(PROVIDER, "msg_b"), T0) is None
        assert await ledger.lookup(conn, Key("other", "msg_a"), T0) is None


async def test_a_key_is_claimed_once_and_the_loser_reads_its_own_receipt(store: Store) -> None:
    async with store.acquire() as conn:
        a = await claimed(conn, claim_of("msg_a", T0))
        assert (a.fence, a.now, a.drift) == (1, T0, False)
        b = await claimed(conn, claim_of("msg_b", T0 + 1, order="o-2", event_type="b"))
        assert (b.fence, b.now) == (1, T0 + 1)
        await ledger.complete(conn, Key(PROVIDER, "msg_a"), 1, ANSWER, T0 + 2)
        # Each duplicate gets its own key's receipt, whichever row the store reads first.
        again_a = await ledger.claim(conn, claim_of("msg_a", T0 + 3))
        again_b = await ledger.claim(conn, claim_of("msg_b", T0 + 3, order="o-2"))
    assert isinstance(again_a, Receipt)
    assert (again_a.state, again_a.fence, again_a.response) == (State.COMPLETED, 1, ANSWER)
    assert again_a.now == T0 + 3
    assert isinstance(again_b, Receipt)
    assert (again_b.state, again_b.event_type, again_b.response) == (State.IN_FLIGHT, "b", None)
    assert again_b.claimed_at == T0 + 1


async def test_a_claim_whose_row_keeps_vanishing_gives_up_after_three_tries(
    sqlite_store: SQLiteStore,
) -> None:
    """The row a lost claim looks up can be deleted in between (the sweeper expired it): the
    claim tries again, three times in all. A trigger that drops every insert of the key and
    counts the tries stands for a sweeper that always wins the race."""
    async with sqlite_store.acquire() as conn:
        await conn.execute(EFFECTS_DDL)
        await conn.execute(
            "CREATE TRIGGER vanish BEFORE INSERT ON receiver_receipts"
            " WHEN NEW.webhook_id = 'msg_ghost' BEGIN"
            " INSERT INTO effects (provider, webhook_id, fence) VALUES ('acme', 'msg_ghost', 0);"
            " SELECT RAISE(IGNORE); END"
        )
        with pytest.raises(LeaseLost, match=r"^receipt 'msg_ghost' kept vanishing while being"):
            await ledger.claim(conn, claim_of("msg_ghost", T0))
    assert await effects(sqlite_store, "msg_ghost") == 3


async def test_a_claim_reports_drift_only_for_the_same_payload_in_the_window(
    store: Store,
) -> None:
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0, window=100))
        assert (await claimed(conn, claim_of("msg_b", T0 + 1, window=100))).drift
        other = await claimed(conn, claim_of("msg_c", T0 + 2, order="o-2", window=100))
        assert not other.drift
        # msg_a's window ends at T0 + 100 (msg_b's at T0 + 101): at that instant msg_a no
        # longer counts, and past both, the payload is new again.
        assert (await claimed(conn, claim_of("msg_d", T0 + 100, window=100))).drift
        assert not (await claimed(conn, claim_of("msg_e", T0 + 300, window=100))).drift


async def test_a_payload_whose_window_ends_at_that_instant_is_no_drift(store: Store) -> None:
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0, window=100))
        assert not (await claimed(conn, claim_of("msg_b", T0 + 100, window=100))).drift


async def test_a_batch_of_claims_gives_each_key_to_its_first_copy(store: Store) -> None:
    """claim_many (the micro-batcher's flush): one result per claim, in order."""
    async with store.acquire() as conn:
        # Already there: the same webhook-id under two providers, and an older receipt whose
        # payload o-9 shares with nothing but the batch's first claim.
        await claimed(conn, claim_of("msg_old", T0, order="o-9", window=100))
        await claimed(conn, claim_of("msg_live", T0, order="o-7"))
        other = Claim(Key("other", "msg_old"), b"h" * 32, "x", b"{}", T0, LEASE, WINDOW)
        assert isinstance(await ledger.claim(conn, other), Claimed)
        await ledger.complete(conn, Key(PROVIDER, "msg_old"), 1, ANSWER, T0 + 1)
        got = await ledger.claim_many(
            conn,
            [
                claim_of("msg_a", T0 + 100, order="o-9"),  # o-9's window ended at T0 + 100
                claim_of("msg_b", T0 + 100, order="o-2"),
                claim_of("msg_a", T0 + 100, order="o-9"),  # a copy: the first one won
                claim_of("msg_old", T0 + 100, order="o-9"),
                claim_of("msg_c", T0 + 100, order="o-3"),
                claim_of("msg_d", T0 + 100, order="o-7"),  # msg_live's payload: drift
            ],
            T0 + 100,
        )
        receipts = [await found(conn, w, T0 + 101) for w in ("msg_a", "msg_b", "msg_c", "msg_d")]
    a, b, copy, old, c, d = got
    assert isinstance(a, Claimed)
    assert isinstance(b, Claimed)
    assert isinstance(c, Claimed)
    assert isinstance(d, Claimed)
    assert [(x.fence, x.now, x.drift) for x in (a, b, c)] == [(1, T0 + 100, False)] * 3
    assert (d.fence, d.drift) == (1, True)
    if store.dialect == "postgresql":
        assert copy is None  # the caller looks it up
    else:
        assert isinstance(copy, Receipt)
        assert (copy.state, copy.fence, copy.now) == (State.IN_FLIGHT, 1, T0 + 100)
    assert isinstance(old, Receipt)
    assert (old.key, old.state, old.response) == (Key(PROVIDER, "msg_old"), State.COMPLETED, ANSWER)
    assert old.now == T0 + 100  # read at the batch's time
    assert [r.state for r in receipts] == [State.IN_FLIGHT] * 4
    assert [r.request_body for r in receipts] == [
        body_of(order=o) for o in ("o-9", "o-2", "o-3", "o-7")
    ]


# Reclaim: the compare-and-set on the fence


async def test_a_released_receipt_is_reclaimed_once_with_the_next_fence(store: Store) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        assert await ledger.release(conn, key, 1, "boom", T0 + 1)
        retry = claim_of("msg_a", T0 + 2, order="o-2", event_type="b", lease=30, window=900)
        assert await ledger.reclaim(conn, retry, 1) == 2
        assert await ledger.reclaim(conn, retry, 1) is None  # the fence it saw is gone
        assert await ledger.reclaim(conn, retry, 2) is None  # and the new one holds a lease
        r = await found(conn, "msg_a", T0 + 3)
    assert (r.state, r.fence, r.event_type) == (State.IN_FLIGHT, 2, "b")
    assert r.payload_hash == retry.payload_hash
    assert r.request_body == retry.body
    assert (r.claimed_at, r.lease_until, r.expires_at) == (T0 + 2, T0 + 32, T0 + 902)
    # Not expired: the attempts and the last error are the key's history.
    assert (r.attempts, r.last_error) == (1, "boom")


async def test_a_reclaim_under_a_fence_released_since_is_refused(store: Store) -> None:
    """A caller that saw fence 1 released is too late once fence 2 is released too: the
    receipt is reclaimable, but not by what that caller saw."""
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        assert await ledger.release(conn, key, 1, "first", T0 + 1)
        assert await ledger.reclaim(conn, claim_of("msg_a", T0 + 2), 1) == 2
        assert await ledger.release(conn, key, 2, "second", T0 + 3)
        assert await ledger.reclaim(conn, claim_of("msg_a", T0 + 4), 1) is None
        r = await found(conn, "msg_a", T0 + 5)
    assert (r.state, r.fence, r.attempts) == (State.RELEASED, 2, 2)


async def test_an_in_flight_receipt_is_taken_over_from_the_instant_its_lease_ends(
    store: Store,
) -> None:
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        assert await ledger.reclaim(conn, claim_of("msg_a", T0 + LEASE - 1), 1) is None
        assert await ledger.reclaim(conn, claim_of("msg_a", T0 + LEASE), 1) == 2


@pytest.mark.parametrize("state", [State.COMPLETED, State.FAILED])
async def test_a_finished_receipt_is_reclaimed_only_from_the_end_of_its_window(
    store: Store, state: State
) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0, window=600))
        await ledger.complete(conn, key, 1, ANSWER, T0 + 1, state=state)
        # Its lease ended long ago; only the window counts.
        assert await ledger.reclaim(conn, claim_of("msg_a", T0 + 599), 1) is None
        assert await ledger.reclaim(conn, claim_of("msg_a", T0 + 600), 1) == 2
        r = await found(conn, "msg_a", T0 + 601)
    assert (r.state, r.response, r.completed_at) == (State.IN_FLIGHT, None, None)


async def test_reclaiming_an_expired_receipt_starts_its_history_again(store: Store) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0, window=600))
        assert await ledger.release(conn, key, 1, "boom", T0 + 1)
        assert await ledger.reclaim(conn, claim_of("msg_a", T0 + 600), 1) == 2
        r = await found(conn, "msg_a", T0 + 601)
    assert (r.attempts, r.last_error) == (0, None)


async def test_a_reclaimed_receipt_keeps_no_answer_of_the_attempt_before(store: Store) -> None:
    """The old answer's columns are all cleared, so that the console and the CLI, which read
    them one by one, show none of it."""
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0, window=600))
        await ledger.complete(conn, key, 1, ANSWER, T0 + 1)
        assert await ledger.reclaim(conn, claim_of("msg_a", T0 + 600), 1) == 2
        row = await conn.fetchrow(
            "SELECT response_status, response_content_type, response_body, response_headers,"
            " completed_at FROM receiver_receipts WHERE webhook_id = $1",
            "msg_a",
        )
    assert row is not None
    assert tuple(row.values()) == (None, None, None, None, None)


async def test_a_live_in_flight_receipt_past_its_window_is_not_reclaimed(store: Store) -> None:
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0, lease=600, window=600))
        await ledger.extend_lease(conn, Key(PROVIDER, "msg_a"), 1, T0 + 500, 600)
        assert await ledger.reclaim(conn, claim_of("msg_a", T0 + 700), 1) is None


async def test_a_queued_receipt_is_not_reclaimed_by_the_inline_statement(store: Store) -> None:
    async with store.acquire() as conn:
        waiting = await a_queued_receipt(conn, "msg_q", T0)
        assert await ledger.reclaim(conn, claim_of("msg_q", T0 + 10), waiting.fence) is None
        assert (await found(conn, "msg_q", T0 + 10)).state is State.QUEUED


# Completion


async def test_a_completion_stores_the_answer_under_its_fence_once(store: Store) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        await claimed(conn, claim_of("msg_b", T0))  # another key with the same fence
        await ledger.complete(conn, key, 1, ANSWER, T0 + 5)
        with pytest.raises(LeaseLost, match=r"^fence 1 of acme/msg_a is stale$"):
            await ledger.complete(conn, key, 1, FAILED, T0 + 6, state=State.FAILED)
        a = await found(conn, "msg_a", T0 + 7)
        b = await found(conn, "msg_b", T0 + 7)
    assert (a.state, a.response, a.completed_at, a.request_body) == (
        State.COMPLETED,
        ANSWER,
        T0 + 5,
        None,
    )
    assert (b.state, b.response) == (State.IN_FLIGHT, None)


async def test_an_answer_without_a_content_type_is_read_back_without_one(store: Store) -> None:
    bare = StoredResponse(204, "", b"")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        await ledger.complete(conn, Key(PROVIDER, "msg_a"), 1, bare, T0 + 1)
        r = await found(conn, "msg_a", T0 + 2)
    assert r.response == bare


async def test_a_dead_letter_is_not_completed_again_under_its_fence(store: Store) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        await ledger.complete(conn, key, 1, FAILED, T0 + 5, state=State.FAILED)
        with pytest.raises(LeaseLost):
            await ledger.complete(conn, key, 1, ANSWER, T0 + 6)
        r = await found(conn, "msg_a", T0 + 7)
    assert (r.state, r.response, r.completed_at) == (State.FAILED, FAILED, T0 + 5)


async def test_a_failed_completion_keeps_the_request_for_a_replay(store: Store) -> None:
    c = claim_of("msg_a", T0)
    async with store.acquire() as conn:
        await claimed(conn, c)
        await ledger.complete(conn, c.key, 1, FAILED, T0 + 5, state=State.FAILED)
        r = await found(conn, "msg_a", T0 + 6)
    assert (r.state, r.response, r.request_body) == (State.FAILED, FAILED, c.body)


async def test_a_completion_under_a_stale_fence_changes_nothing(store: Store) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        assert await ledger.reclaim(conn, claim_of("msg_a", T0 + LEASE), 1) == 2
        with pytest.raises(LeaseLost):
            await ledger.complete(conn, key, 1, ANSWER, T0 + LEASE + 1)
        r = await found(conn, "msg_a", T0 + LEASE + 2)
    assert (r.state, r.fence, r.response) == (State.IN_FLIGHT, 2, None)


async def test_a_released_receipt_cannot_be_completed_under_its_old_fence(store: Store) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        assert await ledger.release(conn, key, 1, "boom", T0 + 1)
        with pytest.raises(LeaseLost):
            await ledger.complete(conn, key, 1, ANSWER, T0 + 2)
        assert (await found(conn, "msg_a", T0 + 3)).state is State.RELEASED


async def test_a_queued_receipt_is_not_completed_by_the_inline_statement(store: Store) -> None:
    async with store.acquire() as conn:
        waiting = await a_queued_receipt(conn, "msg_q", T0)
        with pytest.raises(LeaseLost):
            await ledger.complete(conn, waiting.key, waiting.fence, ANSWER, T0 + 1)
        assert (await found(conn, "msg_q", T0 + 1)).state is State.QUEUED


async def test_completions_in_one_batch_each_say_whether_they_held_their_fence(
    store: Store,
) -> None:
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        await claimed(conn, claim_of("msg_b", T0))
        done = await ledger.complete_many(
            conn,
            [
                ledger.Completion(Key(PROVIDER, "msg_a"), 1, ANSWER),
                ledger.Completion(Key(PROVIDER, "msg_b"), 2, ANSWER),  # stale
            ],
            T0 + 1,
        )
    assert done == [True, False]


# Release and unresolve: a failed attempt, fenced, with its error kept


async def test_a_release_gives_the_key_back_once_and_keeps_the_attempt(store: Store) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        await claimed(conn, claim_of("msg_b", T0))
        assert await ledger.release(conn, key, 1, "boom", T0 + 5)
        assert not await ledger.release(conn, key, 1, "again", T0 + 6)
        r = await found(conn, "msg_a", T0 + 7)
        b = await found(conn, "msg_b", T0 + 7)
        attempts = await conn.run_all("list_attempts", PROVIDER, "msg_a")
    assert (r.state, r.attempts, r.last_error, r.lease_until) == (
        State.RELEASED,
        1,
        "boom",
        T0 + 5,
    )
    assert (b.state, b.attempts) == (State.IN_FLIGHT, 0)
    assert [(a["fence"], a["failed_at"], a["error"]) for a in attempts] == [(1, T0 + 5, "boom")]


@pytest.mark.parametrize("statement", ["release", "unresolved"])
async def test_a_failed_attempt_under_a_stale_fence_or_of_a_finished_receipt_changes_nothing(
    store: Store, statement: str
) -> None:
    failed_attempt = getattr(ledger, statement)
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        assert await ledger.reclaim(conn, claim_of("msg_a", T0 + LEASE), 1) == 2
        assert not await failed_attempt(conn, key, 1, "stale", T0 + LEASE + 1)
        await ledger.complete(conn, key, 2, FAILED, T0 + LEASE + 2, state=State.FAILED)
        assert not await failed_attempt(conn, key, 2, "late", T0 + LEASE + 3)
        await claimed(conn, claim_of("msg_b", T0))
        await ledger.complete(conn, Key(PROVIDER, "msg_b"), 1, ANSWER, T0 + 1)
        assert not await failed_attempt(conn, Key(PROVIDER, "msg_b"), 1, "late", T0 + 2)
        waiting = await a_queued_receipt(conn, "msg_q", T0)
        assert not await failed_attempt(conn, waiting.key, waiting.fence, "queued", T0 + 1)
        r = await found(conn, "msg_a", T0 + LEASE + 4)
        attempts = await conn.run_all("list_attempts", PROVIDER, "msg_a")
    assert (r.state, r.fence, r.attempts, r.last_error) == (State.FAILED, 2, 0, None)
    assert attempts == []
    assert (await found_in(store, "msg_b")).state is State.COMPLETED
    assert (await found_in(store, "msg_q")).state is State.QUEUED


async def found_in(store: Store, webhook_id: str) -> Receipt:
    async with store.acquire() as conn:
        return await found(conn, webhook_id, T0 + 1)


async def test_a_released_receipt_is_not_released_again(store: Store) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        assert await ledger.release(conn, key, 1, "boom", T0 + 1)
        assert not await ledger.unresolved(conn, key, 1, "unknown", T0 + 2)
        r = await found(conn, "msg_a", T0 + 3)
    assert (r.state, r.attempts, r.last_error) == (State.RELEASED, 1, "boom")


async def test_an_unresolved_attempt_stays_in_flight_with_its_lease_ended(store: Store) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        await claimed(conn, claim_of("msg_b", T0))
        assert await ledger.unresolved(conn, key, 1, "unknown", T0 + 5)
        r = await found(conn, "msg_a", T0 + 5)
        b = await found(conn, "msg_b", T0 + 5)
        stale = await conn.run_all("stale", T0 + 5, 10)
        attempts = await conn.run_all("list_attempts", PROVIDER, "msg_a")
    assert (r.state, r.fence, r.attempts, r.last_error, r.lease_until) == (
        State.IN_FLIGHT,
        1,
        1,
        "unknown",
        T0 + 5,
    )
    assert [row["webhook_id"] for row in stale] == ["msg_a"]
    assert [(a["fence"], a["error"]) for a in attempts] == [(1, "unknown")]
    assert (b.attempts, b.last_error, b.lease_until) == (0, None, T0 + LEASE)


async def test_an_attempt_recorded_twice_under_one_fence_keeps_the_latest(store: Store) -> None:
    """reconcile() that fails twice under the same fence: the attempt's row is the latest."""
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        assert await ledger.unresolved(conn, key, 1, "first", T0 + 5)
        assert await ledger.unresolved(conn, key, 1, "second", T0 + 9)
        attempts = await conn.run_all("list_attempts", PROVIDER, "msg_a")
        r = await found(conn, "msg_a", T0 + 10)
    assert [(a["fence"], a["failed_at"], a["error"]) for a in attempts] == [(1, T0 + 9, "second")]
    assert (r.attempts, r.last_error) == (2, "second")


# The lease


async def test_a_lease_is_extended_under_its_fence_only(store: Store) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0, window=600))
        await ledger.extend_lease(conn, key, 1, T0 + 10, 100)
        r = await found(conn, "msg_a", T0 + 10)
        assert (r.lease_until, r.expires_at) == (T0 + 110, T0 + 600)  # the window suffices
        await ledger.extend_lease(conn, key, 1, T0 + 20, 1000)
        r = await found(conn, "msg_a", T0 + 20)
        assert (r.lease_until, r.expires_at) == (T0 + 1020, T0 + 1020)  # the window grows
        with pytest.raises(LeaseLost, match=r"^fence 2 of acme/msg_a is stale$"):
            await ledger.extend_lease(conn, key, 2, T0 + 30, 100)
        await ledger.complete(conn, key, 1, ANSWER, T0 + 40)
        with pytest.raises(LeaseLost):
            await ledger.extend_lease(conn, key, 1, T0 + 50, 100)
        waiting = await a_queued_receipt(conn, "msg_q", T0)
        with pytest.raises(LeaseLost):
            await ledger.extend_lease(conn, waiting.key, waiting.fence, T0 + 1, 100)
        await claimed(conn, claim_of("msg_b", T0))
        assert await ledger.release(conn, Key(PROVIDER, "msg_b"), 1, "boom", T0 + 1)
        with pytest.raises(LeaseLost):
            await ledger.extend_lease(conn, Key(PROVIDER, "msg_b"), 1, T0 + 2, 100)
        await claimed(conn, claim_of("msg_c", T0))
        await ledger.complete(conn, Key(PROVIDER, "msg_c"), 1, FAILED, T0 + 1, state=State.FAILED)
        with pytest.raises(LeaseLost):
            await ledger.extend_lease(conn, Key(PROVIDER, "msg_c"), 1, T0 + 2, 100)
        r = await found(conn, "msg_a", T0 + 60)
        b = await found(conn, "msg_b", T0 + 60)
    assert (r.state, r.lease_until) == (State.COMPLETED, T0 + 1020)
    assert b.lease_until == T0 + 1


async def test_extending_one_lease_leaves_the_other_keys_alone(store: Store) -> None:
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        await claimed(conn, claim_of("msg_b", T0))
        await ledger.extend_lease(conn, Key(PROVIDER, "msg_a"), 1, T0 + 10, 100)
        b = await found(conn, "msg_b", T0 + 10)
    assert b.lease_until == T0 + LEASE


# Recovery: what the sweeper lists, and the replay of a dead letter


async def test_the_sweeper_lists_inline_in_flight_receipts_whose_lease_ended(store: Store) -> None:
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_live", T0, lease=120))
        await claimed(conn, claim_of("msg_ended", T0))
        for webhook_id, state in [("msg_done", State.COMPLETED), ("msg_dead", State.FAILED)]:
            await claimed(conn, claim_of(webhook_id, T0))
            await ledger.complete(conn, Key(PROVIDER, webhook_id), 1, ANSWER, T0 + 1, state=state)
        await claimed(conn, claim_of("msg_released", T0))
        assert await ledger.release(conn, Key(PROVIDER, "msg_released"), 1, "x", T0 + 1)
        # A worker's queued receipt whose lease ended is the queue's to recover.
        await a_queued_receipt(conn, "msg_q", T0)
        assert len(await queue.fetch(conn, T0, 10, LEASE)) == 1
        before = await conn.run_all("stale", T0 + LEASE - 1, 10)
        at_the_end = await conn.run_all("stale", T0 + LEASE, 10)
    assert before == []
    assert [row["webhook_id"] for row in at_the_end] == ["msg_ended"]


async def test_a_dead_letter_is_reopened_once_under_its_fence(store: Store) -> None:
    async with store.acquire() as conn:
        await claimed(conn, claim_of("msg_a", T0))
        await ledger.complete(conn, Key(PROVIDER, "msg_a"), 1, FAILED, T0 + 1, state=State.FAILED)
        assert await conn.run("reopen", PROVIDER, "msg_a", 2, T0 + 2) is None
        assert await conn.run("reopen", PROVIDER, "msg_a", 1, T0 + 2) is not None
        assert await conn.run("reopen", PROVIDER, "msg_a", 1, T0 + 3) is None
        r = await found(conn, "msg_a", T0 + 4)
        row = await conn.fetchrow(
            "SELECT response_status, response_content_type, response_body, response_headers"
            " FROM receiver_receipts WHERE webhook_id = $1",
            "msg_a",
        )
    assert (r.state, r.fence, r.lease_until, r.completed_at) == (State.RELEASED, 1, T0 + 2, None)
    assert row is not None
    assert tuple(row.values()) == (None, None, None, None)


@pytest.mark.parametrize("state", ["completed", "in_flight", "released", "queued"])
async def test_only_a_dead_letter_is_reopened(store: Store, state: str) -> None:
    key = Key(PROVIDER, "msg_a")
    async with store.acquire() as conn:
        if state == "queued":
            await a_queued_receipt(conn, "msg_a", T0)
        else:
            await claimed(conn, claim_of("msg_a", T0))
        if state == "completed":
            await ledger.complete(conn, key, 1, ANSWER, T0 + 1)
        if state == "released":
            assert await ledger.release(conn, key, 1, "boom", T0 + 1)
        before = await found(conn, "msg_a", T0 + 2)
        assert await conn.run("reopen", PROVIDER, "msg_a", before.fence, T0 + 2) is None
        after = await found(conn, "msg_a", T0 + 2)
    assert after == before


async def test_reopening_one_dead_letter_leaves_the_others(store: Store) -> None:
    async with store.acquire() as conn:
        for webhook_id in ("msg_a", "msg_b"):
            await claimed(conn, claim_of(webhook_id, T0))
            await ledger.complete(
                conn, Key(PROVIDER, webhook_id), 1, FAILED, T0 + 1, state=State.FAILED
            )
        assert await conn.run("reopen", PROVIDER, "msg_a", 1, T0 + 2) is not None
        assert (await found(conn, "msg_b", T0 + 2)).state is State.FAILED


# What a duplicate delivery is told, read from the ledger at each boundary


async def test_a_duplicate_is_decided_by_the_lease_then_the_window(store: Store) -> None:
    other = claim_of("x", T0, order="o-2").payload_hash
    async with store.acquire() as conn:
        # A lease that outlasts the window: at the window's end the attempt still runs.
        live = await claimed(conn, claim_of("msg_live", T0, lease=100, window=50))
        same = claim_of("msg_live", T0).payload_hash
        at_end = await found(conn, "msg_live", T0 + 50)
        # In flight, lease and window ending together: the attempt died.
        await claimed(conn, claim_of("msg_dead", T0, lease=50, window=50))
        dead = await found(conn, "msg_dead", T0 + 50)
        # Completed, at the end of its window: free again.
        await claimed(conn, claim_of("msg_done", T0, window=50))
        await ledger.complete(conn, Key(PROVIDER, "msg_done"), 1, ANSWER, T0 + 1)
        done = await found(conn, "msg_done", T0 + 50)
        still = await found(conn, "msg_done", T0 + 49)
        waiting = await a_queued_receipt(conn, "msg_q", T0)
    assert live.fence == 1
    assert ledger.decide(at_end, same) is ledger.Decision.IN_FLIGHT
    assert ledger.decide(at_end, other) is ledger.Decision.IN_FLIGHT  # its window is over
    assert ledger.decide(dead, same) is ledger.Decision.RECOVER
    assert ledger.decide(done, same) is ledger.Decision.RECLAIM
    assert ledger.decide(still, same) is ledger.Decision.REPLAY
    assert ledger.decide(still, other) is ledger.Decision.MISMATCH
    assert ledger.decide(waiting, waiting.payload_hash) is ledger.Decision.REPLAY
    assert ledger.decide(waiting, other) is ledger.Decision.MISMATCH
