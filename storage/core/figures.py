"""How every figure a person reads is rounded and written (summary.md/.json, the CLI lines,
`--quiet` JSON, gate and compare messages, charts): half up at the shown precision, like the
score itself (`metric.round_half_up`), so a mean of 0.40175 reads 0.4018 everywhere.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["FIGURE_DIGITS", "counted", "figure_text", "percent_text", "round_figure"]

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


def percent_text(share: float | None, digits: int = 1) -> str:
    """A share as a percentage by the same rule: 0.41675 -> 41.7%."""
    return "—" if share is None else f"{round_figure(share * 100, digits):.{digits}f}%"


_PLURALS = {"retry": "retries", "was": "were"}


def counted(n: int, noun: str) -> str:
    """A count with its noun in the right number: "1 row", "2 rows", "1,234 judge calls",
    "1 retry"; the last word of `noun` takes the plural."""
    if n == 1:
        return f"{n:,} {noun}"
    head, _, last = noun.rpartition(" ")
    plural = _PLURALS.get(last, last + "s")
    return f"{n:,} {head + ' ' if head else ''}{plural}"
