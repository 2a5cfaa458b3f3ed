"""Deliveries run in group transactions: those whose handlers are all transactional share one
BEGIN, one pipelined statement for every completion and one COMMIT (PostgreSQL); the others run
as alone. Two sources: the queued receipts a worker has taken in flight (:meth:`Groups.run`,
:mod:`.worker`), and inline deliveries that have claimed their key (:meth:`Groups.run_inline`).

An inline delivery runs at once, as alone, when no group is under way (at low load it waits
for nothing); otherwise it waits for the next group, which takes every delivery waiting when a
group ends (or begins beside the others once ``GROUP_MIN`` wait, up to the store's batch
flushes). It joins a group only before
that group begins. A group's handlers run for ``GROUP_BUDGET`` seconds at most before the
members it has not begun start alone; a delivery still waiting once every group under way has
run for ``GROUP_HOLD`` seconds (a slow handler holds each of them) runs alone too, so that slow
handlers never hold back the deliveries behind them."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field

from .._exceptions import LeaseLost, StoreUnavailable
from .._ledger import receipts as ledger
from .._ledger.batcher import DEFAULT_MIN_BATCH
from .._ledger.receipts import State, StoredResponse
from .._ledger.responses import encode, replay
from .._queue import receipts as queue
from .._store.base import Connection
from .execution import Execution
from .jobs import Job, event_for, identity, may_share
from .outcomes import Outcome, Reply, final_answer
from .providers import Provider
from .rejections import complete_early, counted, rejected, sent


class Groups:
    """Runs queued attempts in group transactions through the steps of ``steps`` (the
    receiver's pipeline)."""

    def __init__(self, steps: Execution) -> None:
        self.steps = steps
        store = steps.store
        #: Inline group transactions under way at once, at most (0: none; PostgreSQL only,
        #: where the store batches: each takes a connection of the pool).
        self.inline_slots = store.batch_flushes if store.dialect == "postgresql" else 0
        self._in_flight = 0
        #: Inline deliveries waiting for the next group.
        self._waiting: list[_Waiting] = []
        self._tasks: set[asyncio.Task[None]] = set()
        #: When each inline group under way began (loop time), by a token of its own.
        self._began: dict[object, float] = {}

    async def run_inline(self, job: Job, fence: int) -> Reply:
        """Run an inline delivery that has claimed its key under ``fence`` in a group
        transaction (:meth:`run` says what a group is and how it fails), or alone where there
        are no inline groups or the delivery may not share one. A COMMIT that failed raises,
        as alone: whether it happened is unknown, so the claim stays in flight."""
        if (
            not self.inline_slots
            or not _may_share(job)
            or not self.steps.wrote.get(identity(job.handlers), True)
        ):
            # A group saves a delivery whose handlers write the BEGIN, completion and COMMIT
            # round trips of its own transaction; one whose handlers wrote nothing last time
            # has none, and would only wait for a group.
            return await self.steps._run(job, fence)
        key = job.claim.key
        running = self.steps._new_running(job, fence)
        self.steps._running[key] = running
        try:
            if not self._in_flight and not self._waiting:
                # Idle: this delivery runs now, in its own task, exactly as alone (a group
                # of one would only differ in running it again after a broken connection).
                self._in_flight += 1
                token = object()
                self._began[token] = asyncio.get_running_loop().time()
                try:
                    return await self._alone(job, fence)
                finally:
                    del self._began[token]
                    self._in_flight -= 1
                    self._start()
            loop = asyncio.get_running_loop()
            waiting = _Waiting(job, fence, loop.create_future())
            self._waiting.append(waiting)
            self._start()
            waiting.timer = loop.call_later(GROUP_BUDGET, self._held, waiting)
            try:
                return await waiting.reply
            finally:
                waiting.timer.cancel()
        finally:
            if self.steps._running.get(key) is running:
                del self.steps._running[key]

    def _start(self) -> None:
        """Begin a group of every waiting delivery while a slot is free: beside a group under
        way only once ``GROUP_MIN`` wait (the group under way ends soon and the next one takes
        them along: a small group beside it would cost its transaction's round trips for a
        few members, as receiver/_ledger/batcher.py says of its flushes)."""
        while self._waiting and self._in_flight < self.inline_slots:
            if self._in_flight and len(self._waiting) < GROUP_MIN:
                break
            members, self._waiting = self._waiting[:GROUP_MAX], self._waiting[GROUP_MAX:]
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._run_waiting(members))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run_waiting(self, members: list[_Waiting]) -> None:
        token = object()
        self._began[token] = asyncio.get_running_loop().time()
        try:
            try:
                replies = await self._share([(m.job, m.fence) for m in members])
            except Exception as exc:
                replies = [exc] * len(members)
            for member, reply in zip(members, replies, strict=True):
                _settle(member.reply, reply)
        finally:
            del self._began[token]
            self._in_flight -= 1
            self._start()

    def _held(self, waiting: _Waiting) -> None:
        """A delivery has waited a group's budget for a group to begin. If a group under way
        began less than ``GROUP_HOLD`` ago, it ends soon (its handlers stop taking members
        after the budget): wait for it. Otherwise every group is held by a slow handler: run
        alone now."""
        if waiting not in self._waiting:
            return  # its group has begun
        loop = asyncio.get_running_loop()
        youngest = max(self._began.values(), default=-math.inf)
        if loop.time() - youngest < GROUP_HOLD:
            waiting.timer = loop.call_at(youngest + GROUP_HOLD, self._held, waiting)
            return
        self._waiting.remove(waiting)
        task = asyncio.get_running_loop().create_task(self._alone_settled(waiting))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _alone_settled(self, waiting: _Waiting) -> None:
        try:
            reply: Reply | Exception = await self._alone(waiting.job, waiting.fence)
        except Exception as exc:
            reply = exc
        _settle(waiting.reply, reply)

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
        - when the failure is not one member's (the connection broke, a handler swallowed a
          database error that aborted the transaction, or the server aborted the group as a
          deadlock victim or for a serialization failure: the group held its members' row
          locks together, where alone each would have committed and let go of its own), each
          member runs again on its own, charged nothing;
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
        answers: list[StoredResponse] = []
        committing = False
        timer = asyncio.get_running_loop().call_later(GROUP_BUDGET, self._spill, group, ran)
        try:
            async with self.steps.store.lazy() as tx, tx.deferred_transaction():
                for job, fence in group.members:
                    if group.spilled:
                        break
                    ran.append((job, fence))
                    answers.append(await self._run_member(job, fence, tx))
                timer.cancel()
                if ran and tx.in_transaction:
                    done = await self._complete(tx, ran, answers)
                    if not all(done):
                        raise _Stale(done)
                    committing = True
        except _Stale as stale:  # rolled back: the members whose fence held run again
            lost: list[Reply | Exception | None] = []
            for (job, fence), held in zip(ran, stale.done, strict=True):
                # A stale member's handlers ran to the end: if another attempt completed the
                # key meanwhile, they ran twice (counted, as alone).
                lost.append(
                    None
                    if held
                    else await self.steps._lease_lost(job.claim.key, fence, job.handlers)
                )
            return lost
        except _MemberFailed as failed:  # rolled back: the failure is the last member's
            job, fence = ran[-1]
            cause = failed.__cause__
            assert isinstance(cause, Exception)
            if isinstance(cause, StoreUnavailable) or _not_its_own(cause):
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
            return [
                self._executed(job, fence, answer)
                for (job, fence), answer in zip(ran, answers, strict=True)
            ]
        # No handler wrote: each completion is a statement of its own, shared where the store
        # batches, as for a delivery alone (a queued receipt's keeps its stored 202).
        finished = await asyncio.gather(
            *(
                self.steps._finish(job, fence, answer)
                for (job, fence), answer in zip(ran, answers, strict=True)
            ),
            return_exceptions=True,
        )
        replies: list[Reply | Exception | None] = []
        for (job, fence), answer, result in zip(ran, answers, finished, strict=True):
            if isinstance(result, LeaseLost):
                replies.append(await self.steps._lease_lost(job.claim.key, fence, job.handlers))
            elif isinstance(result, Exception):
                replies.append(result)  # left in flight, as alone
            elif isinstance(result, BaseException):
                raise result
            else:
                replies.append(self._executed(job, fence, answer))
        return replies

    async def _complete(
        self, tx: Connection, ran: Sequence[tuple[Job, int]], answers: Sequence[StoredResponse]
    ) -> list[bool]:
        """The group's fenced completions, pipelined; per member, False if its fence was
        stale. A group is all inline deliveries or all queued receipts."""
        now = self.steps.store.now()
        held = [True] * len(ran)
        rest: list[int] = []
        for i, ((job, fence), answer) in enumerate(zip(ran, answers, strict=True)):
            # A final 4xx of a delivery answered 202 before it finished (queued, or handed
            # off): few, each a statement of its own.
            if rejected(job, answer):
                try:
                    await complete_early(tx, job, fence, answer, now)
                except LeaseLost:
                    held[i] = False
            else:
                rest.append(i)
        if ran[0][0].queued is None:
            completions = [
                ledger.Completion(ran[i][0].claim.key, ran[i][1], sent(ran[i][0], answers[i]))
                for i in rest
            ]
            completed = await ledger.complete_many(tx, completions, now) if completions else []
            for i, ok in zip(rest, completed, strict=True):
                held[i] = ok
            return held
        done = [
            (
                i,
                queue.Done(
                    ran[i][0].claim.key, ran[i][1], State.COMPLETED, _queue_window(ran[i][0])
                ),
            )
            for i in rest
        ]
        completed = await queue.complete_many(tx, [d for _, d in done], now) if done else []
        for (i, _), ok in zip(done, completed, strict=True):
            held[i] = ok
        return held

    def _executed(self, job: Job, fence: int, answer: StoredResponse) -> Reply:
        """A member's reply once its completion stands: an inline delivery's stored answer
        (remembered for replays, as alone: a handed-off one's is its 202); for a queued
        receipt, what the worker counts (the sender's answer, the 202, is stored)."""
        outcome = counted(job, fence, answer, Outcome.EXECUTED)
        if job.queued is not None:
            return Reply(replay(queue.QUEUED, replayed=False), outcome, fence)
        self.steps._remember(job, sent(job, answer))
        return Reply(replay(sent(job, answer), replayed=False), outcome, fence)

    def _spill(self, group: _Group, ran: Sequence[tuple[Job, int]]) -> None:
        """The group's budget ran out: the members it has not begun start on their own now."""
        group.spilled = [
            asyncio.ensure_future(self._alone(job, fence))
            for job, fence in group.members[len(ran) :]
        ]

    async def _run_member(self, job: Job, fence: int, conn: Connection) -> StoredResponse:
        """One member's handlers, in the group's transaction, and the answer to store;
        _MemberFailed if they fail."""
        key = job.claim.key
        extend = self.steps._extender(conn, key, fence, self.steps._running_of(job, fence))
        begun = conn.in_transaction
        try:
            result = await self.steps._call(job.handlers, event_for(job, fence, extend), conn)
            if not begun:  # else an earlier member began the transaction: nothing learnt
                self.steps.wrote[identity(job.handlers)] = conn.in_transaction
            return final_answer(encode(result, self.steps.encoder), key)
        except Exception as exc:
            raise _MemberFailed from exc


#: Seconds of a group transaction's handlers after which the members it has not begun start
#: on their own (Groups.run).
GROUP_BUDGET = 0.05

#: Seconds after which an inline group still under way is taken to be held by a slow handler
#: (its budget, then its completions and COMMIT, take less): the deliveries waiting for a group
#: then run alone.
GROUP_HOLD = 0.25

#: Inline deliveries waiting before a group begins beside one under way.
GROUP_MIN = DEFAULT_MIN_BATCH

#: Inline deliveries one group takes at most.
GROUP_MAX = 64


@dataclass(slots=True, eq=False)
class _Waiting:
    """An inline delivery waiting for a group to begin, and where its reply goes."""

    job: Job
    fence: int
    reply: asyncio.Future[Reply]
    timer: asyncio.TimerHandle | None = None


def _settle(future: asyncio.Future[Reply], reply: Reply | Exception) -> None:
    if future.done():  # its caller went away (a client disconnect)
        return
    if isinstance(reply, Exception):
        future.set_exception(reply)
    else:
        future.set_result(reply)


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


#: SQLSTATEs that make a member's failure not its own: in_failed_sql_transaction (an earlier
#: member swallowed a database error, and this statement found the transaction aborted);
#: deadlock_detected and serialization_failure (the server chose the group's transaction as
#: the one to abort: a group holds all its members' row locks until its one COMMIT, so two
#: groups can wait for each other where the same deliveries alone would not).
_NOT_ITS_OWN = frozenset({"25P02", "40P01", "40001"})


def _not_its_own(exc: BaseException) -> bool:
    """Whether a member's statement failed for a reason of the group's (:data:`_NOT_ITS_OWN`),
    not of its own handler. The whole chain is read (``__cause__`` and ``__context__``): a
    handler that wraps the driver's error in its own (``raise MyError(...) from exc``) did not
    cause it either."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue  # a cycle of causes
        seen.add(id(current))
        if getattr(current, "sqlstate", None) in _NOT_ITS_OWN:
            return True
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


def _queue_window(job: Job) -> float:
    assert job.queued is not None
    return job.queued.window
