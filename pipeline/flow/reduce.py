"""Reduce: a batch's verdicts go through the vectorized Polars stage of the metric in one call,
then each row's columns (score, rank metrics, reason, tokens) are assembled into the scored Arrow
table in the documented output schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import accumulate, chain
from operator import itemgetter
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from ctxprec.connectors.judges.prompts import CRITERION, CRITERION_QUERY_ONLY, prompt_version_for
from ctxprec.flow.dispatch import PAID, RunCounters
from ctxprec.flow.reason import build_reason, failed_reason, item_texts_lazy
from ctxprec.flow.rows import ChunkJob, RowPlan
from ctxprec.storage.core.constants import STATUS_EMPTY, STATUS_FAILED, STATUS_OK
from ctxprec.storage.core.metric import map_score, map_stage_lazy, rank_column_names
from ctxprec.storage.memo.store import INPUT_TOKENS, OUTPUT_TOKENS, REASON, RELEVANT, MemoEntry
from ctxprec.storage.outdir.schema import TOKEN_COLUMNS

__all__ = ["TableSpec", "add_tokens", "scored_table"]


@dataclass(frozen=True, slots=True)
class TableSpec:
    schema: pa.Schema
    judge_model: str
    scale: float
    ks: tuple[int, ...]
    per_row: bool
    has_labels: bool
    verdict_only: bool = False  # the judge gave no per-item reasons (`[judge] verdict_only`)
    has_audit: bool = False  # --audit-model: the audit_verdicts and audit_score columns


class _Flat:
    """A batch's verdicts as flat columns (row by row, item by item; None where an item has no
    verdict) with each row's offset into them: what the Polars stage and the list columns of
    the output take, without a Python list per row."""

    __slots__ = (
        "empty",
        "lengths",
        "offsets",
        "ok",
        "reasons",
        "relevant",
        "relevant_s",
        "row_ids",
    )

    def __init__(self, plans: Sequence[RowPlan]) -> None:
        self.lengths = [len(plan.entries) for plan in plans]
        self.offsets = [0, *accumulate(self.lengths)]
        entries: list[MemoEntry | None] = list(chain.from_iterable(p.entries for p in plans))
        if None in entries:
            self.relevant: list[bool | None] = [None if e is None else e[RELEVANT] for e in entries]
            reasons: list[str | None] = [None if e is None else e[REASON] for e in entries]
        else:
            self.relevant = list(map(itemgetter(RELEVANT), entries))  # type: ignore[arg-type]
            reasons = list(map(itemgetter(REASON), entries))  # type: ignore[arg-type]
        # made once: the Polars stage and the output's list columns both read them
        self.relevant_s = pl.Series("relevant", self.relevant, dtype=pl.Boolean)
        self.reasons = pl.Series("why", reasons, dtype=pl.String)
        # the rows the metric scores: ok, with every verdict in
        self.ok = [r for r, plan in enumerate(plans) if plan.status == STATUS_OK and plan.entries]
        self.empty = [plan.status == STATUS_EMPTY for plan in plans]
        self.row_ids = (
            pl.Series("row", range(len(plans)), dtype=pl.Int64)
            .repeat_by(pl.Series(self.lengths, dtype=pl.UInt32))
            .explode()
        )


def _reduce(flat: _Flat, spec: TableSpec) -> tuple[pl.DataFrame, list[str], pl.DataFrame]:
    """Over the batch's flat items, in one Polars collect: the metrics of the rows in `flat.ok`
    (one row each, in order, keyed by `row`), the items part of their reasons (`item_texts`),
    and score, relevant_count and the rank columns of every row (the stage's figures for the
    scored rows, zeros for an empty context list, nulls for a failed row)."""
    items = pl.LazyFrame([flat.row_ids, flat.relevant_s, flat.reasons])
    if len(flat.ok) != len(flat.lengths):  # some rows are not scored: their items stay out
        items = items.filter(pl.col("row").is_in(pl.Series(flat.ok, dtype=pl.Int64).implode()))
    items = items.with_columns(position=pl.int_range(pl.len(), dtype=pl.Int64).over("row"))
    scored = map_stage_lazy(
        items.select("row", "position", "relevant"), scale=spec.scale, ks=spec.ks
    )
    queries = [scored, _metric_columns(flat, scored, spec)]
    if flat.ok:
        queries.append(
            item_texts_lazy(
                items.select("row", rel="relevant", why="why", pos="position"),
                sentence=True,
                verdict_only=spec.verdict_only,
            )
        )
    done = pl.collect_all(queries)
    return done[0], done[2].get_column("text").to_list() if len(done) > 2 else [], done[1]


def _metric_columns(flat: _Flat, scored: pl.LazyFrame, spec: TableSpec) -> pl.LazyFrame:
    """score, relevant_count and the rank columns of every row, from the stage's figures."""
    names = ["score", "relevant_count", *rank_column_names(spec.ks)]
    frame = pl.LazyFrame(
        {"row": range(len(flat.lengths)), "empty": flat.empty},
        schema={"row": pl.Int64, "empty": pl.Boolean},
    ).join(scored.select("row", *names), on="row", how="left", maintain_order="left")
    if True in flat.empty:
        zero = {
            name: pl.lit(False) if name.startswith("hit_at_") else pl.lit(0.0) for name in names
        }
        zero["relevant_count"] = pl.lit(0, dtype=pl.Int64)
        frame = frame.with_columns(
            pl.when(pl.col("empty")).then(zero[name]).otherwise(pl.col(name)).alias(name)
            for name in names
        )
    return frame.select(names)


def _reasons(
    plans: Sequence[RowPlan], flat: _Flat, scored: pl.DataFrame, texts: list[str], spec: TableSpec
) -> list[str]:
    """Each row's reason: from its verdicts, its score and its items sentence when scored."""
    out: list[str] = []
    scores = dict(zip(flat.ok, scored.get_column("score").to_list(), strict=True))
    sentences = dict(zip(flat.ok, texts, strict=True))
    relevant, offsets, scale = flat.relevant, flat.offsets, spec.scale
    for r, plan in enumerate(plans):
        criterion = CRITERION if plan.expected is not None else CRITERION_QUERY_ONLY
        if plan.status == STATUS_OK:
            out.append(
                build_reason(
                    relevant[offsets[r] : offsets[r + 1]],  # type: ignore[arg-type]
                    (),
                    score=scores[r],
                    scale=scale,
                    criterion=criterion,
                    items_sentence=sentences[r],
                )
            )
        elif plan.status == STATUS_EMPTY:
            out.append(build_reason([], [], score=0.0, scale=scale, criterion=criterion))
        else:
            failed = [i for i, e in enumerate(plan.entries) if e is None]
            out.append(failed_reason(len(plan.items), failed, plan.error or "failed"))
    return out


# Python lists become Arrow arrays through Polars: `pa.array(<list>)` imports pandas on its first
# call whenever pandas is installed (to check the list is not a pandas object), ~0.2 s a run
_POLARS_TYPE: dict[pa.DataType, pl.DataType] = {
    pa.string(): pl.String(),
    pa.int64(): pl.Int64(),
    pa.int32(): pl.Int32(),
    pa.float64(): pl.Float64(),
    pa.bool_(): pl.Boolean(),
    pa.timestamp("us", tz="UTC"): pl.Datetime("us", "UTC"),
}


_INT32_OFFSETS = 2**31  # a string array's offsets must stay below this to fit in 32 bits


def _fit(array: pa.Array, kind: pa.DataType) -> pa.Array:
    """`array` as type `kind`. Polars hands strings over with 64-bit offsets (large_string);
    those are narrowed by rewriting the offsets alone (the text is not copied) rather than by
    `Array.cast`, whose first use imports pyarrow.compute, ~25 ms of a small run's start-up.
    Anything else that differs goes through `cast`."""
    if array.type == kind:
        return array
    if kind == pa.string() and array.type == pa.large_string():
        validity, offsets, data = array.buffers()
        if offsets is not None:
            wide = np.frombuffer(offsets, dtype=np.int64, count=array.offset + len(array) + 1)
            if int(wide[-1]) < _INT32_OFFSETS:
                buffers = [validity, pa.py_buffer(wide.astype(np.int32)), data or pa.py_buffer(b"")]
                return pa.Array.from_buffers(
                    kind, len(array), buffers, array.null_count, array.offset
                )
    return array.cast(kind)


def _fit_any(array: pa.Array | pa.ChunkedArray, kind: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """`_fit` for an array or each chunk of a chunked one."""
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([_fit(chunk, kind) for chunk in array.chunks], type=kind)
    return _fit(array, kind)


def _arrow(values: list[Any], kind: pa.DataType) -> pa.Array:
    """A Python list as an Arrow array of type `kind` (one of `_POLARS_TYPE`'s)."""
    series = pl.Series(values=values, dtype=_POLARS_TYPE[kind])
    return _fit(series.to_arrow(compat_level=pl.CompatLevel.oldest()), kind)


def _list_column(
    values: pl.Series, flat: _Flat, null_rows: list[bool], kind: pa.DataType
) -> pa.Array:
    """A list<kind> column from flat values and the rows' offsets (null where `null_rows`)."""
    mask = _arrow(null_rows, pa.bool_()) if True in null_rows else None
    items = _fit(values.to_arrow(compat_level=pl.CompatLevel.oldest()), kind)
    return pa.ListArray.from_arrays(_arrow(flat.offsets, pa.int32()), items, mask=mask)


def _row_tokens(plan: RowPlan) -> tuple[int, int, int, int]:
    """(paid in, paid out, verdict in, verdict out): the tokens of the calls this run paid that
    the row carries, and what the verdicts it carries cost when first paid (a memo hit costs
    nothing now). A call shared by several rows counts once, on the first row that used it;
    `--mode row`'s extra tokens (items of the row's call judged elsewhere) were paid now."""
    extra_in, extra_out = plan.extra_tokens
    paid = plan.paid
    if paid and not any(paid):  # e.g. a verdict another row carries, or none had tokens
        return extra_in, extra_out, extra_in, extra_out
    p_in = p_out = v_in = v_out = 0
    for e, p in zip(plan.entries, paid or [PAID] * len(plan.entries), strict=True):
        if e is not None and p:
            t_in, t_out = int(e[INPUT_TOKENS]), int(e[OUTPUT_TOKENS])
            v_in += t_in
            v_out += t_out
            if p == PAID:
                p_in += t_in
                p_out += t_out
    return p_in + extra_in, p_out + extra_out, v_in + extra_in, v_out + extra_out


def _row_columns(plans: Sequence[RowPlan], spec: TableSpec) -> dict[str, Any]:
    """The columns of the output made row by row, from each row's plan."""
    versions = {
        True: prompt_version_for("", spec.per_row, spec.verdict_only),
        False: prompt_version_for(None, spec.per_row, spec.verdict_only),
    }
    tokens = [_row_tokens(plan) for plan in plans]
    return {
        "status": [plan.status for plan in plans],
        "error": [plan.error for plan in plans],
        "context_count": [len(p.items) if p.given is None else p.given for p in plans],
        "judge_model": [spec.judge_model] * len(plans),
        "prompt_version": [versions[plan.expected is not None] for plan in plans],
        **{name: [t[i] for t in tokens] for i, name in enumerate(TOKEN_COLUMNS)},
    }


def scored_table(job: ChunkJob, spec: TableSpec) -> pa.Table:
    """The batch's rows in the documented output schema, built column by column: the verdicts
    of the whole batch go through the Polars stage once, and the list columns are made from the
    flat verdicts and the rows' offsets."""
    plans = job.rows
    flat = _Flat(plans)
    scored, texts, metrics = _reduce(flat, spec)
    null_rows = [plan.status == STATUS_FAILED and not plan.items for plan in plans]
    data: dict[str, Any] = _row_columns(plans, spec)
    data.update((name, metrics.get_column(name).to_arrow()) for name in metrics.columns)
    data["reason"] = _reasons(plans, flat, scored, texts, spec)
    data["verdicts"] = _list_column(flat.relevant_s, flat, null_rows, pa.bool_())
    data["verdict_reasons"] = _list_column(flat.reasons, flat, null_rows, pa.string())
    now = datetime.now(UTC)
    frame = job.frame
    for name in spec.schema.names:
        if name in frame.columns:  # a passthrough named like a normalized column *is* it
            data[name] = frame.get_column(name).to_arrow()
        elif name == "scored_at":
            data[name] = [now] * len(plans)
        elif name == "label_verdicts":
            data[name] = frame.get_column("labels").to_arrow()
        elif name == "label_score":
            data[name] = _label_scores(frame, spec.scale)
        elif name == "audit_verdicts":
            audit = pl.Series(values=job.audit or [None] * len(plans), dtype=pl.List(pl.Boolean))
            data[name] = audit.to_arrow(compat_level=pl.CompatLevel.oldest())
        elif name == "audit_score":
            data[name] = _audit_scores(job.audit or [None] * len(plans), spec.scale)
    arrays = [
        _arrow(data[f.name], f.type)
        if not isinstance(data[f.name], pa.Array | pa.ChunkedArray)
        else _fit_any(data[f.name], f.type)
        for f in spec.schema
    ]
    return pa.Table.from_arrays(arrays, schema=spec.schema)


def _label_scores(frame: pl.DataFrame, scale: float) -> list[float | None]:
    return _audit_scores(frame.get_column("labels").to_list(), scale)


def _audit_scores(rows: Sequence[Sequence[bool | None] | None], scale: float) -> list[float | None]:
    """The MAP of each row's reference verdicts (labels, the audit judge's): null where a row
    has none or one of its items has no verdict."""
    out: list[float | None] = []
    for labels in rows:
        if labels is None or any(x is None for x in labels):
            out.append(None)
        else:
            out.append(map_score([bool(x) for x in labels], scale))
    return out


def add_tokens(counters: RunCounters, table: pa.Table) -> None:
    """Add a scored table's token columns (int64, never null) to the run's counters, summed
    from their buffers (no Python value per row, no pyarrow.compute import)."""
    for name in TOKEN_COLUMNS:
        total = 0
        for chunk in table.column(name).chunks:
            values = np.frombuffer(
                chunk.buffers()[1], dtype=np.int64, count=chunk.offset + len(chunk)
            )
            total += int(values[chunk.offset :].sum())
        setattr(counters, name, getattr(counters, name) + total)
