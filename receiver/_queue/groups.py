"""A worker's writing handlers share one transaction: a SAVEPOINT each, one COMMIT per group.

On PostgreSQL a queued delivery whose handlers write through ``tx`` paid a transaction of its
own: BEGIN, their statements, the fenced completion, COMMIT (a WAL flush). Here concurrent
attempts of one worker take turns on a *lane*: a pooled connection with one open transaction,
in which each attempt's writes and its fenced completion run inside a SAVEPOINT of their own.

- A failure (the handler's exception, a stale fence, a cancellation) rolls back to its own
  savepoint: its neighbours' writes and completions stay, and its claim alone is given back
  (by the pipeline, afterwards, on a connection of its own).
- An attempt is answered only once the group's COMMIT has made it durable; if that COMMIT
  fails, nothing of the group committed, every member fails, and their receipts stay in flight
  for the stale recovery, as a lone attempt's do when its COMMIT fails. A crash (SIGKILL) mid-
  group is the same: the open transaction dies with the connection. Exactly-once is the
  fence's, unchanged: each completion is the fenced statement, in its member's savepoint, and
  locks its receipt until the COMMIT.
- The group commits when no attempt is waiting for the lane, when it has ``max_members``, when
  it is ``max_age`` seconds old, or soon after its last member left. The first member of a new
  group needs no savepoint (the group is only its own until it leaves the lane): a lone attempt
  costs what it did (BEGIN, its writes, the completion, COMMIT).
- An attempt waits at most ``patience`` seconds for a lane; past it (a slow handler holds each
  lane between its statements) it runs in a transaction of its own, as before.

Handlers with external effects never join a group (the pipeline decides): their completion
must not wait for anyone else's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any

from .._exceptions import StoreUnavailable
from .._store.base import Connection, LazyConnection, Store

_SAVEPOINT = "SAVEPOINT receiver_member"
_ROLLBACK = "ROLLBACK TO SAVEPOINT receiver_member"


class _Lane:
    """One connection and its open group transaction, used by one member at a time."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.lent: AbstractAsyncContextManager[Connection] | None = None
        self.conn: Connection | None = None
        self.transaction: AbstractAsyncContextManager[None] | None = None
        self.opened_at = 0.0
        self.members: list[asyncio.Future[None]] = []
        self.flusher: asyncio.Task[None] | None = None

    @property
    def open(self) -> bool:
        return self.transaction is not None


class TransactionGroups:
    """The lanes of one worker (see the module docstring). ``lazy()`` is the ``tx`` of one
    attempt, as ``Store.lazy()`` is."""

    def __init__(
        self,
        store: Store,
        *,
        lanes: int = 2,
        max_members: int = 32,
        max_age: float = 0.05,
        patience: float = 0.005,
    ) -> None:
        if lanes < 1 or max_members < 1:
            raise ValueError("lanes and max_members must be at least 1")
        self.store = store
        # At most 32 members: PostgreSQL caches 64 subtransactions per backend; past that every
        # snapshot taken meanwhile must read pg_subtrans.
        self.max_members = min(max_members, 32)
        self.max_age = max_age
        self.patience = patience
        self._lanes = [_Lane() for _ in range(lanes)]
        self._flushers: set[asyncio.Task[None]] = set()
        #: Members per COMMIT, and attempts that ran alone (no lane within patience): for tests
        #: and the benchmark.
        self.sizes: list[int] = []
        self.alone = 0

    @contextlib.asynccontextmanager
    async def lazy(self) -> AsyncIterator[LazyConnection]:
        conn = _Member(self)
        try:
            yield conn
        finally:
            await conn.close()

    async def _enter(self) -> _Lane | None:
        """A lane, its lock held; None when none came free within ``patience``."""
        for lane in self._lanes:
            if not lane.lock.locked() and not lane.waiting:
                await lane.lock.acquire()
                return lane
        lane = min(self._lanes, key=lambda one: one.waiting)
        lane.waiting += 1
        try:
            async with asyncio.timeout(self.patience):
                await lane.lock.acquire()
        except TimeoutError:
            self.alone += 1
            return None
        finally:
            lane.waiting -= 1
        return lane

    async def _begin(self, lane: _Lane) -> bool:
        """Open the lane's group if needed; True if this member is its first."""
        if lane.open:
            return False
        lent = self.store.acquire()
        conn = await lent.__aenter__()
        transaction = conn._transaction()
        try:
            await transaction.__aenter__()
        except BaseException:
            await lent.__aexit__(None, None, None)
            raise
        lane.lent, lane.conn, lane.transaction = lent, conn, transaction
        lane.opened_at = time.monotonic()
        return True

    async def _leave(self, lane: _Lane) -> None:
        """Release the lane (its lock held by the caller), committing its group if due."""
        try:
            if lane.open and (
                not lane.waiting
                or len(lane.members) >= self.max_members
                or time.monotonic() - lane.opened_at >= self.max_age
            ):
                await self._end(lane, None)
        finally:
            lane.lock.release()
            if lane.open and lane.flusher is None:
                # Members left while others waited, and those may give up: commit it soon
                # anyway.
                lane.flusher = asyncio.get_running_loop().create_task(self._commit_soon(lane))
                self._flushers.add(lane.flusher)
                lane.flusher.add_done_callback(self._flushers.discard)

    async def _commit_soon(self, lane: _Lane) -> None:
        try:
            await asyncio.sleep(self.max_age)
            async with lane.lock:
                if lane.open:
                    with contextlib.suppress(Exception):  # its members hear of a failure
                        await self._end(lane, None)
        finally:
            lane.flusher = None

    async def _end(self, lane: _Lane, error: BaseException | None) -> None:
        """COMMIT the group (or roll it back after ``error``) and tell its members."""
        members, lane.members = lane.members, []
        transaction, lent = lane.transaction, lane.lent
        lane.transaction, lane.lent, lane.conn = None, None, None
        assert transaction is not None
        assert lent is not None
        if len(self.sizes) < 100_000 and error is None:
            self.sizes.append(len(members))
        failure: BaseException | None = error
        try:
            if error is None:
                await transaction.__aexit__(None, None, None)
            else:
                await transaction.__aexit__(type(error), error, error.__traceback__)
        except BaseException as exc:
            failure = failure or exc
        finally:
            await lent.__aexit__(None, None, None)
        for future in members:
            if future.done():
                continue
            if failure is None:
                future.set_result(None)
            else:
                future.set_exception(_group_failed(failure))
        if failure is not None and error is None:
            raise failure

    async def close(self) -> None:
        """Commit every open group (a worker stopping)."""
        for task in list(self._flushers):
            task.cancel()
        for lane in self._lanes:
            async with lane.lock:
                if lane.open:
                    with contextlib.suppress(Exception):
                        await self._end(lane, None)


def _group_failed(exc: BaseException) -> Exception:
    if isinstance(exc, StoreUnavailable):
        return exc
    return StoreUnavailable(f"the group's transaction failed: {type(exc).__name__}")


class _Member(LazyConnection):
    """One attempt's ``tx``: its handlers' transaction is a savepoint of a lane's group."""

    def __init__(self, groups: TransactionGroups) -> None:
        super().__init__(groups.store)
        self._groups = groups
        self._lane: _Lane | None = None
        self._inside = False

    async def _borrow(self) -> Connection:
        if self._lane is not None:
            assert self._lane.conn is not None
            return self._lane.conn
        return await super()._borrow()

    def _raw(self) -> Any:
        if self._lane is not None:
            assert self._lane.conn is not None
            return self._lane.conn._raw()
        return super()._raw()

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        if self._inside:  # tx.transaction() inside the handlers' own: a savepoint
            async with (await self._borrow())._transaction():
                yield
            return
        groups = self._groups
        lane = await groups._enter()
        if lane is None:  # no lane came free in time: a transaction of its own
            self._inside = True
            try:
                async with (await super()._borrow())._transaction():
                    yield
            finally:
                self._inside = False
            return
        try:
            first = await groups._begin(lane)
            assert lane.conn is not None
            if not first:
                await lane.conn._execute(_SAVEPOINT)
        except BaseException as exc:
            if lane.open:
                await groups._end(lane, exc)
            lane.lock.release()
            raise
        self._lane, self._inside = lane, True
        try:
            yield
        except BaseException as exc:
            self._lane, self._inside = None, False
            try:
                if first:
                    await groups._end(lane, exc)  # the group was this member's alone
                else:
                    await asyncio.shield(lane.conn._execute(_ROLLBACK))
            except BaseException as broken:
                # The connection broke: the group is lost, and its members hear so.
                if lane.open:
                    await groups._end(lane, broken)
            finally:
                await groups._leave(lane)
            raise
        self._lane, self._inside = None, False
        done = asyncio.get_running_loop().create_future()
        lane.members.append(done)
        await groups._leave(lane)
        await done  # durable once the group's COMMIT returns
