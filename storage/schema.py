"""The documented, versioned Arrow schema of scored output. The README's column table and the
schema-drift test are both checked against `output_schema`.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

__all__ = [
    "DEFAULT_KS",
    "SCHEMA_VERSION",
    "STATUS_EMPTY",
    "STATUS_FAILED",
    "STATUS_OK",
    "output_schema",
    "rank_columns",
]

SCHEMA_VERSION = "1"
STATUS_OK = "ok"
STATUS_EMPTY = "empty_context"
STATUS_FAILED = "failed"
DEFAULT_KS: tuple[int, ...] = (1, 3, 5)
_STRING = pa.string()


def rank_columns(ks: Sequence[int]) -> list[pa.Field]:
    """Rank metrics computed from the same verdicts as the MAP score (null when failed)."""
    fields = [pa.field("reciprocal_rank", pa.float64())]
    for k in ks:
        fields += [
            pa.field(f"precision_at_{k}", pa.float64()),
            pa.field(f"hit_at_{k}", pa.bool_()),
            pa.field(f"ndcg_at_{k}", pa.float64()),
        ]
    return fields


def _label_fields(labels: bool) -> list[pa.Field]:
    if not labels:
        return []
    return [pa.field("label_verdicts", pa.list_(pa.bool_())), pa.field("label_score", pa.float64())]


def output_schema(
    id_type: pa.DataType = _STRING,
    passthrough: Sequence[pa.Field] = (),
    ks: Sequence[int] = DEFAULT_KS,
    labels: bool = False,
) -> pa.Schema:
    """id, passthrough columns, then the fixed scored columns in a fixed order.

    With `labels` (a human-label column was mapped) two columns follow `verdicts`:
    `label_verdicts` (the labels as given) and `label_score` (the MAP of the labels).
    """
    fields = [
        pa.field("id", id_type, nullable=False),
        *passthrough,
        pa.field("score", pa.float64()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("verdicts", pa.list_(pa.bool_())),
        pa.field("verdict_reasons", pa.list_(pa.string())),
        *_label_fields(labels),
        pa.field("relevant_count", pa.int64()),
        pa.field("context_count", pa.int64(), nullable=False),
        *rank_columns(ks),
        pa.field("judge_model", pa.string(), nullable=False),
        pa.field("prompt_version", pa.string(), nullable=False),
        pa.field("input_tokens", pa.int64(), nullable=False),
        pa.field("output_tokens", pa.int64(), nullable=False),
        pa.field("scored_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
    return pa.schema(fields, metadata={"ctxprec.schema_version": SCHEMA_VERSION})
