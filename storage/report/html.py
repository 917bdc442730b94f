"""summary.html: the run summary as one self-contained page people open from disk, a bucket or
a message: the headline, scores and bands, relevance by position, groups, the worst rows and a
sample opening to their items, labels, estimate against actual, the runs and the nights. Every
figure is summary.json's, written by the same rules as summary.md (`ctxprec.storage.core.figures`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctxprec.storage.core.figures import counted, figure_text, percent_text
from ctxprec.storage.report.estimate import estimate_sentence
from ctxprec.storage.report.page import card, e, page, row_details, section, table
from ctxprec.storage.report.page import stats as stats_grid
from ctxprec.storage.report.svg import distribution_chart, position_chart, trend_chart
from ctxprec.storage.report.trend import trend_rows
from ctxprec.storage.report.words import failure_groups, judge_rows, seconds

__all__ = ["render_html"]

_BAND_TEXT = {
    "excellent": ("0.9 – 1.0", "relevant context comes first"),
    "good": ("0.7 – <0.9", "most relevant items are well placed"),
    "medium": ("0.4 – <0.7", "relevant items are mixed with irrelevant ones"),
    "low": (">0 – <0.4", "relevant context is rare or badly placed"),
    "none": ("0", "no relevant context found"),
}


def _f(value: Any) -> str:
    return e(figure_text(value))


def _share(part: int | None, whole: int, stored: float | None) -> str:
    """As summary.md: rounded once from the counts."""
    if part is None or not whole:
        return percent_text(stored)
    return percent_text(part / whole)


def render_html(summary: Mapping[str, Any], rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """The page: `summary` is summary.json's dict, `rows` what `report_rows` chose."""
    body = [
        *_intro(summary),
        _headline(summary),
        *_notes(summary),
        _scores(summary),
        _positions(summary),
        _groups(summary),
        _rows(rows),
        _labels(summary),
        _judge(summary),
        _estimate_vs_actual(summary),
        _history(summary),
        _trend(summary),
        "<footer>Written by ctxprec with every figure of summary.json (same rounding as "
        "summary.md). This page loads nothing and runs no script.</footer>",
    ]
    return page("ctxprec run summary", [b for b in body if b])


def _intro(s: Mapping[str, Any]) -> list[str]:
    run = s["run"]
    bits = []
    if run.get("input"):
        bits.append(f"input <code>{e(run['input'])}</code>")
    if s["judge"].get("model"):
        bits.append(f"judge <code>{e(s['judge']['model'])}</code>")
    if s["judge"].get("prompt_version"):
        bits.append(f"prompt {e(s['judge']['prompt_version'])}")
    if run.get("finished_at"):
        bits.append(f"finished {e(str(run['finished_at'])[:19].replace('T', ' '))} UTC")
    return ["<h1>ctxprec run summary</h1>", f'<p class="muted">{" · ".join(bits)}</p>']


def _headline(s: Mapping[str, Any]) -> str:
    rows, score, cost = s["rows"], s["score"], s["cost_usd"] or {}
    scored = rows["ok"] + rows["empty_context"]
    ci = s.get("score_ci95")
    ci_text = f"95 % CI {_f(ci['low'])}–{_f(ci['high'])}" if ci else "no CI (fewer than 2 rows)"
    status = (
        f"{_f(rows['ok'])} ok · {_f(rows['empty_context'])} empty · {_f(rows['failed'])} failed"
    )
    cards = [
        card("rows", _f(rows["total"]), status, "rows"),
        card("mean score", _f(score["mean"]), ci_text, "mean"),
    ]
    if est := s.get("estimate"):
        ci = est.get("ci95")
        sub = f"95 % CI {_f(ci[0])}–{_f(ci[1])}" if ci else "too few labels for a CI"
        sub += f" · {e(counted(est['n_reference'], 'labelled row'))}"
        cards.append(card("corrected estimate", _f(est["mean"]), sub, "estimate"))
    cards += [
        card("median", _f(score["median"]), f"p10 {_f(score['p10'])} · p90 {_f(score['p90'])}"),
        card(
            "coverage", e(_share(scored, rows["total"], s["coverage"])), "rows scored", "coverage"
        ),
        _calls_card(s),
        card(
            "cost USD paid",
            _f(cost.get("paid_all_runs")) if cost else "—",
            (
                f"this run paid {_f(cost.get('paid_this_run'))} · the rows' verdicts cost "
                f"{_f(cost.get('verdicts_all_rows'))} when first paid"
            )
            if cost
            else "no [prices] given",
            "cost",
        ),
        _wall_card(s),
    ]
    return f'<div class="cards">{"".join(cards)}</div>'


def _runs_total(s: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The history's totals when several runs wrote the output: the headline is the output's,
    and what the last run did is said beneath (a re-run that found nothing new to score is not
    the night)."""
    total = (s.get("history") or {}).get("total")
    return total if total and total["runs"] > 1 else None


def _last_run(s: Mapping[str, Any]) -> str:
    run = s["run"]
    if not run.get("rows_this_run") and s["rows"]["total"]:
        return f"the last run found nothing new to score ({e(seconds(s['wall_s']))})"
    return f"this run: {_f(run.get('rows_this_run'))} rows in {e(seconds(s['wall_s']))}"


def _calls_card(s: Mapping[str, Any]) -> str:
    j, total = s["judge"], _runs_total(s)
    if total is None:
        return card("judge calls", _f(j.get("calls")), f"{_f(j.get('memo_hits'))} memo hits",
                    "calls")  # fmt: skip
    sub = (f"{_f(total['runs'])} runs, {_f(total['memo_hits'])} memo hits · this run "
           f"{_f(j.get('calls'))} calls, {_f(j.get('memo_hits'))} memo hits")  # fmt: skip
    return card("judge calls, all runs", _f(total["judge_calls"]), sub, "calls")


def _wall_card(s: Mapping[str, Any]) -> str:
    total = _runs_total(s)
    if total is None:
        return card("wall time", e(seconds(s["wall_s"])), _last_run(s), "wall")
    sub = f"{_f(total['runs'])} runs · {_last_run(s)}"
    return card("wall time, all runs", e(seconds(total["wall_s"])), sub, "wall")


def _notes(s: Mapping[str, Any]) -> list[str]:
    out = [f'<p class="note">{e(n)}</p>' for n in s["run"].get("notices") or []]
    for rows_failed, causes, advice in failure_groups(s["failures"]):  # as the CLI says it
        out.append(f'<p class="note bad">{e(rows_failed)} ({e(causes)}) — {e(advice)}.</p>')
    if sentence := estimate_sentence(s.get("estimate")):
        out.append(
            f"<p><b>Corrected estimate</b> (prediction-powered, reference: human labels): "
            f"{e(sentence)}.</p>"
        )
    return out


def _band_of(summary: Mapping[str, Any]) -> Any:
    def band(normalized: float) -> str:
        for b in summary["bands"]:
            if b["upper"] > b["lower"] and normalized + 1e-9 >= b["lower"]:
                return str(b["band"])
        return "low"

    return band


def _scores(s: Mapping[str, Any]) -> str:
    stats, scale = s["score"], s["scale"]
    scored = s["rows"]["ok"] + s["rows"]["empty_context"]
    stat_table = stats_grid(stats)
    bands = [
        [
            ("html", f'<span class="band {e(b["band"])}"></span>{e(b["band"])}'),
            *_BAND_TEXT[b["band"]],
            b["rows"],
            _share(b["rows"], scored, b["share"]),
        ]
        for b in s["bands"]
    ]
    head = ["band", "score" if scale == 1 else f"score / {scale:g}", "meaning", "rows", "share"]
    chart = distribution_chart(s, _band_of(s)) or ""
    return section(
        f"Score (0 to {scale:g})",
        stat_table,
        chart,
        "<h3>Score bands</h3>",
        table(head, bands, numeric=(3, 4)),
        anchor="score",
    )


def _positions(s: Mapping[str, Any]) -> str:
    positions = s["relevance_by_position"]
    rows = [
        [f"#{p['position']}", p["items"], _share(p.get("relevant"), p["items"], p["relevant_rate"])]
        for p in positions[:30]
    ]
    rank = table(["metric", "mean"], [*s["rank_metrics"].items()], numeric=(1,))
    return (
        section(
            "Relevance by position",
            position_chart(positions) or "",
            f"<details><summary>as a table</summary>"
            f"{table(['position', 'items', 'relevant rate'], rows, numeric=(1, 2))}</details>",
            "<h3>Rank metrics (mean)</h3>" + rank if rank else "",
            anchor="positions",
        )
        if positions
        else ""
    )


def _groups(s: Mapping[str, Any]) -> str:
    g = s.get("by_group")
    if not g:
        return ""
    if not g["groups"]:
        return section(f"By {g['column']}", f"<p>{e(g.get('note') or 'no groups')}</p>")
    span = s["scale"] if s["scale"] > 0 else 1.0
    rows = []
    for x in g["groups"]:
        width = 0.0 if x["mean_score"] is None else 100 * x["mean_score"] / span
        bar = f'<span class="bar" style="width:{width:.0f}px"></span> {_f(x["mean_score"])}'
        rows.append(
            [
                x["group"] if x["group"] is not None else "(null)",
                x["rows"],
                x["failed"],
                ("html", bar),
                x["median"],
                x["p25"],
                x["p75"],
            ]
        )
    more = (
        (
            f'<p class="muted">{_f(g["groups_total"])} groups; the largest '
            f"{_f(len(g['groups']))} shown.</p>"
        )
        if g["groups_total"] > len(g["groups"])
        else ""
    )
    head = [str(g["column"]), "rows", "failed", "mean score", "median", "p25", "p75"]
    return section(
        f"By {g['column']}", table(head, rows, numeric=(1, 2, 4, 5, 6)), more, anchor="groups"
    )


def _rows(rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    parts = []
    worst, failed, sample = (
        rows.get("worst") or [],
        rows.get("failed") or [],
        rows.get("sample") or [],
    )
    if worst:
        parts.append(
            f"<h3>The {len(worst)} lowest-scored rows</h3>" + "".join(row_details(r) for r in worst)
        )
    if failed:
        parts.append(
            f"<h3>Failed rows ({len(failed)} shown)</h3>" + "".join(row_details(r) for r in failed)
        )
    if sample:
        parts.append(
            f"<h3>A sample of {len(sample)} other rows</h3>"
            + "".join(row_details(r) for r in sample)
        )
    if not parts:
        return ""
    lead = (
        '<p class="muted">Each row opens to its ranked items: the verdict, the judge\'s '
        "reason and what each relevant item added to the row's average precision.</p>"
    )
    return section("Rows", lead, *parts, anchor="rows")


def _labels(s: Mapping[str, Any]) -> str:
    labels = s.get("labels")
    if not labels:
        return ""
    return section(
        "Agreement with human labels",
        table(["figure", "value"], [*labels.items()], numeric=(1,)),
        anchor="labels",
    )


def _judge(s: Mapping[str, Any]) -> str:
    return section(
        "Judge and cost", table(["figure", "value"], judge_rows(s), numeric=(1,)), anchor="judge"
    )


def _estimate_vs_actual(s: Mapping[str, Any]) -> str:
    est = s.get("estimate_vs_actual")
    if not est:
        return ""
    rows = [[k, v["estimate"], v["actual"], v["ratio"]] for k, v in est.items()]
    return section(
        "Estimate vs actual",
        table(["figure", "estimate", "actual", "ratio"], rows, numeric=(1, 2, 3)),
        anchor="estimate-vs-actual",
    )


def _history(s: Mapping[str, Any]) -> str:
    history = s.get("history")
    if not history or not history["runs"]:
        return ""
    head = [
        "run",
        "finished (UTC)",
        "rows scored",
        "judge calls",
        "memo hits",
        "tokens paid in / out",
        "paid USD",
        "wall time",
        "rows/s",
    ]

    def line(label: Any, r: Mapping[str, Any], when: str) -> list[Any]:
        return [
            label,
            when,
            r["rows_this_run"],
            r["judge_calls"],
            r["memo_hits"],
            f"{_f(r['paid_input_tokens'])} / {_f(r['paid_output_tokens'])}",
            r["paid_cost_usd"],
            seconds(r["wall_s"]),
            r.get("rows_per_s"),
        ]

    rows = [
        line(str(i), r, str(r["finished_at"] or "—")[:19].replace("T", " "))
        for i, r in enumerate(history["runs"], 1)
    ]
    if len(rows) > 1:
        rows.append(line("all", history["total"], ""))
    return section(
        "Runs of this output", table(head, rows, numeric=(2, 3, 4, 5, 6, 7, 8)), anchor="runs"
    )


def _trend(s: Mapping[str, Any]) -> str:
    trend = s.get("trend")
    if not trend or len(trend["nights"]) < 2:
        return ""
    head = [
        "night",
        "rows",
        "mean score",
        "95% CI",
        "P@1",
        "coverage",
        "items judged",
        "tokens paid in / out",
        "paid USD",
        "verdicts' tokens in / out",
        "verdicts' USD",
        "moved",
    ]
    return section(
        f"Nights by {trend['column']}",
        trend_chart(trend["nights"], s["scale"]) or "",
        table(head, trend_rows(trend), numeric=(1, 2, 4, 6, 8, 10)),
        f'<p class="muted">Moved: outside the previous night\'s 95% CI ({e(trend["ci"])}).</p>',
        anchor="trend",
    )
