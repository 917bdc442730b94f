"""The dispatcher's memo writer: with the offline judge it writes several batches' verdicts in
one transaction (the memo's cost per verdict falls with the size of a transaction); with a judge
that costs money it writes what it has at once; a cancelled run writes what it was holding."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import anyio
import anyio.lowlevel

import ctxprec.flow.dispatch as dispatch
from ctxprec.connectors.judges.base import JudgeStats, NullThrottle
from ctxprec.connectors.judges.offline import OfflineJudge
from ctxprec.flow.dispatch import Dispatcher, RunCounters
from ctxprec.storage.core.settings import JudgeSettings
from ctxprec.storage.memo.store import Memo, MemoEntry

BATCH = 10_000  # one stage batch: 1,000 rows of 10 items


class RecordingMemo:
    """A real memo that records the size of each write."""

    def __init__(self, directory: Path) -> None:
        self.memo = Memo(directory)
        self.writes: list[int] = []

    def get_many(self, keys: Sequence[str]) -> dict[str, MemoEntry]:
        return self.memo.get_many(keys)

    def set_many(self, entries: Iterable[tuple[str, MemoEntry]]) -> int:
        rows = list(entries)
        self.writes.append(len(rows))
        return self.memo.set_many(rows)

    def close(self) -> None:
        self.memo.close()


class PaidJudge(OfflineJudge):
    """The offline judge's verdicts without its synchronous `decide`: what the dispatcher sees
    of a judge reached over the network."""

    decide = None  # type: ignore[assignment]


def verdicts(batch: int) -> list[tuple[str, MemoEntry]]:
    return [(f"b{batch}-{i}", (i % 2 == 0, f"why {batch} {i}", 0, 0)) for i in range(BATCH)]


def offline() -> OfflineJudge:
    return OfflineJudge("", JudgeSettings(), NullThrottle(), JudgeStats())


async def settle() -> None:
    for _ in range(50):  # let the writer take what is queued
        await anyio.lowlevel.checkpoint()


# the memo writer's wait for a group, endless in the tests that pass it: without a time limit
# the writer's grouping shows in the write sizes, whatever the machine's speed
ENDLESS = 3600.0


async def test_offline_verdicts_are_written_several_batches_at_a_time(tmp_path: Path) -> None:
    memo = RecordingMemo(tmp_path / "memo")
    counters = RunCounters()
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            d = Dispatcher(offline(), memo, counters, concurrency=1, memo_wait=ENDLESS)
            d.start(tg)
            await d.to_memo(verdicts(0))
            await settle()  # the writer holds batch 0 and waits for more
            assert memo.writes == []
            for b in range(1, 5):
                await d.to_memo(verdicts(b))
                await settle()
            await d.to_memo(verdicts(5))
            await d.close()
            await d.finish_memo()
    assert memo.writes == [dispatch._MEMO_GROUP, 2 * BATCH]
    assert counters.memo_writes == 6 * BATCH
    assert len(memo.get_many([k for b in range(6) for k, _ in verdicts(b)])) == 6 * BATCH
    memo.close()


async def test_verdicts_of_a_paid_judge_are_written_at_once(tmp_path: Path) -> None:
    memo = RecordingMemo(tmp_path / "memo")
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            d = Dispatcher(PaidJudge("", JudgeSettings(), NullThrottle(), JudgeStats()), memo,
                           RunCounters(), concurrency=1, memo_wait=ENDLESS)  # fmt: skip
            assert d.decider is None
            d.start(tg)
            for b in range(3):
                await d.to_memo(verdicts(b))
                while d.counters.memo_writes < (b + 1) * BATCH:  # no waiting for a group
                    await d._drained.wait()  # set after each write
            await d.close()
            await d.finish_memo()
    assert memo.writes == [BATCH] * 3
    memo.close()


async def test_a_cancelled_run_writes_the_verdicts_the_writer_was_holding(tmp_path: Path) -> None:
    memo = RecordingMemo(tmp_path / "memo")
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            d = Dispatcher(offline(), memo, RunCounters(), concurrency=1, memo_wait=ENDLESS)
            d.start(tg)
            await d.to_memo(verdicts(0))
            await settle()  # taken by the writer, which waits for more
            await d.to_memo(verdicts(1))  # still queued
            tg.cancel_scope.cancel()  # Ctrl-C
    assert memo.writes == [2 * BATCH]
    assert len(memo.get_many([k for b in range(2) for k, _ in verdicts(b)])) == 2 * BATCH
    memo.close()


async def test_a_verdict_that_finishes_during_shutdown_is_still_written(tmp_path: Path) -> None:
    """The Ctrl-C race: a call finishing after shutdown closed the memo stream (and after the
    writer stopped) raised ClosedResourceError, an internal error, and lost the verdict."""
    memo = RecordingMemo(tmp_path / "memo")
    dispatcher = Dispatcher(PaidJudge("", JudgeSettings(), NullThrottle(), JudgeStats()), memo,
                            RunCounters(), 2)  # fmt: skip
    async with anyio.create_task_group() as tg:
        dispatcher.start(tg)
        await dispatcher.close()
        await dispatcher.finish_memo()  # shutdown closed the stream; the writer ends
    late = [("late-1", (True, "finished late", 3, 1)), ("late-2", (False, "also late", 3, 1))]
    await dispatcher.to_memo(late)  # a worker's last verdicts: no error
    await dispatcher.write_late()
    assert memo.get_many(["late-1", "late-2"]) == dict(late)
    memo.close()
