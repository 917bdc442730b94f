"""How the reports' figures read in words: wall times, rates, and the rows of the "Judge and
cost" table, shared by summary.md and summary.html.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxprec.storage.core.constants import INPUT_CAUSE
from ctxprec.storage.core.figures import counted, figure_text

__all__ = ["failure_groups", "judge_rows", "rate", "seconds"]


def seconds(value: Any) -> str:
    """Wall time for people: 0.13 s, 4.2 s, 57 s, 12 min 5 s, 2 h 3 min."""
    if value is None:
        return "—"
    v = float(value)
    if v < 1:
        return f"{v:.2f} s"
    if v < 10:
        return f"{v:.1f} s"
    if v < 120:
        return f"{v:.0f} s"
    if v < 7200:
        return f"{int(v // 60)} min {int(v % 60)} s"
    return f"{int(v // 3600)} h {int(v % 3600 // 60)} min"


def rate(value: Any) -> str:
    """A rate for people: three significant figures at most (90.9712 -> 91, 0.1234 -> 0.123)."""
    if value is None:
        return "—"
    v = float(value)
    if v >= 100:
        return f"{v:,.0f}"
    return f"{float(f'{v:.3g}'):,g}"


_ONLY_WHEN_SEEN = frozenset({"usage_unknown"})  # rows of the judge table shown when not 0


def judge_rows(s: Mapping[str, Any]) -> list[list[Any]]:
    """The rows of the "Judge and cost" table (summary.md and summary.html): the tokens and
    estimated cost (from [prices]) paid by this run and by every run of the output, beside
    what the rows' verdicts cost when they were first paid (a memo hit pays nothing now)."""
    j, t, cost, tp = s["judge"], s["tokens"], s["cost_usd"] or {}, s["throughput"]
    labels = {
        "calls": "judge calls (unique items)",
        "requests": "HTTP requests",
        "rate_limited": "429 responses",
        "reasks": "re-asks",
        "row_fallbacks": "rows judged per item after a wrong row reply",
        "usage_unknown": "replies with token counts out of range (counted as 0)",
        "adapted": "requests adapted for the run",
    }
    rows = [
        [labels.get(k, k.replace("_", " ")), v]
        for k, v in j.items()
        if not isinstance(v, dict) and (v or k not in _ONLY_WHEN_SEEN)
    ]

    def pair(kind: str, scope: str) -> str:
        t_in, t_out = t[f"{kind}_input_{scope}"], t[f"{kind}_output_{scope}"]
        return f"{figure_text(t_in)} / {figure_text(t_out)}"

    return [
        *rows,
        ["paid by this run: tokens in / out", pair("paid", "this_run")],
        ["paid by this run: cost USD", cost.get("paid_this_run")],
        ["paid by all runs of the output: tokens in / out", pair("paid", "all_runs")],
        ["paid by all runs of the output: cost USD", cost.get("paid_all_runs")],
        ["the rows' verdicts when first paid: tokens in / out", pair("verdict", "all_rows")],
        ["the rows' verdicts when first paid: cost USD", cost.get("verdicts_all_rows")],
        ["wall time", seconds(s["wall_s"])],
        ["rows/s", rate(tp["rows_per_s"])],
        ["judge calls/s", rate(tp["calls_per_s"])],
    ]


# failed rows whose input (or the user's extractor) is the problem: a re-run fails them again
_INPUT_CAUSES = (INPUT_CAUSE, "extractor_error")
# the judge answered, but nothing readable: a re-run pays for the same answers again
_UNREADABLE_CAUSES = ("unparseable", "truncated")


def failure_groups(failures: Mapping[str, int], sep: str = ": ") -> list[tuple[str, str, str]]:
    """What to do about failed rows, by kind, for the CLI, summary.md and summary.html alike:
    ("N rows failed ...", causes, advice) per kind present, each cause and its count joined by
    `sep` (the CLI's " x": "connection x60"). A re-run retries judge failures; replies the
    judge gave but ctxprec could not read are paid for again by a re-run, so something must
    change first; rows whose input is invalid fail again until the input is fixed."""
    kinds: dict[str, dict[str, int]] = {"judge": {}, "unreadable": {}, "input": {}}
    for cause, n in failures.items():
        kind = (
            "input"
            if cause in _INPUT_CAUSES
            else "unreadable"
            if cause in _UNREADABLE_CAUSES
            else "judge"
        )
        kinds[kind][cause] = n
    said = {
        "judge": ("failed", "re-run the same command to retry only them"),
        "unreadable": (
            "failed: the judge's replies held no readable verdict",
            "a re-run asks again and pays again: change the model (--model), --mode or "
            "structured outputs first (truncated: raise [judge] max_output_tokens)",
        ),
        "input": (
            "failed on their input",  # (one row: "on its input", below)
            "a re-run cannot fix them: fix the input rows (the error column says which field; "
            "extractor_error: the extractor)",
        ),
    }
    out = []
    for kind, causes in kinds.items():
        if causes:
            listed = ", ".join(f"{c}{sep}{n:,}" for c, n in causes.items())
            verb, advice = said[kind]
            n = sum(causes.values())
            verb = verb.replace("their input", "its input") if n == 1 else verb
            out.append((f"{counted(n, 'row')} {verb}", listed, advice))
    return out
