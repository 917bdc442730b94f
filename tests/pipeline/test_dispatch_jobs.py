"""The dispatcher's job stream: bounded (a sender never gets more than its cap of jobs ahead of
the workers), and a sender held at the cap waits until the workers took half of it, so it is
woken once per half buffer, not once per job; every job is still judged exactly once."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import anyio.lowlevel

from ctxprec.connectors.judges.base import ItemRequest, JudgeStats, JudgeWrapper, NullThrottle
from ctxprec.connectors.judges.offline import OfflineJudge
from ctxprec.flow.dispatch import Dispatcher, RunCounters
from ctxprec.storage.core.settings import JudgeSettings
from ctxprec.storage.core.verdict import JudgeReply, Verdict

JOBS = 600


class SlowJudge(JudgeWrapper):
    """A judge reached over the network: each call gives the event loop a turn."""

    def __init__(self) -> None:
        super().__init__(OfflineJudge("", JudgeSettings(), NullThrottle(), JudgeStats()))
        self.judged: list[str] = []

    async def judge_item(self, request: ItemRequest) -> JudgeReply:
        await anyio.lowlevel.checkpoint()
        self.judged.append(request.item)
        return JudgeReply(Verdict(True, "why"), 1, 1)

    async def judge_row(
        self, query: str, expected: str | None, items: Sequence[str]
    ) -> list[JudgeReply]:
        raise NotImplementedError


async def test_a_sender_at_the_cap_is_woken_once_per_half_buffer() -> None:
    judge = SlowJudge()
    counters = RunCounters()
    held = 0  # submissions during which the workers ran: the sender was suspended
    most_queued = 0
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            d = Dispatcher(judge, None, counters, concurrency=2)
            d.start(tg)
            cap = 64  # max(64, 2 x concurrency)
            for i in range(JOBS):
                before = counters.calls_done
                await d.submit_item(f"k{i}", ItemRequest("q", None, f"item {i}"))
                held += counters.calls_done != before
                most_queued = max(most_queued, d._job_send.statistics().current_buffer_used)
            await d.close()
            await d.finish_memo()  # (no memo: nothing for the writer to wait for)
    assert sorted(judge.judged) == sorted(f"item {i}" for i in range(JOBS))
    assert counters.calls_done == JOBS
    assert most_queued <= cap
    # once the stream is full, one suspension per cap / 2 jobs (anyio's bounded stream alone:
    # one per job)
    assert held <= JOBS / (cap // 2) + 2
