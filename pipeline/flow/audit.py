"""The audit judge of a batch (`--audit-model`, `--audit-fraction`): a second judge
that also judges every item of a seeded sample of whole rows, through its own dispatcher and
the same memo (its keys carry its own identity, so its verdicts are entries of their own). The
sample is a hash of the row id and `--audit-seed` below the fraction: the same rows on a re-run,
a resumed run and on any engine, and an `--incremental` night audits only its own new rows.

The audit verdicts become the output's `audit_verdicts` and `audit_score` columns (null on rows
not sampled); the summary's corrected estimate takes `audit_score` as its reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from ctxprec.flow.dispatch import Dispatcher, RunCounters
from ctxprec.flow.fanout import resolve_items
from ctxprec.flow.rows import RowPlan, attach_keys
from ctxprec.storage.core.constants import STATUS_EMPTY, STATUS_OK
from ctxprec.storage.memo.store import RELEVANT, MemoStore
from ctxprec.storage.stats.sample import in_sample

__all__ = ["AuditSide", "AuditVerdicts", "audited", "audited_rows", "sample_plans"]

# one row's audit verdicts: None when the row is not in the sample (or could not be judged at
# all: a bad row), else a verdict per item (None where the audit call failed)
AuditVerdicts = list[bool | None] | None


def audited(row_id: Any, fraction: float, seed: int) -> bool:
    """Whether the row with id `row_id` is in the seeded audit sample of `fraction` of rows."""
    return in_sample(f"audit:{seed}:{row_id}", fraction)


def audited_rows(
    ids: Sequence[Any], plans: Sequence[RowPlan], fraction: float, seed: int
) -> list[int]:
    """The positions of the batch's sampled rows the audit judge can judge (ok or empty)."""
    return [
        i
        for i, (row_id, plan) in enumerate(zip(ids, plans, strict=True))
        if plan.status in (STATUS_OK, STATUS_EMPTY) and audited(row_id, fraction, seed)
    ]


def sample_plans(
    ids: Sequence[Any], plans: Sequence[RowPlan], fraction: float, seed: int
) -> list[tuple[int, RowPlan]]:
    """The sampled rows' own plans (copies, without keys yet) with their positions: what the
    audit judge judges of a batch, online (`AuditSide.plan`) or through batches."""
    picked = audited_rows(ids, plans, fraction, seed)
    return [(i, RowPlan(plans[i].query, plans[i].expected, list(plans[i].items),
                        plans[i].status)) for i in picked]  # fmt: skip


class _RowCount(Protocol):
    rows: int


@dataclass
class AuditSide:
    """The audit judge's side of a stage: its dispatcher (own counters and stats) and memo
    prefix, and the sample's fraction and seed."""

    dispatcher: Dispatcher
    prefix: bytes
    fraction: float
    seed: int
    per_row: bool
    verdict_only: bool
    memo: MemoStore | None
    on_rows: _RowCount | None = None  # where the sampled rows are counted

    @property
    def counters(self) -> RunCounters:
        return self.dispatcher.counters

    def plan(self, ids: Sequence[Any], plans: Sequence[RowPlan]) -> list[tuple[int, RowPlan]]:
        """The sampled rows' own plans (copies, keyed by the audit judge's identity), before the
        first judge resolves the batch: its failures do not change what is audited."""
        return sample_plans(ids, plans, self.fraction, self.seed)

    async def resolve(self, n_rows: int, picked: list[tuple[int, RowPlan]]) -> list[AuditVerdicts]:
        """Judge the sampled rows (memo first) and give each row of the batch its verdicts."""
        out: list[AuditVerdicts] = [None] * n_rows
        if not picked:
            return out
        if self.on_rows is not None:
            self.on_rows.rows += len(picked)
        plans = [p for _, p in picked]
        keys = attach_keys(plans, self.prefix, self.per_row, self.verdict_only)
        memo = self.memo
        found = await anyio.to_thread.run_sync(memo.get_many, keys) if memo and keys else {}
        await resolve_items(plans, found, self.dispatcher, self.per_row)
        for i, plan in picked:
            out[i] = [None if e is None else bool(e[RELEVANT]) for e in plan.entries]
        return out
