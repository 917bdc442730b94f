"""The human-readable reason of one row, built from its verdicts (no extra LLM call): which items
were relevant, how their positions moved the MAP, the best achievable score, and the criterion.
"""

from __future__ import annotations

from collections.abc import Sequence

from storage.core.metric import map_score, round_half_up

__all__ = ["build_reason", "failed_reason"]

_MAX_REASON_CHARS = 160
_MAX_LISTED = 12


def _short(text: str) -> str:
    text = _clause(text)
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 1] + "…"


def _clause(text: str) -> str:
    """Text without its closing punctuation, for a sentence that adds its own ("..", ".;")."""
    return " ".join(text.split()).rstrip(" .;,:")


def _sentence(text: str) -> str:
    """Text closed by one full stop, or by its own ?, ! or … (a cut item reason)."""
    text = _clause(text)
    return text if text.endswith(("?", "!", "…")) else text + "."


def _fmt(x: float) -> str:
    return f"{round_half_up(x):.2f}"


def _precision_steps(relevant: Sequence[bool]) -> list[tuple[int, int, float]]:
    """(position, relevant so far, precision) at each relevant position."""
    steps, hits = [], 0
    for i, rel in enumerate(relevant):
        if rel:
            hits += 1
            steps.append((i, hits, hits / (i + 1)))
    return steps


def _item_lines(relevant: Sequence[bool], reasons: Sequence[str]) -> list[str]:
    lines = []
    for i, (rel, why) in enumerate(zip(relevant, reasons, strict=True)):
        if i == _MAX_LISTED:
            lines.append(f"… and {len(relevant) - _MAX_LISTED} more items")
            break
        lines.append(f"#{i + 1} {'relevant' if rel else 'not relevant'}: {_short(why)}")
    return lines


def build_reason(
    relevant: Sequence[bool], reasons: Sequence[str], *, score: float, scale: float, criterion: str
) -> str:
    """Explain a scored row. Positions are given 1-based (#1 is the first retrieved item)."""
    n, r = len(relevant), sum(relevant)
    if n == 0:
        return f"Score {score:g}: the context list is empty, so no item could be judged."
    head = f"Score {score:g} (scale {scale:g}): {r} of {n} context items judged relevant."
    items = _sentence("Items: " + "; ".join(_item_lines(relevant, reasons)))
    if r == 0:
        ranking = "No item is relevant, so the mean average precision is 0."
    else:
        steps = _precision_steps(relevant)
        shown = ", ".join(f"#{i + 1}: {h}/{i + 1} = {_fmt(p)}" for i, h, p in steps[:_MAX_LISTED])
        terms = " + ".join(_fmt(p) for _, _, p in steps[:_MAX_LISTED])
        if r > _MAX_LISTED:
            shown, terms = shown + ", …", terms + " + …"
        ranking = (
            f"Precision at each relevant position: {shown}; "
            f"MAP = ({terms}) / {r} = {_fmt(sum(p for _, _, p in steps) / r)}."
        )
        best = map_score([True] * r + [False] * (n - r), scale)
        if best > score:
            late = [f"#{i + 1}" for i, rel in enumerate(relevant) if rel and i >= r]
            ranking += (
                f" With the relevant items ranked first the score would be {best:g}; "
                f"relevant item(s) {', '.join(late[:_MAX_LISTED])} rank below irrelevant ones."
            )
        else:
            ranking += " The relevant items already come first: the ranking is ideal."
    return f"{head} {items} {ranking} Criterion: {_sentence(criterion)}"


def failed_reason(n_items: int, failed_positions: Sequence[int], error: str) -> str:
    shown = ", ".join(f"#{p + 1}" for p in failed_positions[:_MAX_LISTED])
    return (
        f"Not scored: {len(failed_positions)} of {n_items} items could not be judged ({shown}). "
        f"{_sentence(error)} Re-run the same command to retry only the missing verdicts."
    )
