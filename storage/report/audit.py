"""The audit judge in the summary (summary.json's `audit`, `--audit-model`): how often the two
judges agree item by item on the audited rows (Cohen's κ with a row-bootstrap CI, McNemar's
test), how many rows and items were audited, and what each judge cost this run (calls,
tokens, USD) side by side. The corrected estimate against the audit judge is
`ctxprec.storage.report.estimate`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from ctxprec.storage.core.figures import figure_text, round_figure
from ctxprec.storage.stats.agreement import agreement_figures, row_counts

__all__ = ["audit_lines", "audit_summary"]

_RESAMPLES = 2000  # κ's bootstrap over rows


def audit_summary(
    lf: pl.LazyFrame, cols: set[str], run: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The `audit` block, or None when the output has no audit column."""
    if "audit_verdicts" not in cols:
        return None
    audit = dict(run.get("audit") or {})
    pairs = (
        lf.filter(pl.col("audit_verdicts").is_not_null() & pl.col("verdicts").is_not_null())
        .select("verdicts", "audit_verdicts")
        .collect()
    )
    counts = row_counts(list(pairs.iter_rows()))
    seed = int(audit.get("seed") or 0)
    figures = agreement_figures(counts, resamples=_RESAMPLES, seed=seed)
    audited = lf.select(
        rows=pl.col("audit_verdicts").is_not_null().sum(),
        scored=pl.col("audit_score").is_not_null().sum(),
    ).collect()
    return {
        "model": audit.get("model"),
        "fraction": audit.get("fraction"),
        "seed": audit.get("seed"),
        "rows": int(audited["rows"][0]),
        "rows_scored": int(audited["scored"][0]),  # every item judged by the audit judge
        # A = the first judge, B = the audit judge
        "agreement": {k: figures[k] for k in _AGREEMENT},
        "judges": {"judge": _judge_cost(run), "audit": _judge_cost(audit)},
    }


_AGREEMENT = ("items", "rows", "agreement", "cohen_kappa", "kappa_ci95", "kappa_ci", "table",
              "relevant_rate_a", "relevant_rate_b", "mcnemar")  # fmt: skip


def _judge_cost(run: Mapping[str, Any]) -> dict[str, Any]:
    """One judge's calls, tokens and cost this run (from run.json's figures)."""
    j = run.get("judge") or {}
    price = run.get("price") or {}
    t_in, t_out = j.get("input_tokens"), j.get("output_tokens")
    cost = None
    if None not in (t_in, t_out, price.get("input_per_mtok"), price.get("output_per_mtok")):
        cost = round_figure(
            (t_in * price["input_per_mtok"] + t_out * price["output_per_mtok"]) / 1e6
        )
    return {
        "model": run.get("model", run.get("judge_model")),
        "calls": run.get("judge_calls"),
        "memo_hits": run.get("memo_hits"),
        "input_tokens": t_in,
        "output_tokens": t_out,
        "cost_usd": cost,
    }


def audit_lines(audit: Mapping[str, Any] | None) -> list[str]:
    """The audit judge in words (the CLI's last lines, summary.md): agreement, then costs."""
    if not audit:
        return []
    a = audit["agreement"]
    kappa = "n/a" if a["cohen_kappa"] is None else figure_text(a["cohen_kappa"])
    ci = a.get("kappa_ci95")
    ci_text = f" (95 % CI {figure_text(ci[0])}–{figure_text(ci[1])})" if ci else ""
    m = a["mcnemar"]
    agree = "n/a" if a["agreement"] is None else f"{a['agreement']:.1%}"
    head = (
        f"audit: {audit['rows']:,} rows ({audit['fraction']:g} of rows, seed {audit['seed']}) "
        f"judged by {audit['model']} too: {a['items']:,} items, agreement {agree}, "
        f"kappa {kappa}{ci_text}, McNemar p {figure_text(m['p_value'])} "
        f"({m['discordant']:,} discordant, {m['method']})"
    )
    costs = "; ".join(_cost_text(name, c) for name, c in audit["judges"].items())
    return [head, f"cost this run: {costs}"]


def _cost_text(name: str, c: Mapping[str, Any]) -> str:
    tokens = (c.get("input_tokens") or 0) + (c.get("output_tokens") or 0)
    usd = "cost unknown" if c.get("cost_usd") is None else f"${c['cost_usd']:.4f}"
    calls = c.get("calls") or 0
    return f"{name} {c.get('model')}: {calls:,} calls, {tokens:,} tokens, {usd}"
