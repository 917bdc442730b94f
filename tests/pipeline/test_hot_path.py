"""The hot path's vectorized pieces equal the per-row code they replace."""

from __future__ import annotations

import random
import sys

from pipeline.reason import PY_WHITESPACE, _item_lines, item_texts


def test_whitespace_set_is_what_str_split_splits_on() -> None:
    assert PY_WHITESPACE == "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())


def test_item_texts_equal_the_per_row_item_lines() -> None:
    """Every whitespace kind, the 160-character clip at its edges, rows past 12 items."""
    rng = random.Random(1)
    alphabet = "ab é…\u200b\x00" + PY_WHITESPACE
    rows: list[int] = []
    relevant: list[bool] = []
    reasons: list[str] = []
    per_row = []
    for r in range(300):
        n = rng.choice([1, 2, 10, 12, 13, 30])
        rel = [rng.random() < 0.4 for _ in range(n)]
        why = [
            "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 5, 159, 160, 161, 400])))
            for _ in range(n)
        ]
        rows += [r] * n
        relevant += rel
        reasons += why
        per_row.append("; ".join(_item_lines(rel, why)))
    assert item_texts(rows, relevant, reasons) == per_row
