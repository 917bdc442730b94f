"""Names and values more than one layer agrees on, each written once."""

from __future__ import annotations

__all__ = [
    "HIVE_NULL",
    "STATUS_EMPTY",
    "STATUS_FAILED",
    "STATUS_OK",
]

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # a null partition value in a Hive folder name

# a row's status in the scored output
STATUS_OK = "ok"
STATUS_EMPTY = "empty_context"
STATUS_FAILED = "failed"
