"""One input batch, start to finish: row checks, memo keys and lookups, waiting for verdicts,
then the vectorized reduce and the scored Arrow table in the documented schema.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import polars as pl
import pyarrow as pa
from anyio.streams.memory import MemoryObjectReceiveStream

from connectors.judges.base import ItemRequest
from connectors.judges.prompts import CRITERION, CRITERION_QUERY_ONLY, prompt_version_for
from connectors.sources import INPUT_ERROR
from pipeline.dispatch import Dispatcher, ItemOutcome, RunCounters
from pipeline.reason import build_reason, failed_reason
from storage.core.constants import STATUS_EMPTY, STATUS_FAILED, STATUS_OK
from storage.core.errors import ConfigError
from storage.core.metric import map_score, map_stage, rank_column_names
from storage.memo import MemoEntry, memo_key

__all__ = ["BatchJob", "RowPlan", "load_extractor", "plan_rows", "resolve_items", "scored_table"]

Extractor = Callable[[dict[str, Any]], Any]


def load_extractor(spec: str) -> Extractor:
    """Import "module:function"; a clear ConfigError when it is not there."""
    module_name, _, attr = spec.rpartition(":")
    try:
        fn = getattr(_import(module_name), attr)
    except (ImportError, AttributeError, OSError, SyntaxError) as exc:
        raise ConfigError(
            f"context extractor {spec!r} cannot be loaded ({exc}); give it as module:function "
            "with the module importable (in the current folder, on PYTHONPATH or installed), "
            "or as path/to/file.py:function"
        ) from None
    if not callable(fn):
        raise ConfigError(
            f"context extractor {spec!r} is not callable; name a function that takes the row "
            "(a dict) and returns its context items as a list of strings"
        )
    extractor: Extractor = fn
    return extractor


def _import(name: str) -> Any:
    """A module by name (the current folder is importable, as with `python -m`) or a .py file."""
    if name.endswith(".py") or "/" in name or os.sep in name:
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise ImportError(f"no file {path}")
        mod_name = f"ctxprec_extractor_{path.stem}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
        return module
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return importlib.import_module(name)


@dataclass(slots=True)
class RowPlan:
    """One row's items and, once resolved, its verdict entries or its error."""

    query: str | None
    expected: str | None
    items: list[str]
    status: str = STATUS_OK
    error: str | None = None
    keys: list[str] = field(default_factory=list)
    entries: list[MemoEntry | None] = field(default_factory=list)
    paid: list[bool] = field(default_factory=list)  # this row carries the item's call tokens
    # --mode row: the row's call also judged items whose verdicts came from elsewhere; their
    # share of the call's tokens is carried here (the verdicts stay those already known)
    extra: list[ItemOutcome] = field(default_factory=list)
    extra_tokens: tuple[int, int] = (0, 0)
    waits: list[tuple[int, ItemOutcome]] = field(default_factory=list)


@dataclass(slots=True)
class BatchJob:
    key: str
    frame: pl.DataFrame
    rows: list[RowPlan]


def _check_items(items: Any, max_chars: int) -> str | None:
    if not isinstance(items, list):
        return f"context is {type(items).__name__}, not a list of strings"
    for i, item in enumerate(items):
        if item is None:
            return f"context item #{i + 1} is null"
        if not isinstance(item, str):
            return f"context item #{i + 1} is {type(item).__name__}, not a string"
        if len(item) > max_chars:
            return (
                f"context item #{i + 1} has {len(item):,} characters, over the limit of "
                f"{max_chars:,} ([run] max_item_chars); trim it or raise the limit"
            )
    return None


def _plan_row(query: Any, expected: Any, context: Any, max_chars: int) -> RowPlan:
    if query is None or not isinstance(query, str):
        return RowPlan(None, None, [], STATUS_FAILED, "invalid_input: query is null")
    exp = expected if isinstance(expected, str) else None
    if context is None:
        return RowPlan(query, exp, [], STATUS_EMPTY, None)
    problem = _check_items(context, max_chars)
    if problem is not None:
        return RowPlan(query, exp, [], STATUS_FAILED, f"invalid_input: {problem}")
    if not context:
        return RowPlan(query, exp, [], STATUS_EMPTY, None)
    return RowPlan(query, exp, list(context))


def _extract(frame: pl.DataFrame, extractor: Extractor) -> list[Any]:
    out: list[Any] = []
    rows = (
        frame.get_column("source_row").to_list()
        if "source_row" in frame.columns
        else frame.iter_rows(named=True)
    )
    for row in rows:
        try:
            value = extractor(row)
            out.append(list(value) if isinstance(value, (list, tuple)) else value)
        except Exception as exc:  # the user's code: any failure is this row's failure
            out.append(_ExtractorFailure(f"extractor_error: {type(exc).__name__}: {exc}"))
    return out


@dataclass(frozen=True, slots=True)
class _ExtractorFailure:
    message: str


def plan_rows(frame: pl.DataFrame, extractor: Extractor | None, max_chars: int) -> list[RowPlan]:
    """Row-level checks: bad rows get a status here and never reach the judge."""
    contexts = _extract(frame, extractor) if extractor else frame.get_column("context").to_list()
    queries = frame.get_column("query").to_list()
    expecteds = (
        frame.get_column("expected").to_list()
        if "expected" in frame.columns
        else [None] * len(queries)
    )
    problems = (
        frame.get_column(INPUT_ERROR).to_list()
        if INPUT_ERROR in frame.columns
        else [None] * len(queries)
    )
    plans = []
    for query, expected, context, problem in zip(
        queries, expecteds, contexts, problems, strict=True
    ):
        if problem is not None:  # found while reading the row (e.g. text that is not UTF-8)
            plans.append(RowPlan(None, None, [], STATUS_FAILED, problem))
        elif isinstance(context, _ExtractorFailure):
            plans.append(RowPlan(query, None, [], STATUS_FAILED, context.message))
        else:
            plans.append(_plan_row(query, expected, context, max_chars))
    return plans


def attach_keys(plans: Sequence[RowPlan], prefix: bytes, per_row: bool) -> list[str]:
    """Compute every item's memo key; returns all keys of the batch (for one memo lookup)."""
    every: list[str] = []
    for plan in plans:
        if plan.status != STATUS_OK:
            continue
        version = prompt_version_for(plan.expected, per_row)
        assert plan.query is not None
        plan.keys = [memo_key(prefix, version, plan.query, plan.expected, it) for it in plan.items]
        plan.entries = [None] * len(plan.items)
        plan.paid = [False] * len(plan.items)
        every.extend(plan.keys)
    return every


async def resolve_items(
    plans: Sequence[RowPlan], found: dict[str, MemoEntry], dispatcher: Dispatcher, per_row: bool
) -> None:
    """Fill entries from the memo, from this run's earlier calls, or from new judge calls.

    Submitting and collecting run side by side, so rows complete (and show in the progress bar)
    while later rows of the batch are still being sent out.
    """
    send, recv = anyio.create_memory_object_stream[RowPlan](math.inf)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_collect, recv, dispatcher.counters)
        async with send:
            for plan in plans:
                await _lookup(plan, found, dispatcher, per_row)
                send.send_nowait(plan)


async def _lookup(
    plan: RowPlan, found: dict[str, MemoEntry], dispatcher: Dispatcher, per_row: bool
) -> None:
    if plan.status != STATUS_OK:
        return
    counters = dispatcher.counters
    counters.items += len(plan.items)
    missing: list[int] = []
    for i, key in enumerate(plan.keys):
        entry = found.get(key)
        if entry is not None:
            counters.memo_hits += 1
            plan.entries[i] = entry
            plan.paid[i] = dispatcher.credit(key)
            continue
        known = dispatcher.known(key)
        if known is None:
            missing.append(i)
        elif isinstance(known, ItemOutcome):
            counters.dedup_hits += 1
            plan.waits.append((i, known))
        else:
            counters.dedup_hits += 1
            plan.entries[i] = known
    for i in missing:
        plan.paid[i] = True
    if missing and dispatcher.decider is not None and not per_row:
        assert plan.query is not None
        for i in missing:
            request = ItemRequest(plan.query, plan.expected, plan.items[i])
            plan.entries[i] = await dispatcher.decide_now(plan.keys[i], request)
    elif missing:
        await _submit(plan, missing, dispatcher, per_row)


async def _collect(plans: MemoryObjectReceiveStream[RowPlan], counters: RunCounters) -> None:
    async with plans:
        async for plan in plans:
            for outcome in plan.extra:
                await outcome.event.wait()
                if outcome.entry is not None:
                    t_in, t_out = plan.extra_tokens
                    plan.extra_tokens = (t_in + outcome.entry[2], t_out + outcome.entry[3])
            for i, outcome in plan.waits:
                await outcome.event.wait()
                plan.entries[i] = outcome.entry
                if outcome.error is not None and plan.error is None:
                    plan.error = f"{outcome.error} (item #{i + 1})"
            if plan.error is not None and plan.status == STATUS_OK:
                plan.status = STATUS_FAILED
            counters.rows_judged += 1


async def _submit(plan: RowPlan, missing: list[int], dispatcher: Dispatcher, per_row: bool) -> None:
    assert plan.query is not None
    if per_row:
        keys = [plan.keys[i] for i in range(len(plan.items))]
        outcomes = await dispatcher.submit_row(plan.query, plan.expected, plan.items, keys)
        plan.waits.extend((i, outcomes[i]) for i in missing)
        taken = set(missing)
        plan.extra.extend(o for i, o in enumerate(outcomes) if i not in taken)
        return
    for i in missing:
        request = ItemRequest(plan.query, plan.expected, plan.items[i])
        plan.waits.append((i, await dispatcher.submit_item(plan.keys[i], request)))


# -- reduce and assemble ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TableSpec:
    schema: pa.Schema
    judge_model: str
    scale: float
    ks: tuple[int, ...]
    per_row: bool
    has_labels: bool


def _reduce(plans: Sequence[RowPlan], spec: TableSpec) -> dict[int, dict[str, Any]]:
    rows, positions, relevant = [], [], []
    for r, plan in enumerate(plans):
        if plan.status == STATUS_OK:
            for p, entry in enumerate(plan.entries):
                assert entry is not None
                rows.append(r)
                positions.append(p)
                relevant.append(entry[0])
    if not rows:
        return {}
    items = pl.DataFrame(
        {"row": rows, "position": positions, "relevant": relevant},
        schema={"row": pl.Int64, "position": pl.Int64, "relevant": pl.Boolean},
    )
    scored = map_stage(items, scale=spec.scale, ks=spec.ks)
    return {int(d["row"]): d for d in scored.iter_rows(named=True)}


def _empty_metrics(ks: Sequence[int]) -> dict[str, Any]:
    out: dict[str, Any] = {name: 0.0 for name in rank_column_names(ks)}
    out.update({f"hit_at_{k}": False for k in ks})
    return out


def _row_columns(plan: RowPlan, metrics: dict[str, Any] | None, spec: TableSpec) -> dict[str, Any]:
    criterion = CRITERION if plan.expected is not None else CRITERION_QUERY_ONLY
    version = prompt_version_for(plan.expected, spec.per_row)
    entries = plan.entries
    got = [e for e in entries if e is not None]
    base: dict[str, Any] = {
        "status": plan.status,
        "error": plan.error,
        "verdicts": [e[0] if e is not None else None for e in entries],
        "verdict_reasons": [e[1] if e is not None else None for e in entries],
        "context_count": len(plan.items),
        "judge_model": spec.judge_model,
        "prompt_version": version,
        "input_tokens": _paid(plan, 2),
        "output_tokens": _paid(plan, 3),
    }
    if plan.status == STATUS_OK:
        assert metrics is not None
        rel = [bool(e[0]) for e in got]
        base.update({k: metrics[k] for k in rank_column_names(spec.ks)})
        base["score"] = metrics["score"]
        base["relevant_count"] = metrics["relevant_count"]
        base["reason"] = build_reason(
            rel, [e[1] for e in got], score=metrics["score"], scale=spec.scale, criterion=criterion
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


def _paid(plan: RowPlan, index: int) -> int:
    """Tokens of the calls this row carries: a call shared by several rows counts once."""
    entries, paid = plan.entries, plan.paid or [True] * len(plan.entries)
    own = sum(int(e[index]) for e, p in zip(entries, paid, strict=True) if e is not None and p)
    return own + plan.extra_tokens[index - 2]


def scored_table(job: BatchJob, spec: TableSpec) -> pa.Table:
    """The batch's rows in the documented output schema."""
    metrics = _reduce(job.rows, spec)
    cols = [_row_columns(plan, metrics.get(r), spec) for r, plan in enumerate(job.rows)]
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
