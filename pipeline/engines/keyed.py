"""Each distinct judge key judged once per cluster run, in three steps over OUTDIR:

1. plan (one task per input slice): read the slice, compute each item's memo key, write the
   slice's distinct requests split by key hash into shards;
2. judge (one task per shard): read the shard's requests from every slice and its stored
   verdicts, judge only the keys nobody judged, write each slice's answers;
3. reduce (one task per slice): the local engine's stage, its memo seeded with the answers.

A key lives in exactly one shard, and one task judges a shard: no key is judged twice, however
the input is split. A worker's memory holds one slice's keys (steps 1 and 3) or one shard's
(step 2), never the run's. The functions here run on the workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import anyio

from connectors.judges import Gate, Judge, JudgeStats, create_judge
from connectors.judges.base import ItemRequest, JudgeWrapper
from connectors.judges.prompts import prompt_version_for
from pipeline.flow.dispatch import Dispatcher, ItemOutcome, RunCounters
from pipeline.flow.extractor import load_extractor
from pipeline.flow.planning import BatchPlanner, open_memo
from pipeline.run.driver import RunPlan, StageResult
from pipeline.run.notices import record_memo
from pipeline.run.stage import MeteredGate
from storage import layout
from storage.core.errors import ConfigError, JudgeError, UserError
from storage.core.verdict import JudgeReply
from storage.keyshards import (
    Answer,
    Request,
    ShardedVerdicts,
    read_answers,
    read_requests,
    request_files,
    task_of,
    write_answers,
    write_requests,
)
from storage.memo import REASON, RELEVANT, Memo, MemoEntry, entry_of, judge_prefix, memo_key
from storage.objpath import OutPath
from storage.verdicts import VerdictStore

__all__ = [
    "SHARD_FLUSH_S",
    "SHARD_ROWS",
    "AnswersMemo",
    "ReduceHooks",
    "ReplayJudge",
    "judge_shard",
    "keyed",
    "plan_slice",
    "settle",
]

SHARD_ROWS = 20_000  # input rows per shard (a power of two of shards, at least 2 per worker)
SHARD_FLUSH_S = 0.5  # a killed judging task loses at most this much of its newest verdicts
PLAN_PART_CHARS = 32_000_000  # request text a planning task holds before writing it out


def keyed(plan: RunPlan) -> bool:
    """Runs that judge item by item (not `--mode row`, whose call is a whole row)."""
    return not plan.spec.per_row


# ---------------------------------------------------------------- 1. plan


def plan_slice(
    plan: RunPlan, file: int, skip: frozenset[str], task: int, scratch: OutPath, shards: int
) -> int:
    """Write the distinct requests of one input slice by shard; the number of distinct keys.
    Blocking (a worker thread). Unreadable data ends the slice here: the reduce stops at the
    same row and reports it."""
    cfg = plan.cfg
    extractor = load_extractor(cfg.columns.extractor) if cfg.columns.extractor else None
    prefix = judge_prefix(plan.identity)
    planner = BatchPlanner(
        cfg, prefix, per_row=False, memo=None, skip_ids=plan.skip_ids, extractor=extractor
    )
    batches = planner.planned(plan.info, skip=plan.skip_parts | skip, only_files=[file])
    seen: set[str] = set()  # the slice's keys (their texts go out in parts)
    requests: list[Request] = []
    chars, part = 0, 0
    try:
        for planned in batches:
            for row in planned.rows:
                for key, item in zip(row.keys, row.items, strict=False):
                    if key not in seen:
                        assert row.query is not None
                        seen.add(key)
                        requests.append((key, row.query, row.expected, item))
                        chars += len(row.query) + len(item) + len(row.expected or "")
            if chars >= PLAN_PART_CHARS:
                write_requests(scratch, task, shards, requests, part)
                requests, chars, part = [], 0, part + 1
    except UserError:
        pass
    write_requests(scratch, task, shards, requests, part)
    return len(seen)


# ---------------------------------------------------------------- 2. judge


class _StoreMemo:
    """Where a judging task's new verdicts go: OUTDIR's store and this host's memo."""

    def __init__(self, store: VerdictStore, local: Memo | None) -> None:
        self.store = store
        self.local = local

    def get_many(self, keys: Sequence[str]) -> dict[str, MemoEntry]:
        return {}

    def set_many(self, entries: Iterable[tuple[str, MemoEntry]]) -> int:
        rows = list(entries)
        self.store.append(rows)
        if self.local is not None:
            self.local.set_many(rows)
        return len(rows)

    def close(self) -> None:
        try:
            self.store.flush()
        finally:
            if self.local is not None:
                self.local.close()


@dataclass
class _Shard:
    """What a judging task read: who needs which key, and what is known already."""

    known: dict[str, MemoEntry]
    todo: dict[str, Request] = field(default_factory=dict)
    needs: dict[int, list[str]] = field(default_factory=dict)  # each slice's keys
    payer: dict[str, int] = field(default_factory=dict)  # the first slice that holds a key

    def add(self, task: int, requests: Iterable[Request]) -> None:
        """One request file (a part of a slice's requests; parts come in slice order)."""
        keys = self.needs.setdefault(task, [])
        for request in requests:
            key = request[0]
            keys.append(key)
            self.payer.setdefault(key, task)
            if key not in self.known:
                self.todo.setdefault(key, request)


def _verdicts(plan: RunPlan, scratch: OutPath) -> ShardedVerdicts:
    """OUTDIR's verdicts; with the memo off, this run's own (a retried task still reuses them)."""
    if plan.cfg.run.memo:
        return ShardedVerdicts.of(plan.runlog.outdir)
    return ShardedVerdicts(layout.scratch_verdicts(scratch))


def _read_shard(
    plan: RunPlan, shard: int, scratch: OutPath, shards: int
) -> tuple[_Shard, Memo | None, int]:
    found = _Shard(_verdicts(plan, scratch).read(shard, shards))
    for path in request_files(scratch, shard):
        found.add(task_of(path), read_requests(path))
    local = open_memo(plan.cfg)
    hits: dict[str, MemoEntry] = {}
    if local is not None and found.todo:
        hits = local.get_many(list(found.todo))
        for key in hits:
            del found.todo[key]
        found.known.update(hits)
        if hits:  # into OUTDIR too: the next run's hosts may not have this memo
            store = _verdicts(plan, scratch).writer(shard, shards, 0.0)
            store.append(hits.items())
            store.flush()
    return found, local, len(hits)


async def judge_shard(
    plan: RunPlan, shard: int, scratch: OutPath, shards: int, gate: MeteredGate
) -> StageResult:
    """Judge the keys of one shard that no earlier call judged; write each slice's answers."""
    cfg = plan.cfg
    stats, counters = JudgeStats(), RunCounters()
    judge = create_judge(cfg.judge, gate=gate, stats=stats, retry_clock=plan.retry_clock)
    try:
        if judge.identity() != plan.identity:
            raise ConfigError(
                f"the judge here is {judge.identity()}, the driver's {plan.identity}: give "
                "every machine of the run the same judge settings and environment"
            )
        found, local, hits = await anyio.to_thread.run_sync(
            _read_shard, plan, shard, scratch, shards
        )
        counters.memo_hits = hits
        store = _verdicts(plan, scratch).writer(shard, shards, 0.0)
        memo = _StoreMemo(store, local)
        try:
            fresh, failed = await _judge_all(
                judge, memo, counters, cfg.limits.concurrency, found, cfg.judge.verdict_only
            )
        finally:
            await anyio.to_thread.run_sync(memo.close)
            record_memo(local, counters)
        await anyio.to_thread.run_sync(_answer, scratch, shard, found, fresh, failed)
    finally:
        with anyio.CancelScope(shield=True):
            await judge.aclose()
    # the reduce counts every use of a fresh verdict as a memo hit; `settle` moves those to
    # de-duplication, less the one use per key that this call paid for
    counters.dedup_hits = -counters.judge_calls
    return StageResult(counters, stats, gate.stats())


async def _judge_all(
    judge: Judge, memo: _StoreMemo, counters: RunCounters, concurrency: int, found: _Shard,
    verdict_only: bool,
) -> tuple[dict[str, MemoEntry], dict[str, str]]:  # fmt: skip
    """Judge `found.todo`; each verdict reaches the store within `SHARD_FLUSH_S`."""
    recorder = _Recording(judge, verdict_only)
    dispatcher = Dispatcher(recorder, None, counters, concurrency)
    outcomes: list[tuple[str, ItemOutcome]] = []
    done = anyio.Event()
    async with anyio.create_task_group() as tg:
        dispatcher.start(tg)
        tg.start_soon(_flush_every, recorder, memo, counters, done)
        try:
            for key, (_, query, expected, item) in found.todo.items():
                request = ItemRequest(query, expected, item)
                outcomes.append((key, await dispatcher.submit_item(key, request)))
        finally:
            await dispatcher.close()
        for _, outcome in outcomes:
            await outcome.wait()
        done.set()
        await dispatcher.finish_memo()
    counters.memo_writes += await anyio.to_thread.run_sync(memo.set_many, recorder.take())
    fresh = {key: o.entry for key, o in outcomes if o.entry is not None}
    failed = {key: o.error or "judge_error: no verdict" for key, o in outcomes if o.entry is None}
    return fresh, failed


async def _flush_every(
    recorder: _Recording, memo: _StoreMemo, counters: RunCounters, done: anyio.Event
) -> None:
    while not done.is_set():
        with anyio.move_on_after(SHARD_FLUSH_S):
            await done.wait()
        rows = recorder.take()
        if rows:
            counters.memo_writes += await anyio.to_thread.run_sync(memo.set_many, rows)


class _Recording(JudgeWrapper):
    """The judge, keeping each verdict it returns (under its memo key) for the store."""

    def __init__(self, inner: Judge, verdict_only: bool) -> None:
        super().__init__(inner)
        self.prefix = judge_prefix(inner.identity())
        self.verdict_only = verdict_only
        self._new: list[tuple[str, MemoEntry]] = []

    def take(self) -> list[tuple[str, MemoEntry]]:
        rows, self._new = self._new, []
        return rows

    async def judge_item(self, request: ItemRequest) -> JudgeReply:
        reply = await self.inner.judge_item(request)
        key = _key_of(self.prefix, request, self.verdict_only)
        self._new.append((key, entry_of(reply)))
        return reply


def _key_of(prefix: bytes, request: ItemRequest, verdict_only: bool) -> str:
    version = prompt_version_for(request.expected, False, verdict_only)
    return memo_key(prefix, version, request.query, request.expected, request.item)


def _answer(
    scratch: OutPath,
    shard: int,
    found: _Shard,
    fresh: dict[str, MemoEntry],
    failed: dict[str, str],
) -> None:
    """Each slice's answers: a call's tokens go to the first slice that holds its key (the
    local engine's first row), the others get the verdict with no tokens."""
    for task, keys in found.needs.items():
        answers: list[Answer] = []
        for key in keys:
            entry = fresh.get(key) or found.known.get(key)
            if entry is not None and found.payer[key] != task:
                entry = (entry[RELEVANT], entry[REASON], 0, 0)
            answers.append((key, entry, key in fresh, failed.get(key)))
        write_answers(scratch, task, shard, answers)


# ---------------------------------------------------------------- 3. reduce


class AnswersMemo:
    """A slice's memo: the answers of every shard, in memory (one slice's keys). A verdict the
    reduce still had to call for goes to OUTDIR's store."""

    def __init__(
        self, scratch: OutPath, task: int, store: VerdictStore, failed: dict[str, str]
    ) -> None:
        self.entries: dict[str, MemoEntry] = {}
        self.fresh: set[str] = set()
        self.failed = failed  # filled here, shared with the reduce's `ReplayJudge`
        for key, entry, is_fresh, error in read_answers(scratch, task):
            if error is not None:
                self.failed[key] = error
            elif entry is not None:
                self.entries[key] = entry
            if is_fresh:
                self.fresh.add(key)
        self.store = store
        self.fresh_hits = 0  # uses of a verdict judged in this run (moved to de-duplication)

    def get_many(self, keys: Sequence[str]) -> dict[str, MemoEntry]:
        found = {}
        for key in keys:
            entry = self.entries.get(key)
            if entry is not None:
                found[key] = entry
                self.fresh_hits += key in self.fresh
        return found

    def set_many(self, entries: Iterable[tuple[str, MemoEntry]]) -> int:
        rows = list(entries)
        self.store.append(rows)
        return len(rows)

    def close(self) -> None:
        self.store.flush()


class ReplayJudge(JudgeWrapper):
    """The run's judge for a reduce: a key whose call already failed in this run fails again
    with the same error, without a call (one call per key per run, as the local engine)."""

    def __init__(
        self, inner: Judge, failed: dict[str, str], prefix: bytes, verdict_only: bool
    ) -> None:
        super().__init__(inner)
        self.failed = failed
        self.prefix = prefix
        self.verdict_only = verdict_only
        self.replayed = 0

    async def judge_item(self, request: ItemRequest) -> JudgeReply:
        error = self.failed.get(_key_of(self.prefix, request, self.verdict_only))
        if error is not None:
            self.replayed += 1
            cause, _, message = error.partition(": ")
            raise JudgeError(message, cause=cause)
        return await self.inner.judge_item(request)


@dataclass
class ReduceHooks:
    """What a reduce task gives `run_stage` (its memo and judge) and reads back after it."""

    plan: RunPlan
    scratch: OutPath
    task: int
    memo: AnswersMemo | None = None
    judge: ReplayJudge | None = None
    failed: dict[str, str] = field(default_factory=dict)

    def open_memo(self) -> AnswersMemo:
        store = _verdicts(self.plan, self.scratch).writer(0, 1, SHARD_FLUSH_S)
        self.memo = AnswersMemo(self.scratch, self.task, store, self.failed)
        return self.memo

    def judge_factory(self, gate: Gate, stats: JudgeStats) -> Judge:
        clock = self.plan.retry_clock
        inner = create_judge(self.plan.cfg.judge, gate=gate, stats=stats, retry_clock=clock)
        prefix, verdict_only = judge_prefix(self.plan.identity), self.plan.cfg.judge.verdict_only
        self.judge = ReplayJudge(inner, self.failed, prefix, verdict_only)
        return self.judge

    def settle(self, result: StageResult) -> StageResult:
        return settle(result, self.memo, self.judge)


def settle(result: StageResult, memo: AnswersMemo | None, judge: ReplayJudge | None) -> StageResult:
    """A reduce's counters as the local engine's: replayed failures are no calls (the judging
    task counted them), and uses of this run's verdicts are de-duplication, not memo hits."""
    c = result.counters
    replayed = judge.replayed if judge is not None else 0
    fresh = memo.fresh_hits if memo is not None else 0
    c.judge_calls -= replayed
    c.calls_failed -= replayed
    c.dedup_hits += replayed + fresh
    c.memo_hits -= fresh
    return result
