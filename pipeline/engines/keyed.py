"""Each distinct judge key judged once per cluster run, in three steps over OUTDIR:

1. plan (one task per input slice): read the slice, compute each item's memo key, write the
   slice's distinct requests split by key hash into shards;
2. judge (one task per shard): read the shard's requests from every slice and its stored
   verdicts, judge only the keys nobody judged, write each slice's answers;
3. reduce (one task per slice): the local engine's stage, its memo seeded with the answers.

A key lives in exactly one shard, and one task judges a shard: no key is judged twice, however
the input is split. The audit judge (`--audit-model`) has a shuffle of its own: the sampled rows'
keys under its identity, judged by it in its own shard tasks, read by the reduce's audit side.
A worker's memory holds one slice's keys (steps 1 and 3) or one shard's (step 2), never the
run's. The functions here run on the workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import anyio

from ctxprec.connectors.judges import (
    Judge,
    JudgeSettings,
    JudgeStats,
    Throttle,
    audit_settings,
    create_judge,
)
from ctxprec.connectors.judges.base import ItemRequest, JudgeWrapper
from ctxprec.connectors.judges.prompts import prompt_version_for
from ctxprec.flow.audit import audited_rows
from ctxprec.flow.dispatch import Dispatcher, ItemOutcome, RunCounters
from ctxprec.flow.extractor import load_extractor
from ctxprec.flow.planning import ChunkPlanner, PlannedChunk, open_memo
from ctxprec.flow.rows import RowPlan, attach_keys
from ctxprec.run.driver import AuditCounts, RunPlan, StageResult
from ctxprec.run.notices import record_memo
from ctxprec.run.stage import MeteredThrottle
from ctxprec.storage.core.errors import ConfigError, JudgeError, UserError
from ctxprec.storage.core.verdict import JudgeReply
from ctxprec.storage.files import layout
from ctxprec.storage.files.objpath import OutPath
from ctxprec.storage.memo.store import (
    REASON,
    RELEVANT,
    Memo,
    MemoEntry,
    entry_of,
    judge_prefix,
    memo_key,
)
from ctxprec.storage.outdir.keyshards import (
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
from ctxprec.storage.outdir.verdicts import VerdictStore

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
# the request text a planning task holds before writing it out: `Seams.plan_part_chars` (32 M)


def keyed(plan: RunPlan) -> bool:
    """Runs that judge item by item (not `--mode row`, whose call is a whole row)."""
    return not plan.spec.per_row


# ---------------------------------------------------------------- 1. plan


class _SliceRequests:
    """One slice's distinct requests for one judge, written out by shard in parts."""

    def __init__(self, scratch: OutPath, task: int, shards: int, part_chars: int) -> None:
        self.scratch, self.task, self.shards = scratch, task, shards
        self.part_chars = part_chars  # written out once this much request text is held
        self.seen: set[str] = set()  # the slice's keys (their texts go out in parts)
        self.requests: list[Request] = []
        self.chars, self.part = 0, 0

    def add(self, rows: Iterable[RowPlan]) -> None:
        for row in rows:
            for key, item in zip(row.keys, row.items, strict=False):
                if key not in self.seen:
                    assert row.query is not None
                    self.seen.add(key)
                    self.requests.append((key, row.query, row.expected, item))
                    self.chars += len(row.query) + len(item) + len(row.expected or "")
        if self.chars >= self.part_chars:
            self.write()
            self.requests, self.chars, self.part = [], 0, self.part + 1

    def write(self) -> None:
        write_requests(self.scratch, self.task, self.shards, self.requests, self.part)


def plan_slice(
    plan: RunPlan,
    file: int,
    skip: frozenset[str],
    task: int,
    scratch: OutPath,
    shards: int,
    audit_scratch: OutPath | None = None,
) -> int:
    """Write the distinct requests of one input slice by shard (with `audit_scratch`, the audit
    sample's under the audit judge's identity there too); the number of distinct keys.
    Blocking (a worker thread). Unreadable data ends the slice here: the reduce stops at the
    same row and reports it."""
    cfg = plan.cfg
    extractor = load_extractor(cfg.columns.extractor) if cfg.columns.extractor else None
    prefix = judge_prefix(plan.identity)
    planner = ChunkPlanner(
        cfg, prefix, per_row=False, memo=None, skip_ids=plan.skip_ids, extractor=extractor
    )
    batches = planner.planned(plan.info, skip=plan.skip_parts | skip, only_files=[file])
    size = plan.seams.plan_part_chars
    first = _SliceRequests(scratch, task, shards, size)
    audit = None if audit_scratch is None else _SliceRequests(audit_scratch, task, shards, size)
    try:
        for planned in batches:
            first.add(planned.rows)
            if audit is not None:
                audit.add(_audit_rows(plan, planned))
    except UserError:
        pass
    first.write()
    if audit is not None:
        audit.write()
    return len(first.seen)


def _audit_rows(plan: RunPlan, planned: PlannedChunk) -> list[RowPlan]:
    """The batch's rows in the audit sample, keyed by the audit judge's identity."""
    assert plan.audit_identity is not None
    j = plan.cfg.judge
    ids = planned.frame.get_column("id").to_list()
    rows = planned.rows
    picked = [RowPlan(rows[i].query, rows[i].expected, list(rows[i].items), rows[i].status)
              for i in audited_rows(ids, rows, j.audit_fraction, j.audit_seed)]  # fmt: skip
    attach_keys(picked, judge_prefix(plan.audit_identity), False, j.verdict_only)
    return picked


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


def _judge_of(plan: RunPlan, audit: bool) -> tuple[JudgeSettings, dict[str, object], str]:
    """The settings and identity of the run's judge, or of its audit judge."""
    if not audit:
        return plan.cfg.judge, plan.identity, "judge"
    settings = audit_settings(plan.cfg.judge)
    assert settings is not None
    assert plan.audit_identity is not None
    return settings, plan.audit_identity, "audit judge"


async def judge_shard(
    plan: RunPlan, shard: int, scratch: OutPath, shards: int, throttle: MeteredThrottle,
    audit: bool = False,
) -> StageResult:  # fmt: skip
    """Judge the keys of one shard that no earlier call judged; write each slice's answers.
    With `audit`, the audit judge's shard: what it did is the result's `audit`."""
    cfg = plan.cfg
    stats, counters = JudgeStats(), RunCounters()
    settings, identity, who = _judge_of(plan, audit)
    judge = create_judge(settings, throttle=throttle, stats=stats, seams=plan.seams)
    try:
        if judge.identity() != identity:
            raise ConfigError(
                f"the {who} here is {judge.identity()}, the driver's {identity}: give "
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
    if audit:  # the first judge's counters stay empty: the audit judge's calls are its own
        return StageResult(RunCounters(), JudgeStats(), throttle.stats(),
                           audit=AuditCounts(counters, stats))  # fmt: skip
    return StageResult(counters, stats, throttle.stats())


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
    audit_scratch: OutPath | None = None  # --audit-model: the audit judge's shuffle
    memo: AnswersMemo | None = None
    judge: ReplayJudge | None = None
    failed: dict[str, str] = field(default_factory=dict)
    audit_memo: AnswersMemo | None = None
    audit_judge: ReplayJudge | None = None
    audit_failed: dict[str, str] = field(default_factory=dict)

    def open_memo(self) -> AnswersMemo:
        self.memo = self._answers(self.scratch, self.failed)
        return self.memo

    def paid_keys(self) -> set[str]:
        """The answers this run's shard tasks paid for (their rows count them as paid)."""
        return self.memo.fresh if self.memo is not None else set()

    def open_audit_memo(self) -> AnswersMemo:
        assert self.audit_scratch is not None
        self.audit_memo = self._answers(self.audit_scratch, self.audit_failed)
        return self.audit_memo

    def _answers(self, scratch: OutPath, failed: dict[str, str]) -> AnswersMemo:
        store = _verdicts(self.plan, scratch).writer(0, 1, SHARD_FLUSH_S)
        return AnswersMemo(scratch, self.task, store, failed)

    def judge_factory(self, throttle: Throttle, stats: JudgeStats) -> Judge:
        self.judge = self._replay(False, throttle, stats)
        return self.judge

    def audit_factory(self, throttle: Throttle, stats: JudgeStats) -> Judge:
        self.audit_judge = self._replay(True, throttle, stats)
        return self.audit_judge

    def _replay(self, audit: bool, throttle: Throttle, stats: JudgeStats) -> ReplayJudge:
        settings, identity, _ = _judge_of(self.plan, audit)
        inner = create_judge(settings, throttle=throttle, stats=stats, seams=self.plan.seams)
        failed = self.audit_failed if audit else self.failed
        return ReplayJudge(inner, failed, judge_prefix(identity), self.plan.cfg.judge.verdict_only)

    def settle(self, result: StageResult) -> StageResult:
        settle(result, self.memo, self.judge)
        if result.audit is not None:
            _settle_counters(result.audit.counters, self.audit_memo, self.audit_judge)
        return result


def settle(result: StageResult, memo: AnswersMemo | None, judge: ReplayJudge | None) -> StageResult:
    """A reduce's counters as the local engine's: replayed failures are no calls (the judging
    task counted them), and uses of this run's verdicts are de-duplication, not memo hits."""
    _settle_counters(result.counters, memo, judge)
    return result


def _settle_counters(c: RunCounters, memo: AnswersMemo | None, judge: ReplayJudge | None) -> None:
    replayed = judge.replayed if judge is not None else 0
    fresh = memo.fresh_hits if memo is not None else 0
    c.judge_calls -= replayed
    c.calls_failed -= replayed
    c.dedup_hits += replayed + fresh
    c.memo_hits -= fresh
