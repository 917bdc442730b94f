"""Reduce: a batch's verdicts go through the vectorized Polars stage of the metric in one call,
then each row's columns (score, rank metrics, reason, tokens) are assembled into the scored Arrow
table in the documented output schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow as pa

from connectors.judges.prompts import CRITERION, CRITERION_QUERY_ONLY, prompt_version_for
from pipeline.reason import build_reason, failed_reason, item_texts
from pipeline.rows import BatchJob, RowPlan
from storage.core.constants import STATUS_EMPTY, STATUS_OK
from storage.core.metric import map_score, map_stage, rank_column_names
from storage.memo import INPUT_TOKENS, OUTPUT_TOKENS, REASON, RELEVANT

__all__ = ["TableSpec", "reduce_rows", "scored_table"]


@dataclass(frozen=True, slots=True)
class TableSpec:
    schema: pa.Schema
    judge_model: str
    scale: float
    ks: tuple[int, ...]
    per_row: bool
    has_labels: bool


def reduce_rows(plans: Sequence[RowPlan], spec: TableSpec) -> dict[int, dict[str, Any]]:
    """The Polars stage over every judged item of the batch: row index -> its metrics."""
    return _reduce(plans, spec)[0]


def _reduce(
    plans: Sequence[RowPlan], spec: TableSpec
) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """Row index -> its metrics, and -> the items part of its reason (`item_texts`), for the
    rows whose verdicts are all in; both built over the batch's flat items at once."""
    ok = [r for r, plan in enumerate(plans) if plan.status == STATUS_OK and plan.entries]
    entries = [e for r in ok for e in plans[r].entries]
    if not entries:
        return {}, {}
    lengths = [len(plans[r].entries) for r in ok]
    rows = pl.Series("row", ok, dtype=pl.Int64).repeat_by(pl.Series(lengths)).explode()
    relevant = [e[RELEVANT] for e in entries]  # type: ignore[index]
    items = pl.DataFrame(
        {"row": rows, "relevant": relevant}, schema={"row": pl.Int64, "relevant": pl.Boolean}
    ).with_columns(position=pl.int_range(pl.len(), dtype=pl.Int64).over("row"))
    scored = map_stage(items, scale=spec.scale, ks=spec.ks)
    metrics = {int(d["row"]): d for d in scored.iter_rows(named=True)}
    reasons = [e[REASON] for e in entries]  # type: ignore[index]
    texts = item_texts(items.get_column("row"), relevant, reasons, sentence=True)
    return metrics, dict(zip(ok, texts, strict=True))


def _empty_metrics(ks: Sequence[int]) -> dict[str, Any]:
    out: dict[str, Any] = {name: 0.0 for name in rank_column_names(ks)}
    out.update({f"hit_at_{k}": False for k in ks})
    return out


def _row_columns(
    plan: RowPlan,
    metrics: dict[str, Any] | None,
    spec: TableSpec,
    items_sentence: str | None = None,
) -> dict[str, Any]:
    criterion = CRITERION if plan.expected is not None else CRITERION_QUERY_ONLY
    version = prompt_version_for(plan.expected, spec.per_row)
    entries = plan.entries
    got = [e for e in entries if e is not None] if None in entries else entries
    base: dict[str, Any] = {
        "status": plan.status,
        "error": plan.error,
        "verdicts": [e[RELEVANT] if e is not None else None for e in entries],
        "verdict_reasons": [e[REASON] if e is not None else None for e in entries],
        "context_count": len(plan.items),
        "judge_model": spec.judge_model,
        "prompt_version": version,
    }
    base["input_tokens"], base["output_tokens"] = _paid_tokens(plan)
    if plan.status == STATUS_OK:
        assert metrics is not None
        rel = [bool(e[RELEVANT]) for e in got]  # type: ignore[index]
        base.update(metrics)  # the rank columns, score and relevant_count (and "row": unused)
        base["reason"] = build_reason(
            rel,
            [e[REASON] for e in got] if items_sentence is None else (),  # type: ignore[index]
            score=metrics["score"],
            scale=spec.scale,
            criterion=criterion,
            items_sentence=items_sentence,
        )
    elif plan.status == STATUS_EMPTY:
        base.update(_empty_metrics(spec.ks))
        base.update(score=0.0, relevant_count=0, verdicts=[], verdict_reasons=[])
        base["reason"] = build_reason([], [], score=0.0, scale=spec.scale, criterion=criterion)
    else:
        base.update(dict.fromkeys(rank_column_names(spec.ks)))
        base.update(score=None, relevant_count=None)
        failed = [i for i, e in enumerate(entries) if e is None]
        base["reason"] = failed_reason(len(plan.items), failed, plan.error or "failed")
        if not plan.items:
            base.update(verdicts=None, verdict_reasons=None)
    return base


def _paid_tokens(plan: RowPlan) -> tuple[int, int]:
    """Tokens of the calls this row carries: a call shared by several rows counts once."""
    extra_in, extra_out = plan.extra_tokens
    paid = plan.paid
    if paid and True not in paid:  # e.g. a re-run: every verdict came from the memo for free
        return extra_in, extra_out
    t_in = t_out = 0
    for e, p in zip(plan.entries, paid or [True] * len(plan.entries), strict=True):
        if e is not None and p:
            t_in += int(e[INPUT_TOKENS])
            t_out += int(e[OUTPUT_TOKENS])
    return t_in + extra_in, t_out + extra_out


def scored_table(job: BatchJob, spec: TableSpec) -> pa.Table:
    """The batch's rows in the documented output schema."""
    metrics, texts = _reduce(job.rows, spec)
    cols = [
        _row_columns(plan, metrics.get(r), spec, texts.get(r)) for r, plan in enumerate(job.rows)
    ]
    now = datetime.now(UTC)
    data: dict[str, Any] = {}
    frame = job.frame
    for name in spec.schema.names:
        if name in frame.columns:  # a passthrough named like a normalized column *is* it
            data[name] = frame.get_column(name).to_arrow()
        elif name == "scored_at":
            data[name] = [now] * len(cols)
        elif name == "label_verdicts":
            data[name] = frame.get_column("labels").to_arrow()
        elif name == "label_score":
            data[name] = _label_scores(frame, spec.scale)
        else:
            data[name] = [c[name] for c in cols]
    arrays = [
        pa.array(data[f.name], type=f.type)
        if not isinstance(data[f.name], pa.Array | pa.ChunkedArray)
        else data[f.name].cast(f.type)
        for f in spec.schema
    ]
    return pa.Table.from_arrays(arrays, schema=spec.schema)


def _label_scores(frame: pl.DataFrame, scale: float) -> list[float | None]:
    out: list[float | None] = []
    for labels in frame.get_column("labels").to_list():
        if labels is None or any(x is None for x in labels):
            out.append(None)
        else:
            out.append(map_score(labels, scale))
    return out
