"""A batch's rows before any judge call: row-level checks (a bad row gets its status here and
never reaches the judge), the context items of each row (from its column or the user's
extractor) and each item's memo key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ctxprec.connectors.judges.prompts import prompt_version_for
from ctxprec.connectors.sources import INPUT_ERROR
from ctxprec.flow.dispatch import ItemOutcome
from ctxprec.flow.extractor import Extractor
from ctxprec.storage.core.constants import INPUT_CAUSE, STATUS_EMPTY, STATUS_FAILED, STATUS_OK
from ctxprec.storage.memo.store import MemoEntry, item_keys, row_hasher

__all__ = ["ChunkJob", "RowPlan", "attach_keys", "plan_rows"]


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
    # per item, what this row holds of its tokens: 0, CARRIED (the verdict's cost when first
    # paid) or PAID (and this run paid it): `ctxprec.flow.dispatch`
    paid: list[int] = field(default_factory=list)
    # --mode row: the row's call also judged items whose verdicts came from elsewhere; their
    # share of the call's tokens is carried here (the verdicts stay those already known)
    extra: list[ItemOutcome] = field(default_factory=list)
    extra_tokens: tuple[int, int] = (0, 0)
    waits: list[tuple[int, ItemOutcome]] = field(default_factory=list)
    # a row failed on input keeps no items, but it had this many (its context_count)
    given: int | None = None


@dataclass(slots=True)
class ChunkJob:
    """One input batch: the key of its part, its rows as read, and their plans."""

    key: str
    frame: pl.DataFrame
    rows: list[RowPlan]
    # --audit-model: per row, the audit judge's verdicts (None: not in the audit sample)
    audit: list[list[bool | None] | None] | None = None


def _check_items(items: Any, max_chars: int) -> str | None:
    if (  # the usual case, checked in C: a list of strings, none too long
        type(items) is list
        and {*map(type, items)} <= {str}
        and max(map(len, items), default=0) <= max_chars
    ):
        return None
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


def _given(context: Any) -> int:
    """How many items a row's context holds, whatever they are (0 when it is no list)."""
    return len(context) if isinstance(context, list | tuple) else 0


def _plan_row(query: Any, expected: Any, context: Any, max_chars: int) -> RowPlan:
    if query is None or not isinstance(query, str):
        error = f"{INPUT_CAUSE}: query is null"
        return RowPlan(None, None, [], STATUS_FAILED, error, given=_given(context))
    exp = expected if isinstance(expected, str) else None
    if context is None:
        return RowPlan(query, exp, [], STATUS_EMPTY, None)
    problem = _check_items(context, max_chars)
    if problem is not None:
        error = f"{INPUT_CAUSE}: {problem}"
        return RowPlan(query, exp, [], STATUS_FAILED, error, given=_given(context))
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
            plans.append(RowPlan(None, None, [], STATUS_FAILED, problem, given=_given(context)))
        elif isinstance(context, _ExtractorFailure):
            plans.append(RowPlan(query, None, [], STATUS_FAILED, context.message))
        else:
            plans.append(_plan_row(query, expected, context, max_chars))
    return plans


def attach_keys(
    plans: Sequence[RowPlan], prefix: bytes, per_row: bool, verdict_only: bool = False
) -> list[str]:
    """Compute every item's memo key; returns all keys of the batch (for one memo lookup)."""
    every: list[str] = []
    for plan in plans:
        if plan.status != STATUS_OK:
            continue
        version = prompt_version_for(plan.expected, per_row, verdict_only)
        assert plan.query is not None
        plan.keys = item_keys(row_hasher(prefix, version, plan.query, plan.expected), plan.items)
        plan.entries = [None] * len(plan.items)
        plan.paid = [0] * len(plan.items)
        every.extend(plan.keys)
    return every
