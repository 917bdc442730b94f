"""How every figure a person reads is rounded and written (summary.md/.json, the CLI lines,
`--quiet` JSON, gate and compare messages, charts): half up at the shown precision, like the
score itself (`metric.round_half_up`), so a mean of 0.40175 reads 0.4018 everywhere.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "FIGURE_DIGITS",
    "counted",
    "figure_text",
    "percent_text",
    "round_figure",
    "share_figure",
]

FIGURE_DIGITS = 4  # decimals of every mean, quantile, rate and delta shown
_NOISE_DIGITS = 6  # float noise below this (in units of the last shown digit) is not a half


def round_figure(value: float, digits: int = FIGURE_DIGITS) -> float:
    """`value` rounded half up at `digits` decimals; a negative value rounds like its magnitude
    (-0.40175 -> -0.4018), so a change and its opposite read alike. Float noise from sums is
    absorbed first: 0.40174999999999994 (a mean of two-decimal scores) is the half 0.40175."""
    scaled = round(abs(value) * 10**digits, _NOISE_DIGITS)
    rounded = math.floor(scaled + 0.5) / 10**digits
    return math.copysign(rounded, value) if rounded else 0.0


def figure_text(value: Any, digits: int = FIGURE_DIGITS, missing: str = "—") -> str:
    """A figure for people: integers with thousands separators, floats by `round_figure`
    without trailing zeros (0.5, 0.4018, 1,234.5); None or not finite gives `missing`."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    text = f"{round_figure(value, digits):,.{digits}f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


_EDGE_DIGITS = 3  # more decimals a share near 0 % or 100 % may take before it is bounded


def share_figure(share: float, digits: int = FIGURE_DIGITS) -> float:
    """A share (0..1) rounded as every figure, except that one that is not whole never rounds
    to 1 (nor one above none to 0): it keeps the decimals it needs (coverage 0.99999, not 1.0,
    when one row of 100,000 failed)."""
    for d in range(digits, digits + 2 * _EDGE_DIGITS + 1):
        shown = round_figure(share, d)
        if not ((shown >= 1 and share < 1) or (shown <= 0 < share)):
            return shown
    return share


def percent_text(share: float | None, digits: int = 1) -> str:
    """A share as a percentage by the same rule: 0.41675 -> 41.7%. A share that is not whole
    never reads 100% (2 failed rows of 19,998: 99.99%, not 100.0%), nor a share above none 0%:
    it takes the decimals it needs (up to 3 more), then reads as a bound (>99.9999%)."""
    if share is None:
        return "—"
    for d in range(digits, digits + _EDGE_DIGITS + 1):
        shown = round_figure(share * 100, d)
        if not ((shown >= 100 and share < 1) or (shown <= 0 < share)):
            return f"{shown:.{d}f}%"
    last = digits + _EDGE_DIGITS
    if share < 1 and share > 0.5:
        return f">{100 - 10**-last:.{last}f}%"
    return f"<{10**-last:.{last}f}%"


_PLURALS = {"retry": "retries", "was": "were"}


def counted(n: int, noun: str) -> str:
    """A count with its noun in the right number: "1 row", "2 rows", "1,234 judge calls",
    "1 retry"; the last word of `noun` takes the plural."""
    if n == 1:
        return f"{n:,} {noun}"
    head, _, last = noun.rpartition(" ")
    plural = _PLURALS.get(last, last + "s")
    return f"{n:,} {head + ' ' if head else ''}{plural}"
