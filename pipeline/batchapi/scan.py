"""Phase 1 of a batch-API run (`pipeline.batchapi.run`): which judge calls are missing, written as
batch lines into chunk files in OUTDIR (within the provider's limits), ready to be submitted.
"""

from __future__ import annotations

from connectors.judges import ItemRequest
from connectors.judges.batch.client import BatchClient, custom_id_for
from pipeline.flow.planning import BatchPlanner
from pipeline.run.driver import RunPlan
from storage.batches import BatchStore, ChunkWriter
from storage.core.constants import STATUS_OK
from storage.memo import Memo

__all__ = ["write_missing_lines"]


def write_missing_lines(
    plan: RunPlan,
    client: BatchClient,
    store: BatchStore,
    memo: Memo | None,
    prefix: bytes,
    live: set[str],
) -> None:
    """Stream the input as a run does and write a batch line for every call the memo does not
    hold, no live batch already carries (`live`) and no earlier batch failed; blocking I/O."""
    per_row, judge, limits = plan.spec.per_row, client.judge, client.limits
    assert memo is not None
    planner = BatchPlanner(plan.cfg, prefix, per_row=per_row, memo=memo, skip_ids=plan.skip_ids)
    writer = ChunkWriter(store, 1, limits.max_lines, limits.max_bytes)
    skip = set(live) | set(store.failed)
    for planned in planner.planned(plan.info, skip=plan.skip_parts):
        rows, found = planned.rows, planned.found
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
