"""`--reason llm` in the batch path: after a batch is scored, the judge rewrites each scored row's
verdict-built reason into prose. Reason calls are memoized (same memo, own prompt version) and
run `concurrency` at a time through the judge's rate throttle.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pyarrow as pa

from ctxprec.connectors.judges.base import Judge
from ctxprec.connectors.judges.prompts import REASON_VERSION, reason_prompt
from ctxprec.limits.pool import each
from ctxprec.storage.core.constants import STATUS_OK
from ctxprec.storage.core.errors import JudgeError
from ctxprec.storage.memo.store import MemoEntry, MemoStore, memo_key

__all__ = ["keep_built_reason", "write_llm_reasons"]


def keep_built_reason(written: str, built: str) -> str:
    """A judge that writes no prose (the offline one answers "") leaves the built reason."""
    return written.strip() or built


async def write_llm_reasons(
    table: pa.Table,
    queries: Sequence[str | None],
    expecteds: Sequence[str | None],
    *,
    judge: Judge,
    memo: MemoStore | None,
    prefix: bytes,
    concurrency: int,
) -> tuple[pa.Table, int]:
    """The table with its `reason` column rewritten by the judge for `ok` rows; also the number
    of reason calls made. A reason call that fails keeps the built reason (the score stands)."""
    built = table.column("reason").to_pylist()
    status = table.column("status").to_pylist()
    scores = table.column("score").to_pylist()
    todo = [i for i, s in enumerate(status) if s == STATUS_OK and queries[i] is not None]
    keys = {
        i: memo_key(prefix, REASON_VERSION, str(queries[i]), expecteds[i], built[i]) for i in todo
    }
    found: dict[str, MemoEntry] = {}
    if memo is not None and keys:
        found = await anyio.to_thread.run_sync(memo.get_many, list(keys.values()))
    out = list(built)
    calls = 0
    fresh: list[tuple[str, MemoEntry]] = []

    async def one(i: int) -> None:
        nonlocal calls
        prompt = reason_prompt(str(queries[i]), expecteds[i], built[i], scores[i])
        calls += 1
        try:
            text = await judge.write_reason(prompt)
        except JudgeError:
            return
        out[i] = keep_built_reason(text, built[i])
        fresh.append((keys[i], (True, out[i], 0, 0)))

    missing = []
    for i in todo:
        hit = found.get(keys[i])
        if hit is not None:
            out[i] = hit[1]
        else:
            missing.append(i)
    await each(missing, one, concurrency)
    if memo is not None and fresh:
        await anyio.to_thread.run_sync(memo.set_many, fresh)
    index = table.schema.get_field_index("reason")
    return table.set_column(index, "reason", pa.array(out, pa.string())), calls
