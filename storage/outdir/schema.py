"""The documented, versioned Arrow schema of scored output. The README's column table and the
schema-drift test are both checked against `output_schema`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import polars as pl
import pyarrow as pa

from ctxprec.storage.core.metric import rank_column_names
from ctxprec.storage.core.settings import DEFAULT_KS

__all__ = [
    "OLD_TOKEN_COLUMNS",
    "SCHEMA_VERSION",
    "TOKEN_COLUMNS",
    "output_schema",
    "rank_columns",
    "token_columns",
]

# 2: the tokens in two pairs, what the run that wrote the row paid (`paid_*`) and what the
# row's verdicts cost when first paid (`verdict_*`); version 1 had one pair, the verdicts'
SCHEMA_VERSION = "2"
TOKEN_COLUMNS = (
    "paid_input_tokens",
    "paid_output_tokens",
    "verdict_input_tokens",
    "verdict_output_tokens",
)
OLD_TOKEN_COLUMNS = {
    "input_tokens": "verdict_input_tokens",
    "output_tokens": "verdict_output_tokens",
}
_STRING = pa.string()


def rank_columns(ks: Sequence[int]) -> list[pa.Field]:
    """Rank metrics computed from the same verdicts as the MAP score (null when failed)."""
    return [
        pa.field(name, pa.bool_() if name.startswith("hit_at_") else pa.float64())
        for name in rank_column_names(ks)
    ]


def _label_fields(labels: bool) -> list[pa.Field]:
    if not labels:
        return []
    return [pa.field("label_verdicts", pa.list_(pa.bool_())), pa.field("label_score", pa.float64())]


def _audit_fields(audit: bool) -> list[pa.Field]:
    if not audit:
        return []
    return [pa.field("audit_verdicts", pa.list_(pa.bool_())), pa.field("audit_score", pa.float64())]


def output_schema(
    id_type: pa.DataType = _STRING,
    passthrough: Sequence[pa.Field] = (),
    ks: Sequence[int] = DEFAULT_KS,
    labels: bool = False,
    audit: bool = False,
) -> pa.Schema:
    """id, passthrough columns, then the fixed scored columns in a fixed order.

    With `labels` (a human-label column was mapped) two columns follow `verdicts`:
    `label_verdicts` (the labels as given) and `label_score` (the MAP of the labels). With
    `audit` (`--audit-model`) two more follow them: `audit_verdicts` (the audit judge's
    verdicts, null on rows outside the audit sample) and `audit_score` (their MAP).
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
        *_audit_fields(audit),
        pa.field("relevant_count", pa.int64()),
        pa.field("context_count", pa.int64(), nullable=False),
        *rank_columns(ks),
        pa.field("judge_model", pa.string(), nullable=False),
        pa.field("prompt_version", pa.string(), nullable=False),
        *(pa.field(name, pa.int64(), nullable=False) for name in TOKEN_COLUMNS),
        pa.field("scored_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
    return pa.schema(fields, metadata={"ctxprec.schema_version": SCHEMA_VERSION})


def token_columns(names: Collection[str]) -> list[pl.Expr]:
    """The four token columns of a scan of part files of any schema version, named as version 2
    names them: version 1's `input_tokens`/`output_tokens` are the verdicts' figures, and what
    the run that wrote a row paid was not recorded then (null: unknown, never 0)."""
    exprs = []
    for name in TOKEN_COLUMNS:
        if name in names:
            exprs.append(pl.col(name).cast(pl.Int64))
            continue
        old = [o for o, new in OLD_TOKEN_COLUMNS.items() if new == name and o in names]
        source = pl.col(old[0]) if old else pl.lit(None)
        exprs.append(source.cast(pl.Int64).alias(name))
    return exprs
