"""Queued receipts a worker has taken in flight, run in group transactions: those whose
handlers are all transactional share one BEGIN, one pipelined statement for every completion
and one COMMIT (PostgreSQL workers, :mod:`.worker`); the others run as alone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field

from .._exceptions import LeaseLost, StoreUnavailable
from .._ledger.receipts import State
from .._ledger.responses import IGNORED, encode, replay
from .._queue import receipts as queue
from .._store.base import Connection
from .execution import Execution
from .jobs import Job, event_for, may_share
from .outcomes import Outcome, Reply, final_answer
from .providers import Provider


class Groups:
    """Runs queued attempts in group transactions through the steps of ``steps`` (the
    receiver's pipeline)."""

    def __init__(self, steps: Execution) -> None:
        self.steps = steps

    async def run(self, attempts: Sequence[QueuedAttempt]) -> list[Reply | Exception]:
        """Run queued receipts that a worker has taken in flight: those whose handlers are all
        transactional in group transactions (PostgreSQL workers), the others as
        :meth:`process` runs them.

        A delivery alone pays BEGIN, its handlers' statements, its completion and COMMIT, a
        round trip each; a group pays one BEGIN, one pipelined statement for every
        completion and one COMMIT, and its members' handlers run one after another on the
        group's connection. When a group's handlers have run for ``GROUP_BUDGET`` seconds,
        the members it has not begun start at once on their own, so slow handlers run side
        by side as they would without groups (and a handler waiting for another delivery's
        never waits for a group to reach it).

        A group is all or nothing:

        - a member whose handlers raise has failed its attempt, as it would have alone
          (retried or dead-lettered, the error kept); the members before it, rolled back with
          it, run again, and the ones after it go on in the next group;
        - a member whose fence went stale (a newer attempt owns it) is lease lost, and the
          others run again;
        - when the failure is not one member's (the connection broke, or a handler swallowed
          a database error that aborted the transaction), each member runs again on its own;
        - if the COMMIT itself fails, whether it happened is unknown: the members stay in
          flight for the stale recovery, as a lone attempt's do.

        Per attempt, in order: its reply, or the exception that left it in flight.
        """
        jobs = [
            (self.steps._queued_job(provider, webhook_id, body, event_type, queued), fence)
            for provider, webhook_id, body, event_type, fence, queued in attempts
        ]
        shared = [i for i, (job, _) in enumerate(jobs) if _may_share(job)]
        alone = [i for i, (job, _) in enumerate(jobs) if not _may_share(job)]
        for i in shared:
            job, fence = jobs[i]
            self.steps._running[job.claim.key] = self.steps._new_running(job, fence)
        try:
            together = await self._share([jobs[i] for i in shared])
        finally:
            for i in shared:
                self.steps._running.pop(jobs[i][0].claim.key, None)
        replies: dict[int, Reply | Exception] = dict(zip(shared, together, strict=True))
        ran_alone = await _gathered(self.steps._run(*jobs[i]) for i in alone)
        replies.update(zip(alone, ran_alone, strict=True))
        return [replies[i] for i in range(len(jobs))]

    async def _share(self, members: Sequence[tuple[Job, int]]) -> list[Reply | Exception]:
        """Run ``members`` in group transactions (see :meth:`run`)."""
        replies: dict[int, Reply | Exception] = {}
        spilled: dict[int, asyncio.Task[Reply]] = {}
        alone: list[int] = []
        pending = list(range(len(members)))
        try:
            while pending:
                group = _Group([members[i] for i in pending])
                outcome = await self._run_group(group)
                took, rest = pending[: len(outcome)], pending[len(outcome) :]
                spilled.update(zip(rest, group.spilled, strict=False))
                rest = rest[len(group.spilled) :]
                again = [i for i, reply in zip(took, outcome, strict=True) if reply is None]
                replies.update((i, r) for i, r in zip(took, outcome, strict=True) if r is not None)
                if len(again) == len(took):
                    alone += again  # nobody's failure: each on its own
                    pending = rest
                else:
                    pending = again + rest
            ran_alone = await _gathered(self._alone(*members[i]) for i in alone)
            replies.update(zip(alone, ran_alone, strict=True))
            replies.update(zip(spilled, await _gathered(spilled.values()), strict=True))
        except BaseException:
            for task in spilled.values():
                task.cancel()
            raise
        return [replies[i] for i in range(len(members))]

    def _alone(self, job: Job, fence: int) -> Awaitable[Reply]:
        running = self.steps._running_of(job, fence)
        return self.steps._execute(job, fence, job.handlers, None, running)

    async def _run_group(self, group: _Group) -> list[Reply | Exception | None]:
        """One group transaction: for each member it began, its reply, or None if it must run
        again; the members it did not begin were started on their own (``group.spilled``) or
        are left for the next group.

        As for a delivery alone, the transaction begins with the first statement a handler
        sends: when none does (no-op handlers), the group costs no BEGIN and no COMMIT, and its
        completions join the batched ones of deliveries alone."""
        ran: list[tuple[Job, int]] = []
        committing = False
        timer = asyncio.get_running_loop().call_later(GROUP_BUDGET, self._spill, group, ran)
        try:
            async with self.steps.store.lazy() as tx, tx.deferred_transaction():
                for job, fence in group.members:
                    if group.spilled:
                        break
                    ran.append((job, fence))
                    await self._run_member(job, fence, tx)
                timer.cancel()
                if ran and tx.in_transaction:
                    done = await queue.complete_many(
                        tx,
                        [
                            queue.Done(job.claim.key, fence, State.COMPLETED, _queue_window(job))
                            for job, fence in ran
                        ],
                        self.steps.store.now(),
                    )
                    if not all(done):
                        raise _Stale(done)
                    committing = True
        except _Stale as stale:  # rolled back: the members whose fence held run again
            lost: list[Reply | Exception | None] = []
            for (job, fence), held in zip(ran, stale.done, strict=True):
                lost.append(
                    None if held else await self.steps._lease_lost(job.claim.key, fence, None)
                )
            return lost
        except _MemberFailed as failed:  # rolled back: the failure is the last member's
            job, fence = ran[-1]
            cause = failed.__cause__
            assert isinstance(cause, Exception)
            if isinstance(cause, StoreUnavailable) or _aborted_before(cause):
                return [None] * len(ran)
            answered: list[Reply | Exception | None] = [None] * (len(ran) - 1)
            return [*answered, await self.steps._give_back(job, fence, cause)]
        except Exception as exc:
            if committing:
                return [exc] * len(ran)
            return [None] * len(ran) if ran else [None] * (len(group.members) - len(group.spilled))
        finally:
            timer.cancel()
        if committing:
            return [_executed(fence) for _, fence in ran]
        # No handler wrote: each completion is a statement of its own, shared where the store
        # batches, as for a delivery alone.
        finished = await asyncio.gather(
            *(self.steps._finish(job, fence, IGNORED) for job, fence in ran), return_exceptions=True
        )
        replies: list[Reply | Exception | None] = []
        for (job, fence), result in zip(ran, finished, strict=True):
            if isinstance(result, LeaseLost):
                replies.append(await self.steps._lease_lost(job.claim.key, fence, job.handlers))
            elif isinstance(result, Exception):
                replies.append(result)  # left in flight, as alone
            elif isinstance(result, BaseException):
                raise result
            else:
                replies.append(_executed(fence))
        return replies

    def _spill(self, group: _Group, ran: Sequence[tuple[Job, int]]) -> None:
        """The group's budget ran out: the members it has not begun start on their own now."""
        group.spilled = [
            asyncio.ensure_future(self._alone(job, fence))
            for job, fence in group.members[len(ran) :]
        ]

    async def _run_member(self, job: Job, fence: int, conn: Connection) -> None:
        """One member's handlers, in the group's transaction; _MemberFailed if they fail."""
        key = job.claim.key
        extend = self.steps._extender(conn, key, fence, self.steps._running_of(job, fence))
        try:
            result = await self.steps._call(job.handlers, event_for(job, fence, extend), conn)
            final_answer(encode(result, self.steps.encoder), key)
        except Exception as exc:
            raise _MemberFailed from exc


#: Seconds of a group transaction's handlers after which the members it has not begun start
#: on their own (Groups.run).
GROUP_BUDGET = 0.05

#: A queued receipt a worker has taken in flight: its provider, webhook-id, body, event type,
#: fence, and its attempts so far (:meth:`Groups.run`).
QueuedAttempt = tuple[Provider, str, bytes, "str | None", int, queue.Queued]


@dataclass(slots=True)
class _Group:
    """The members a group transaction may take, in order, and those it started on their own
    when its budget ran out."""

    members: Sequence[tuple[Job, int]]
    spilled: list[asyncio.Task[Reply]] = field(default_factory=list)


async def _gathered(work: Iterable[Awaitable[Reply]]) -> list[Reply | Exception]:
    """Every reply, or the exception that left its attempt in flight."""
    results = await asyncio.gather(*work, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
    return results  # type: ignore[return-value]


class _MemberFailed(Exception):
    """A group member's handlers failed (the cause): roll the group back."""


class _Stale(Exception):
    """A group's completions found a stale fence: roll the group back."""

    def __init__(self, done: list[bool]) -> None:
        super().__init__("a member's fence is stale")
        self.done = done


def _may_share(job: Job) -> bool:
    """A body that does not parse is answered alone (400, failed), whatever its handlers."""
    return job.parsed.problem is None and may_share(job.handlers)


def _aborted_before(exc: BaseException) -> bool:
    """Whether a statement failed because the transaction was already aborted (SQLSTATE 25P02):
    an earlier member swallowed a database error, so this member's failure is not its own.
    The whole chain is read (``__cause__`` and ``__context__``): a handler that wraps the
    driver's error in its own (``raise MyError(...) from exc``) did not cause it either."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue  # a cycle of causes
        seen.add(id(current))
        if getattr(current, "sqlstate", None) == "25P02":
            return True
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


def _executed(fence: int) -> Reply:
    """A group member's reply (the worker counts its outcome; the sender's answer, the 202,
    is stored)."""
    return Reply(replay(queue.QUEUED, replayed=False), Outcome.EXECUTED, fence)


def _queue_window(job: Job) -> float:
    assert job.queued is not None
    return job.queued.window
