"""Names and values more than one layer agrees on, each written once."""

from __future__ import annotations

__all__ = [
    "HIVE_NULL",
    "MAX_CALL_TOKENS",
    "STATUS_EMPTY",
    "STATUS_FAILED",
    "STATUS_OK",
]

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # a null partition value in a Hive folder name

# a row's status in the scored output
STATUS_OK = "ok"
STATUS_EMPTY = "empty_context"
STATUS_FAILED = "failed"

# the error cause of a row whose input cannot be judged (null query, an item over the limit, bad
# text): a re-run fails it again until the input is fixed (every other cause a re-run retries)
INPUT_CAUSE = "invalid_input"

# the most tokens one judge call may report (input or output): far beyond any model's context
# and output; a count past it (or below 0) is not a count, and that call's usage is unknown
MAX_CALL_TOKENS = 10**9
