"""`score --recheck FRACTION`: the judge against itself. After the stage, a seeded random sample of
the run's items is sent to the judge again, past the memo (read nor written: the first verdicts
stay what the output and the memo hold), and the two verdicts of each item are compared: flip
rate, agreement, Cohen's κ.

The sample is drawn item by item from a seeded hash of the item's memo key, so it needs no list
of the run's items and is the same wherever the item appears (an item shared by several rows is
asked again once). In `--mode row` the row holding a sampled item is asked again whole (the
same prompt as the first time) and only its sampled items are compared.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import polars as pl

from ctxprec.config import Config
from ctxprec.connectors.judges import ItemRequest, JudgeStats, create_judge
from ctxprec.connectors.judges.base import estimate_tokens
from ctxprec.connectors.judges.prompts import item_messages, row_messages
from ctxprec.connectors.sources import SourceInfo
from ctxprec.flow.dispatch import add_counts
from ctxprec.flow.extractor import load_extractor
from ctxprec.flow.planning import ChunkPlanner
from ctxprec.flow.rows import RowPlan
from ctxprec.limits.limiter import RateThrottle
from ctxprec.limits.pool import each
from ctxprec.storage.core.constants import STATUS_OK
from ctxprec.storage.core.errors import JudgeError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.files.objpath import OutPath, local_copies
from ctxprec.storage.memo.store import judge_prefix
from ctxprec.storage.outdir.ownership import part_files
from ctxprec.storage.stats.agreement import agreement_figures
from ctxprec.storage.stats.sample import in_sample

__all__ = ["recheck_cost", "recheck_run", "sampled"]


def sampled(key: str, fraction: float, seed: int) -> bool:
    """Whether the item with memo key `key` is in the seeded sample of `fraction` of items."""
    return in_sample(f"{seed}:{key}", fraction)


@dataclass
class _Ask:
    """One re-ask: an item (or, in row mode, the row holding sampled items)."""

    row_id: Any
    query: str
    expected: str | None
    items: list[str]
    positions: list[int]  # the sampled positions in `items` (all of them: one item)
    keys: list[str]


def _asks(plans: Sequence[RowPlan], ids: Sequence[Any], fraction: float, seed: int,
          per_row: bool, seen: set[str]) -> Iterable[_Ask]:  # fmt: skip
    """The re-asks a batch's rows give: each sampled item once per run (`seen`)."""
    for row_id, plan in zip(ids, plans, strict=True):
        if plan.status != STATUS_OK or plan.query is None:
            continue
        hits = [i for i, k in enumerate(plan.keys) if k not in seen and sampled(k, fraction, seed)]
        if not hits:
            continue
        seen.update(plan.keys[i] for i in hits)
        if per_row:
            yield _Ask(row_id, plan.query, plan.expected, plan.items, hits,
                       [plan.keys[i] for i in hits])  # fmt: skip
        else:
            for i in hits:
                yield _Ask(row_id, plan.query, plan.expected, [plan.items[i]], [i], [plan.keys[i]])


def recheck_cost(
    plans: Sequence[RowPlan], fraction: float, seed: int, per_row: bool, seen: set[str],
    verdict_only: bool = False,
) -> tuple[int, int, list[int]]:  # fmt: skip
    """(calls, estimated prompt tokens, items each call carries) of the re-asks these rows add
    (for `ctxprec estimate`; the rows' memo keys must be attached)."""
    calls = tokens = 0
    carried: list[int] = []
    for ask in _asks(plans, [None] * len(plans), fraction, seed, per_row, seen):
        calls += 1
        carried.append(len(ask.items))
        if per_row:
            messages = row_messages(ask.query, ask.expected, ask.items, verdict_only)
        else:
            request = ItemRequest(ask.query, ask.expected, ask.items[0])
            messages = item_messages(request, verdict_only)
        tokens += estimate_tokens(*messages)
    return calls, tokens, carried


def _first_verdicts(outdir: OutPath, ids: list[Any]) -> dict[Any, list[bool | None]]:
    """The output's verdicts of the rows holding sampled items, by id."""
    files = part_files(outdir)
    if not files or not ids:
        return {}
    with local_copies(files, outdir) as local:
        scans = [pl.scan_parquet(f, hive_partitioning=False).select("id", "verdicts")
                 for f in local]  # fmt: skip
        wanted = pl.Series(ids)
        frame = (
            pl.concat(scans, how="vertical_relaxed")
            .filter(pl.col("id").cast(wanted.dtype, strict=False).is_in(wanted.implode()))
            .collect()
        )
    return {row_id: verdicts for row_id, verdicts in frame.iter_rows() if verdicts is not None}


async def recheck_run(
    cfg: Config, info: SourceInfo, identity: dict[str, object], per_row: bool, outdir: OutPath,
    stats: JudgeStats, *, seams: Seams = DEFAULT,
) -> dict[str, Any] | None:  # fmt: skip
    """Ask the sampled items again and compare; the figures run.json and the summary keep.
    The recheck's calls are added to `stats` (they are this run's calls and cost)."""
    fraction, seed = cfg.run.recheck, cfg.run.recheck_seed
    if fraction <= 0:
        return None
    extractor = load_extractor(cfg.columns.extractor) if cfg.columns.extractor else None
    prefix = judge_prefix(identity)
    seen: set[str] = set()

    def collect() -> list[_Ask]:
        asks: list[_Ask] = []
        planner = ChunkPlanner(cfg, prefix, per_row=per_row, memo=None, extractor=extractor)
        for planned in planner.planned(info):
            ids = planned.frame.get_column("id").to_list()
            asks.extend(_asks(planned.rows, ids, fraction, seed, per_row, seen))
        return asks

    asks = await anyio.to_thread.run_sync(collect)
    first = await anyio.to_thread.run_sync(
        _first_verdicts, outdir, list(dict.fromkeys(a.row_id for a in asks))
    )
    mine = JudgeStats()
    throttle = RateThrottle(cfg.limits.concurrency, cfg.limits.rpm, cfg.limits.tpm,
                    adaptive=cfg.limits.adaptive)  # fmt: skip
    judge = create_judge(cfg.judge, throttle=throttle, stats=mine, seams=seams)
    pairs: list[tuple[bool, bool]] = []
    failed = 0

    async def one(ask: _Ask) -> None:
        nonlocal failed
        before = first.get(ask.row_id)
        if before is None or (per_row and len(before) != len(ask.items)):
            return  # the row is not in the output (or not as read): nothing to compare with
        try:
            if per_row:
                replies = await judge.judge_row(ask.query, ask.expected, ask.items)
                again = [replies[i].verdict.relevant for i in ask.positions]
            else:
                request = ItemRequest(ask.query, ask.expected, ask.items[0])
                again = [(await judge.judge_item(request)).verdict.relevant]
        except JudgeError:
            failed += len(ask.positions)
            return
        for position, verdict in zip(ask.positions, again, strict=True):
            was = before[position] if position < len(before) else None
            if was is not None:
                pairs.append((was, verdict))

    try:
        await each(asks, one, cfg.limits.concurrency)
    finally:
        with anyio.CancelScope(shield=True):
            await judge.aclose()
    add_counts(stats, mine)  # the recheck's calls are this run's calls
    result = _figures(pairs, failed, fraction, seed, mine, cfg, judge.model)
    print(_line(result), file=sys.stderr, flush=True)
    return result


def _figures(pairs: list[tuple[bool, bool]], failed: int, fraction: float, seed: int,
             stats: JudgeStats, cfg: Config, model: str) -> dict[str, Any]:  # fmt: skip
    counts = np.zeros((len(pairs), 4), dtype=np.int64)
    for i, (a, b) in enumerate(pairs):
        counts[i, (0 if b else 1) if a else (2 if b else 3)] = 1
    figures = agreement_figures(counts, resamples=2000, seed=seed)
    price = cfg.price_for(model)
    cost = None
    if price is not None:
        cost = (stats.input_tokens * price.input_per_mtok
                + stats.output_tokens * price.output_per_mtok) / 1e6  # fmt: skip
    return {
        "fraction": fraction,
        "seed": seed,
        "items": len(pairs),
        "failed": failed,
        "flips": figures["table"]["only_a_relevant"] + figures["table"]["only_b_relevant"],
        "flip_rate": figures["flip_rate"],
        "agreement": figures["agreement"],
        "cohen_kappa": figures["cohen_kappa"],
        "kappa_ci95": figures["kappa_ci95"],
        "table": figures["table"],
        "requests": stats.requests,
        "input_tokens": stats.input_tokens,
        "output_tokens": stats.output_tokens,
        "cost_usd": cost,
    }


def _line(r: dict[str, Any]) -> str:
    kappa = "n/a" if r["cohen_kappa"] is None else f"{r['cohen_kappa']:.3f}"
    flip = "n/a" if r["flip_rate"] is None else f"{r['flip_rate']:.1%}"
    return (
        f"recheck: {r['items']:,} items asked again ({r['fraction']:g} of the run's, seed "
        f"{r['seed']}): {r['flips']:,} flipped ({flip}), self-agreement kappa {kappa}"
        + (f"; {r['failed']:,} re-asks failed" if r["failed"] else "")
    )
