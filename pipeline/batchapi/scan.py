"""Phase 1 of a batch-API run (`ctxprec.batchapi.run`): which judge calls are missing, written as
batch lines into chunk files in OUTDIR (within the provider's limits), ready to be submitted.
"""

from __future__ import annotations

from ctxprec.connectors.judges import ItemRequest
from ctxprec.connectors.judges.batch.client import BatchClient, custom_id_for
from ctxprec.flow.audit import sample_plans
from ctxprec.flow.planning import ChunkPlanner, PlannedChunk
from ctxprec.flow.rows import RowPlan, attach_keys
from ctxprec.run.driver import RunPlan
from ctxprec.storage.core.constants import STATUS_OK
from ctxprec.storage.memo.store import Memo, MemoEntry, judge_prefix
from ctxprec.storage.outdir.batches import BatchStore, ChunkWriter

__all__ = ["write_missing_lines"]


def write_missing_lines(
    plan: RunPlan,
    client: BatchClient,
    store: BatchStore,
    memo: Memo | None,
    prefix: bytes,
    live: set[str],
    audit: bool = False,
) -> None:
    """Stream the input as a run does and write a batch line for every call the memo does not
    hold, no live batch already carries (`live`) and no earlier batch failed; blocking I/O.
    With `audit`, the calls of the audit judge (`prefix` its identity's): every item of the
    rows of its sample (`ctxprec.flow.audit`), the rows the online stage would audit."""
    per_row, judge, limits = plan.spec.per_row, client.judge, client.limits
    assert memo is not None
    first = judge_prefix(plan.identity) if audit else prefix
    # the audit side looks up its own keys only (the first judge's are not its concern)
    planner = ChunkPlanner(plan.cfg, first, per_row=per_row, memo=None if audit else memo,
                           skip_ids=plan.skip_ids)  # fmt: skip
    writer = ChunkWriter(store, 1, limits.max_lines, limits.max_bytes)
    skip = set(live) | set(store.failed)
    for planned in planner.planned(plan.info, skip=plan.skip_parts):
        rows, found = planned.rows, planned.found
        if audit:
            rows, found = _audit_sample(plan, planned, prefix, memo)
        for row in rows:
            if row.status != STATUS_OK:
                continue
            todo = [k for k in row.keys if k not in found and k not in skip]
            if not todo:
                continue
            assert row.query is not None
            if per_row:
                # the online path's body, its shape included
                body = judge.build_payload(row=(row.query, row.expected, row.items))
                cid = custom_id_for(row.keys)
                writer.add(cid, row.keys, client.line(cid, body))
                skip.update(row.keys)
                continue
            for key, item in zip(row.keys, row.items, strict=True):
                if key in found or key in skip:
                    continue
                skip.add(key)
                body = judge.build_payload(ItemRequest(row.query, row.expected, item))
                cid = custom_id_for([key])
                writer.add(cid, [key], client.line(cid, body))
    writer.close()


def _audit_sample(
    plan: RunPlan, planned: PlannedChunk, prefix: bytes, memo: Memo
) -> tuple[list[RowPlan], dict[str, MemoEntry]]:
    """The batch's rows in the audit sample, keyed by the audit judge's identity (`prefix`),
    and which of their keys the memo holds."""
    j = plan.cfg.judge
    ids = planned.frame.get_column("id").to_list() if planned.rows else []
    rows = [p for _, p in sample_plans(ids, planned.rows, j.audit_fraction, j.audit_seed)]
    keys = attach_keys(rows, prefix, plan.spec.per_row, j.verdict_only)
    return rows, (memo.get_many(keys) if keys else {})
