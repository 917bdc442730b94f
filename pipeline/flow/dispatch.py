"""Making the judge calls: one bounded job stream served by `concurrency` worker tasks, in-run
de-duplication of identical items, and a memo writer that group-commits verdicts as calls
complete (each paid verdict first appended to the run's journal, `ctxprec.storage.memo.journal`).
Which items need a call at all is decided by `fanout.py`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Awaitable, Container, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctxprec.connectors.judges.base import ItemRequest, Judge, RowItemsError, SyncDecider
from ctxprec.connectors.judges.secrets import redact
from ctxprec.storage.core.errors import JudgeError
from ctxprec.storage.core.seams import DEFAULT
from ctxprec.storage.memo.journal import Journal
from ctxprec.storage.memo.store import MemoEntry, MemoStore, entry_of

__all__ = ["CARRIED", "PAID", "Dispatcher", "ItemOutcome", "RunCounters", "add_counts"]

# what a row holds of an item's tokens (`RowPlan.paid`): nothing (0: another row carries them,
# or the verdict cost none); CARRIED, the verdict's tokens (what it cost when it was first
# paid, here on the first row of the run that uses it); PAID, carried and paid by this run
CARRIED = 1
PAID = 2

_MEMO_QUEUE = 80_000  # verdicts waiting for the memo writer, at most (then senders wait)
_MEMO_GROUP = 40_000  # verdicts of a synchronous judge the writer waits for (< _MEMO_QUEUE) ...
# ... for at most `Seams.memo_wait` seconds (2 s; the Dispatcher's `memo_wait`)
_RECENT_CAP = 50_000  # completed verdicts kept for late duplicates (a few batches' worth)


@dataclass
class RunCounters:
    """What this run did, for the progress bar and the summary."""

    rows_done: int = 0  # rows in committed parts (resume accounting)
    rows_judged: int = 0  # rows whose verdicts are all in (the progress bar)
    rows_skipped: int = 0
    rows_failed: int = 0
    items: int = 0
    memo_hits: int = 0
    dedup_hits: int = 0
    judge_calls: int = 0
    calls_done: int = 0
    calls_failed: int = 0
    memo_writes: int = 0
    reason_calls: int = 0  # --reason llm: calls that wrote a row's reason
    memo_unreadable: int = 0  # memo entries that were not verdicts: judged again
    memo_notes: list[str] = field(default_factory=list)  # one line each (`storage.memo.store.Memo`)
    # the token columns summed over the rows this run wrote (`ctxprec.flow.reduce.add_tokens`)
    paid_input_tokens: int = 0
    paid_output_tokens: int = 0
    verdict_input_tokens: int = 0
    verdict_output_tokens: int = 0
    failed_by_cause: dict[str, int] = field(default_factory=dict)
    rows_by_prompt: dict[str, int] = field(default_factory=dict)  # prompt version -> rows written


def add_counts(total: Any, part: Any) -> None:
    """Add one dataclass of counters (ints, floats, dicts of counts) into another of its kind:
    the RunCounters or JudgeStats of a task or a recheck into the run's."""
    for f in fields(total):
        mine, theirs = getattr(total, f.name), getattr(part, f.name)
        if isinstance(mine, dict):
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0) + value
        else:
            setattr(total, f.name, mine + theirs)


class ItemOutcome:
    """The fate of one unique judge call; awaited by every row that holds the item. Its event is
    made only when a row waits before the call is done (most rows look after it is)."""

    __slots__ = ("_event", "done", "entry", "error")

    def __init__(self) -> None:
        self._event: anyio.Event | None = None
        self.done = False
        self.entry: MemoEntry | None = None
        self.error: str | None = None

    def finish(self) -> None:
        """The call is done (`entry` or `error` set): wake whoever waits."""
        self.done = True
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        """Until the call is done; at once, without a task switch, when it already is."""
        if not self.done:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()


_Verdicts = list[tuple[str, MemoEntry]]


@dataclass(slots=True)
class _Job:
    key: str
    request: ItemRequest | None
    row: tuple[str, str | None, tuple[str, ...]] | None
    keys: tuple[str, ...]
    outcomes: tuple[ItemOutcome, ...]


class Dispatcher:
    """Owns the worker tasks. Use `async with Dispatcher(...) as d:` inside a task group."""

    def __init__(
        self,
        judge: Judge,
        memo: MemoStore | None,
        counters: RunCounters,
        concurrency: int,
        journal: Journal | None = None,
        *,
        memo_wait: float = DEFAULT.memo_wait,
    ) -> None:
        self.judge = judge
        self.memo = memo
        # a paid call's verdict is appended here before its worker takes the next call: the
        # memo writer's group commit holds verdicts in memory meanwhile, a kill would lose them
        self.journal = journal
        self.counters = counters
        self.concurrency = concurrency
        self.decider = judge if isinstance(judge, SyncDecider) else None
        self._pending: dict[str, ItemOutcome] = {}
        self._recent: OrderedDict[str, MemoEntry] = OrderedDict()
        self._failed: OrderedDict[str, ItemOutcome] = OrderedDict()  # failed calls, not retried
        self._credited: OrderedDict[str, None] = OrderedDict()  # keys whose tokens a row carries
        # verdicts this run paid for that reach its rows through a memo: a keyed reduce's
        # answers from this run's shard tasks, a batch run's collected answers (`carry`)
        self.paid_elsewhere: Container[str] = frozenset()
        # the job stream itself is unbounded; `_send_job` bounds it: a sender that finds
        # `_job_cap` jobs not yet taken waits until the workers took half of them, so senders
        # wake once per half a buffer, not once per job (anyio's bounded stream wakes a waiting
        # sender for every job taken, after a WouldBlock and a checkpoint for every job sent)
        send, recv = anyio.create_memory_object_stream[_Job](math.inf)
        self._job_send: MemoryObjectSendStream[_Job] = send
        self._job_recv: MemoryObjectReceiveStream[_Job] = recv
        self._job_cap = max(64, concurrency * 2)
        self._backlog = 0  # jobs sent and not yet taken by a worker
        self._room: anyio.Event | None = None  # set when the backlog fell to half the cap
        # unbounded stream of lists (one call's verdicts, or a batch judged inline), bounded by
        # the verdicts queued: a judge faster than the memo's disk waits for the writer
        msend, mrecv = anyio.create_memory_object_stream[_Verdicts](math.inf)
        self._queued = 0
        self._in_hand: _Verdicts = []  # taken from the stream by the memo writer, not yet written
        self._drained = anyio.Event()
        self._late: _Verdicts = []  # verdicts that came after the memo writer stopped (Ctrl-C)
        self._memo_send: MemoryObjectSendStream[_Verdicts] = msend
        self._memo_recv: MemoryObjectReceiveStream[_Verdicts] = mrecv
        self._memo_wait = memo_wait  # how long the writer waits to gather a group

    def start(self, tg: TaskGroup) -> None:
        for _ in range(self.concurrency):
            tg.start_soon(self._worker, self._job_recv.clone())
        self._job_recv.close()
        tg.start_soon(self._memo_writer)

    async def close(self) -> None:
        """No more jobs: let workers drain and the memo writer flush."""
        await self._job_send.aclose()

    # -- lookups -------------------------------------------------------------------------
    def known(self, key: str) -> MemoEntry | ItemOutcome | None:
        """A verdict or an outcome to await when the item is done or in flight in this run."""
        # (a verdict tuple and an outcome are both true: `or` takes the first found)
        return self._recent.get(key) or self._pending.get(key) or self._failed.get(key)

    def credit(self, key: str) -> bool:
        """True the first time a row of this run takes the tokens of `key`'s verdict: each
        call's tokens are carried by one row (the first that used it), never by every row."""
        if key in self._credited:
            return False
        self._credited[key] = None
        if len(self._credited) > _RECENT_CAP * 4:
            self._credited.popitem(last=False)
        return True

    def carry(self, key: str) -> int:
        """What a row that found `key`'s verdict in the memo holds of its tokens: CARRIED the
        first time in this run (PAID when this run paid for it elsewhere), else 0."""
        if not self.credit(key):
            return 0
        return PAID if key in self.paid_elsewhere else CARRIED

    async def submit_item(self, key: str, request: ItemRequest) -> ItemOutcome:
        outcome = self.reserve(key)
        await self.send_item(key, request, outcome)
        return outcome

    def reserve(self, key: str) -> ItemOutcome:
        """`key`'s call, in flight from now on: a row that meets the same item while the call
        waits to be sent (`send_item`) waits on this outcome instead of calling again."""
        outcome = ItemOutcome()
        self._pending[key] = outcome
        self.credit(key)
        self.counters.judge_calls += 1
        return outcome

    def send_item(self, key: str, request: ItemRequest, outcome: ItemOutcome) -> Awaitable[None]:
        """The call `reserve` took for `key`, to the workers (await it)."""
        return self._send_job(_Job(key, request, None, (key,), (outcome,)))

    async def _send_job(self, job: _Job) -> None:
        """Into the job stream: at once while fewer than `_job_cap` jobs wait for a worker (no
        task switch per job), else once the workers have taken half of them."""
        while self._backlog >= self._job_cap:
            if self._room is None:
                self._room = anyio.Event()
            await self._room.wait()
        self._backlog += 1
        self._job_send.send_nowait(job)

    async def decide_now(self, key: str, request: ItemRequest) -> MemoEntry:
        """Judge inline with a synchronous judge: no stream, no task switch, no event."""
        entry = self.decide_inline(key, request.query, request.expected, request.item)
        await self.to_memo([(key, entry)])
        return entry

    def decide_inline(self, key: str, query: str, expected: str | None, item: str) -> MemoEntry:
        """`decide_now` without the memo write: the caller sends a batch's new verdicts to the
        memo writer at once (`to_memo`)."""
        assert self.decider is not None
        verdict = self.decider.decide(query, expected, item)
        entry: MemoEntry = (verdict.relevant, verdict.reason, 0, 0)
        self.counters.judge_calls += 1
        self.counters.calls_done += 1
        self._remember(key, entry)
        return entry

    async def submit_row(
        self, query: str, expected: str | None, items: Sequence[str], keys: Sequence[str]
    ) -> list[ItemOutcome]:
        outcomes = [ItemOutcome() for _ in keys]
        for key, outcome in zip(keys, outcomes, strict=True):
            self._pending[key] = outcome
            self.credit(key)
        self.counters.judge_calls += 1
        job = _Job(keys[0], None, (query, expected, tuple(items)), tuple(keys), tuple(outcomes))
        await self._send_job(job)
        return outcomes

    # -- workers -------------------------------------------------------------------------
    async def _worker(self, jobs: MemoryObjectReceiveStream[_Job]) -> None:
        async with jobs:
            while True:
                try:  # a job already queued is taken without a task switch
                    job = jobs.receive_nowait()
                except anyio.WouldBlock:
                    try:
                        job = await jobs.receive()
                    except anyio.EndOfStream:
                        return
                except anyio.EndOfStream:
                    return
                self._taken()
                try:
                    entries = await self._judge(job)
                except RowItemsError as exc:  # --mode row fallback: some items failed alone
                    await self._partly(job, exc)
                except JudgeError as exc:
                    self._fail(job, exc)
                else:
                    self._succeed(job, entries)
                    if self.journal is not None:
                        self.journal.append(job.keys, entries)
                    if self.memo is not None:
                        await self.to_memo(list(zip(job.keys, entries, strict=True)))

    def _taken(self) -> None:
        """A job left the stream: wake the senders once half the cap is left."""
        self._backlog -= 1
        if self._room is not None and self._backlog <= self._job_cap // 2:
            self._room.set()
            self._room = None

    async def _judge(self, job: _Job) -> list[MemoEntry]:
        """The verdicts of one job: one item, or one row's items in one call (--mode row)."""
        if job.request is not None:
            return [entry_of(await self.judge.judge_item(job.request))]
        assert job.row is not None
        return [entry_of(reply) for reply in await self.judge.judge_row(*job.row)]

    def _succeed(self, job: _Job, entries: list[MemoEntry]) -> None:
        self.counters.calls_done += 1
        for key, outcome, entry in zip(job.keys, job.outcomes, entries, strict=True):
            outcome.entry = entry
            self._remember(key, entry)
            self._pending.pop(key, None)
            outcome.finish()

    async def to_memo(self, entries: list[tuple[str, MemoEntry]]) -> None:
        """Queue verdicts for the memo writer (one message however many: a batch judged inline
        costs one task switch, not one per item)."""
        if self.memo is None or not entries:
            return
        while self._queued >= _MEMO_QUEUE:
            await self._drained.wait()
        self._queued += len(entries)
        try:
            self._memo_send.send_nowait(entries)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            # shutting down (Ctrl-C, SIGTERM): the writer has stopped or the stream was closed
            # while this call was finishing; `write_late` keeps these paid verdicts
            self._late += entries

    def _written(self, n: int) -> None:
        self._queued -= n
        self._drained.set()  # wake the senders waiting for room; they look again
        self._drained = anyio.Event()

    def _fail(self, job: _Job, exc: JudgeError) -> None:
        self.counters.calls_failed += 1
        message = redact(f"{exc.cause}: {exc}")  # the error column never carries a key
        for key, outcome in zip(job.keys, job.outcomes, strict=True):
            outcome.error = message
            self._pending.pop(key, None)
            # later rows holding the same item share this failure: one call per item per run
            self._failed[key] = outcome
            if len(self._failed) > _RECENT_CAP:
                self._failed.popitem(last=False)
            outcome.finish()

    async def _partly(self, job: _Job, exc: RowItemsError) -> None:
        """A row judged item by item: its good items succeed (and are memoized), the items
        that failed on their own fail alone."""
        good: list[tuple[str, MemoEntry]] = []
        for key, outcome, r in zip(job.keys, job.outcomes, exc.results, strict=True):
            part = _Job(key, None, job.row, (key,), (outcome,))
            if isinstance(r, JudgeError):
                self._fail(part, r)
            else:
                entry = entry_of(r)
                self._succeed(part, [entry])
                good.append((key, entry))
        if self.journal is not None and good:
            self.journal.append([k for k, _ in good], [e for _, e in good])
        await self.to_memo(good)

    def _remember(self, key: str, entry: MemoEntry) -> None:
        self._recent[key] = entry
        if len(self._recent) > _RECENT_CAP:
            self._recent.popitem(last=False)

    # -- memo writer ---------------------------------------------------------------------
    async def _memo_writer(self) -> None:
        """Group commit: take everything queued, write it in one transaction, repeat. With a
        synchronous judge (offline: a verdict costs nothing to redo) it waits, briefly, for a
        few batches' worth: the memo's cost per verdict falls with the size of a transaction."""
        memo = self.memo
        recv = self._memo_recv
        least = _MEMO_GROUP if self.decider is not None else 1
        try:
            async with recv:
                ended = False
                while not ended:
                    ended = await self._gather(recv, least)
                    batch = self._in_hand
                    if not batch:
                        continue
                    if memo is not None:  # (a failed write ends the run: nobody waits on)
                        await anyio.to_thread.run_sync(memo.set_many, batch)
                    self._in_hand = []
                    self._written(len(batch))
                    self.counters.memo_writes += len(batch)
        finally:
            await self._flush_left()

    async def _gather(self, recv: MemoryObjectReceiveStream[_Verdicts], least: int) -> bool:
        """Move queued verdicts into `_in_hand`: one message (waiting for it), then all that are
        queued, then, while fewer than `least`, what comes within `memo_wait` s. True when
        the stream has ended (what is in hand is the last)."""
        hand = self._in_hand
        try:
            hand += await recv.receive()
        except anyio.EndOfStream:
            return True
        deadline = anyio.current_time() + self._memo_wait
        while True:
            try:
                hand += recv.receive_nowait()
                continue
            except anyio.WouldBlock:
                pass
            except anyio.EndOfStream:
                return True
            wait = deadline - anyio.current_time()
            if len(hand) >= least or wait <= 0:
                return False
            with anyio.move_on_after(wait):
                try:
                    hand += await recv.receive()
                except anyio.EndOfStream:
                    return True

    async def _flush_left(self) -> None:
        """On cancellation (Ctrl-C), write what was already queued before giving up."""
        left, self._in_hand = self._in_hand, []
        while True:
            try:
                left += self._memo_recv.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        if left and self.memo is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.memo.set_many, left)

    async def write_late(self) -> None:
        """After every worker and row task has ended: write the verdicts that finished after
        the memo writer stopped (shielded: it runs while the run is being cancelled)."""
        late, self._late = self._late, []
        if late and self.memo is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.memo.set_many, late)

    async def finish_memo(self) -> None:
        """Called after all workers are done: close the memo stream so the writer ends."""
        await self._memo_send.aclose()
