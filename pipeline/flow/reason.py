"""The human-readable reason of one row, built from its verdicts (no extra LLM call): which items
were relevant, how their positions moved the MAP, the best achievable score, and the criterion.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import polars as pl

from ctxprec.storage.core.metric import map_score, round_half_up

__all__ = ["VERDICT_ONLY_NOTE", "build_reason", "failed_reason", "item_texts", "item_texts_lazy"]

# where the judge's per-item reasons would be, in a verdict-only run (`[judge] verdict_only`)
VERDICT_ONLY_NOTE = "(verdict-only: no per-item reasons)"

_MAX_REASON_CHARS = 160
_MAX_LISTED = 12
# What str.split() splits on (str.isspace), for the vectorized `_short` of `item_texts`
PY_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_ANY_SPACE = "".join(f"\\x{{{ord(c):X}}}" for c in PY_WHITESPACE)
_NOT_PLAIN = "".join(f"\\x{{{ord(c):X}}}" for c in PY_WHITESPACE if c != " ")
# What `" ".join(text.split())` changes inside a text: a run of two or more whitespace
# characters, or one that is not a plain space (a single plain space stays as it is, so text
# that needs nothing costs the scan only, not one replacement per space)
_SPACE_FIX = f"[{_ANY_SPACE}]{{2,}}|[{_NOT_PLAIN}]"


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


def _item_lines(
    relevant: Sequence[bool], reasons: Sequence[str], verdict_only: bool = False
) -> list[str]:
    lines = []
    whys = [""] * len(relevant) if verdict_only else reasons
    for i, (rel, why) in enumerate(zip(relevant, whys, strict=True)):
        if i == _MAX_LISTED:
            lines.append(f"… and {len(relevant) - _MAX_LISTED} more items")
            break
        verdict = "relevant" if rel else "not relevant"
        lines.append(
            f"#{i + 1} {verdict}" if verdict_only else f"#{i + 1} {verdict}: {_short(why)}"
        )
    if verdict_only:
        lines[-1] += f" {VERDICT_ONLY_NOTE}"
    return lines


def _clause_expr(text: pl.Expr) -> pl.Expr:
    """`_clause` in Polars: whitespace runs to one space, no closing punctuation."""
    return text.str.replace_all(_SPACE_FIX, " ").str.strip_chars(" ").str.strip_chars_end(" .;,:")


def item_texts(
    row: Sequence[int] | pl.Series,
    relevant: Sequence[bool],
    reasons: Sequence[str],
    *,
    sentence: bool = False,
    verdict_only: bool = False,
) -> list[str]:
    """The "#1 relevant: why; #2 ..." part of `build_reason` for many rows at once (flat items,
    ordered by row then position; `row` numbers the rows 0, 1, ... as they come), in Polars
    instead of one Python string operation per item. Equal to `"; ".join(_item_lines(...))`;
    with `sentence`, to `_sentence("Items: " + that)`, as `build_reason` writes it."""
    items = pl.DataFrame(
        {"row": row, "rel": relevant, "why": reasons},
        schema={"row": pl.Int64, "rel": pl.Boolean, "why": pl.String},
    )
    query = item_texts_lazy(items.lazy(), sentence=sentence, verdict_only=verdict_only)
    return query.collect().to_series().to_list()


def item_texts_lazy(
    items: pl.LazyFrame, *, sentence: bool = False, verdict_only: bool = False
) -> pl.LazyFrame:
    """`item_texts` as a query over the flat items (`row`, `rel`, `why`, and `pos`, each item's
    0-based position in its row, when the caller has it): one column, `text`, a row each.
    `verdict_only`: the verdicts alone, then `VERDICT_ONLY_NOTE` (the reasons are not read)."""
    items = items.with_columns(why=_clause_expr(pl.col("why")))
    why = pl.col("why")
    short = (
        pl.when(why.str.len_chars() <= _MAX_REASON_CHARS)
        .then(why)
        .otherwise(why.str.slice(0, _MAX_REASON_CHARS - 1) + pl.lit("…"))
    )
    if "pos" not in items.collect_schema():
        items = items.with_columns(pos=pl.int_range(pl.len()).over("row"))
    verdict = pl.when(pl.col("rel")).then(pl.lit("relevant")).otherwise(pl.lit("not relevant"))
    if verdict_only:
        line = pl.format("#{} {}", pl.col("pos") + 1, verdict)
    else:
        line = pl.format("#{} {}: {}", pl.col("pos") + 1, verdict, short)
    grouped = (
        items.group_by("row", maintain_order=True)
        .agg(line.filter(pl.col("pos") < _MAX_LISTED).str.join("; ").alias("text"), pl.len())
        .select(
            pl.when(pl.col("len") > _MAX_LISTED)
            .then(pl.format("{}; … and {} more items", "text", pl.col("len") - _MAX_LISTED))
            .otherwise(pl.col("text"))
            .alias("text")
        )
    )
    if verdict_only:
        grouped = grouped.select(
            pl.format("{} {}", "text", pl.lit(VERDICT_ONLY_NOTE)).alias("text")
        )
    if sentence:
        # `_clause` of the joined text: its parts are clauses already (no whitespace runs, no
        # whitespace but plain spaces, none leading), so only its end needs stripping
        clause = (pl.lit("Items: ") + pl.col("text")).str.strip_chars_end(" .;,:")
        closed = clause.str.ends_with("?") | clause.str.ends_with("!") | clause.str.ends_with("…")
        grouped = grouped.select(
            pl.when(closed).then(clause).otherwise(clause + pl.lit(".")).alias("text")
        )
    return grouped


def build_reason(
    relevant: Sequence[bool],
    reasons: Sequence[str],
    *,
    score: float,
    scale: float,
    criterion: str,
    items_sentence: str | None = None,
    verdict_only: bool = False,
) -> str:
    """Explain a scored row. Positions are given 1-based (#1 is the first retrieved item).
    `items_sentence`: the row's `item_texts(..., sentence=True)` entry when the caller built
    them for a whole batch."""
    n, r = len(relevant), sum(relevant)
    if n == 0:
        return f"Score {score:g}: the context list is empty, so no item could be judged."
    head = f"Score {score:g} (scale {scale:g}): {r} of {n} context items judged relevant."
    items = items_sentence
    if items is None:
        items = _sentence("Items: " + "; ".join(_item_lines(relevant, reasons, verdict_only)))
    ranking = _ranking(tuple(map(bool, relevant)), score, scale)
    return f"{head} {items} {ranking} Criterion: {_criterion(criterion)}"


@lru_cache(maxsize=64)
def _criterion(criterion: str) -> str:
    return _sentence(criterion)


@lru_cache(maxsize=8192)
def _ranking(relevant: tuple[bool, ...], score: float, scale: float) -> str:
    """How the positions of the relevant items made the score: a function of the verdict
    pattern alone (10 items have 1,024 patterns), so it is built once per pattern."""
    n, r = len(relevant), sum(relevant)
    if r == 0:
        return "No item is relevant, so the mean average precision is 0."
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
    return ranking


def failed_reason(n_items: int, failed_positions: Sequence[int], error: str) -> str:
    shown = ", ".join(f"#{p + 1}" for p in failed_positions[:_MAX_LISTED])
    return (
        f"Not scored: {len(failed_positions)} of {n_items} items could not be judged ({shown}). "
        f"{_sentence(error)} Re-run the same command to retry only the missing verdicts."
    )
