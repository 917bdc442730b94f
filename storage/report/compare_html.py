"""compare.html: the comparison as one self-contained page: the change with its CI, the gate's
verdict, the judge check, the metrics and groups, judge against judge when the judges differ,
and the biggest wins and losses opening to both runs' ranked items side by side. Figures are
compare.json's, in the words of compare.md (`ctxprec.storage.report.compare_text`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctxprec.storage.report.compare_text import (
    ci_text,
    fmt,
    honesty_lines,
    left_out,
    p_text,
    signed,
)
from ctxprec.storage.report.page import card, clip, e, item_list, page, section, table
from ctxprec.storage.report.svg import delta_chart

__all__ = ["render_compare_html"]

_MAX_GROUPS = 40


def render_compare_html(report: Mapping[str, Any]) -> str:
    body = [
        "<h1>ctxprec comparison: B vs A</h1>",
        _sides(report),
        _headline(report),
        *_gate(report),
        _judge_check(report),
        _metrics(report),
        _groups(report),
        _agreement(report.get("judge_agreement")),
        _moved(report),
        "<footer>Written by ctxprec compare with the figures of compare.json. This page loads "
        "nothing and runs no script.</footer>",
    ]
    return page("ctxprec comparison", [b for b in body if b])


def _side(report: Mapping[str, Any], s: str) -> str:
    side = report[s]
    where = " and ".join(f"{c}={v}" for c, v in side["filters"].items())
    text = f"<code>{e(side['source'])}</code>" + (
        f" where <code>{e(where)}</code>" if where else ""
    )
    judge = (side.get("judge") or {}).get("judge_model")
    return (
        f"<li><b>{s.upper()}</b>: {text} ({e(fmt(side['rows']))} rows"
        + (f", judge <code>{e(judge)}</code>" if judge else "")
        + ")</li>"
    )


def _sides(report: Mapping[str, Any]) -> str:
    pairs = (
        f"<b>{e(fmt(report['n_pairs']))}</b> pairs on <code>{e(report['on'])}</code> (scored ok "
        f"or empty_context on both sides); {e(left_out(report))}"
    )
    return f"<ul>{_side(report, 'a')}{_side(report, 'b')}</ul><p>{pairs}</p>"


def _headline(report: Mapping[str, Any]) -> str:
    gate = report.get("gate")
    verdict = "not set" if not gate else ("FAILED" if gate.get("failed") else "passed")
    gate_sub = "no --fail-drop given" if not gate else f"--fail-drop {gate['fail_drop']:g}"
    if gate and gate.get("margin") is not None:
        gate_sub += f" --margin {gate['margin']:g}"
    cards = [
        card("mean A", e(fmt(report["mean_a"])), "", "mean_a"),
        card("mean B", e(fmt(report["mean_b"])), "", "mean_b"),
        card(
            "change B − A", e(signed(report["mean_delta"])), f"95% CI {e(ci_text(report))}", "delta"
        ),
        card("p", e(p_text(report["p_value"])), e(report["test"]), "p"),
        card(
            "B vs A per pair",
            f"{e(fmt(report['wins']))} / {e(fmt(report['losses']))}",
            f"better / worse; {e(fmt(report['ties']))} tied",
            "wins",
        ),
        card("gate", e(verdict), e(gate_sub), "gate"),
    ]
    return f'<div class="cards">{"".join(cards)}</div>'


def _gate(report: Mapping[str, Any]) -> list[str]:
    gate = report.get("gate") or {}
    if gate.get("failed"):
        return [f'<p class="note bad"><b>Gate failed</b>: {e(gate["message"])}</p>']
    return []


def _judge_check(report: Mapping[str, Any]) -> str:
    j = report["judge_config"]
    if j["differences"]:
        items = "".join(f"<li>{e(d)}</li>" for d in j["differences"])
        return (
            '<div class="note bad"><b>The two sides were not scored with the same judge '
            "configuration</b>: the changes mix a change of judge with a change of retrieval "
            f"(with the same rows on both sides they measure the judge).<ul>{items}</ul></div>"
        )
    notes = "".join(f"<li>{e(n)}</li>" for n in j["notes"])
    return "<p>Same judge configuration on both sides.</p>" + (f"<ul>{notes}</ul>" if notes else "")


def _metrics(report: Mapping[str, Any]) -> str:
    metrics = {"score": report, **report["metrics"]}
    rows = [
        [
            name,
            fmt(m["n_pairs"]),
            fmt(m["mean_a"]),
            fmt(m["mean_b"]),
            signed(m["mean_delta"]),
            ci_text(m),
            p_text(m["p_value"]),
            fmt(m["wins"]),
            fmt(m["losses"]),
            fmt(m["ties"]),
        ]
        for name, m in metrics.items()
    ]
    head = [
        "metric",
        "pairs",
        "mean A",
        "mean B",
        "change",
        "95% CI",
        "p",
        "wins",
        "losses",
        "ties",
    ]
    b = report["bootstrap"]
    how = (
        f"Change is B − A per pair, averaged. 95% CI: paired percentile bootstrap, "
        f"{fmt(b['resamples'])} resamples, seed {b['seed']}. p: {report['test']}."
    )
    honesty = "".join(f"<li>{e(line)}</li>" for line in honesty_lines(report, ""))
    return section(
        "Paired changes",
        delta_chart(list(metrics.items())) or "",
        table(head, rows, numeric=range(1, 10)),
        f'<p class="muted">{e(how)}</p>',
        f"<ul>{honesty}</ul>" if honesty else "",
        anchor="metrics",
    )


def _groups(report: Mapping[str, Any]) -> str:
    g = report.get("by_group")
    if not g:
        return ""
    groups = g["groups"][:_MAX_GROUPS]
    rows = [
        [
            str(x["group"]),
            fmt(x["n_pairs"]),
            fmt(x["mean_a"]),
            fmt(x["mean_b"]),
            signed(x["mean_delta"]),
            ci_text(x),
            fmt(x["wins"]),
            fmt(x["losses"]),
        ]
        for x in groups
    ]
    head = [str(g["column"]), "pairs", "mean A", "mean B", "change", "95% CI", "wins", "losses"]
    chart = delta_chart([(str(x["group"]), x) for x in groups[:20]]) or ""
    return section(
        f"By {g['column']}", chart, table(head, rows, numeric=range(1, 8)), anchor="groups"
    )


def _agreement(g: Mapping[str, Any] | None) -> str:
    if not g or not g.get("judges_differ"):
        return ""
    t, m, d = g["table"], g["mcnemar"], g["score_delta"]
    grid = table(
        ["", "B relevant", "B not relevant"],
        [
            ["A relevant", fmt(t["both_relevant"]), fmt(t["only_a_relevant"])],
            ["A not relevant", fmt(t["only_b_relevant"]), fmt(t["neither_relevant"])],
        ],
        numeric=(1, 2),
    )
    lines = [
        f"{fmt(g['items'])} items judged by both (paired by id and position, over "
        f"{fmt(g['rows'])} rows).",
        f"Agreement {fmt(g['agreement'])} (flip rate {fmt(g['flip_rate'])}); Cohen's κ "
        f"{fmt(g['cohen_kappa'])}, 95% CI {_pair(g['kappa_ci95'])} ({g['kappa_ci']}).",
        f"Relevant rate: A {fmt(g['relevant_rate_a'])}, B {fmt(g['relevant_rate_b'])}; McNemar "
        f"({m['method']}, {fmt(m['discordant'])} discordant items) p {p_text(m['p_value'])}.",
        f"Score change this causes: mean {fmt(d['mean_a'])} → {fmt(d['mean_b'])} "
        f"({signed(d['mean_delta'])}, 95% CI {ci_text(d)}); {fmt(d['rows_changed'])} of "
        f"{fmt(d['n_pairs'])} rows changed score.",
    ]
    cost = [
        [
            s.upper(),
            g["cost"][s]["judge_model"] or "n/a",
            f"{fmt(g['cost'][s]['paid_input_tokens'])} / {fmt(g['cost'][s]['paid_output_tokens'])}",
            fmt(g["cost"][s]["paid_cost_usd"]),
            f"{fmt(g['cost'][s]['verdict_input_tokens'])} / "
            f"{fmt(g['cost'][s]['verdict_output_tokens'])}",
            fmt(g["cost"][s]["verdict_cost_usd"]),
        ]
        for s in ("a", "b")
    ]
    return section(
        "Judge against judge",
        grid,
        "".join(f"<p>{e(x)}</p>" for x in lines),
        table(
            [
                "side",
                "judge",
                "tokens paid in / out",
                "paid USD",
                "verdicts' tokens in / out",
                "verdicts' USD (when first paid)",
            ],
            cost,
            numeric=(2, 3, 4, 5),
        ),
        anchor="judges",
    )


def _pair(values: Sequence[Any] | None) -> str:
    return "n/a" if not values else f"[{fmt(values[0])}, {fmt(values[1])}]"


def _moved(report: Mapping[str, Any]) -> str:
    biggest = report.get("biggest") or {}
    wins, losses = biggest.get("wins") or [], biggest.get("losses") or []
    if not wins and not losses:
        return section("Biggest wins and losses", "<p>No pair changed its score.</p>")
    parts = []
    if losses:
        parts.append(f"<h3>Losses: B below A ({len(losses)} largest)</h3>")
        parts += [_pair_details(r) for r in losses]
    if wins:
        parts.append(f"<h3>Wins: B above A ({len(wins)} largest)</h3>")
        parts += [_pair_details(r) for r in wins]
    return section("Biggest wins and losses", *parts, anchor="moved")


def _pair_details(r: Mapping[str, Any]) -> str:
    a, b = r["a"], r["b"]
    query = a.get("query") or b.get("query")
    head = (
        f'<span class="pill">{e(signed(r["delta"]))}</span> <span class="rid">{e(r["key"])}</span>'
        f" {e(fmt(a['score']))} → {e(fmt(b['score']))}"
        + (f" {e(clip(query, 120))}" if query else "")
    )
    top = f"<p><b>Query</b>: {e(clip(query))}</p>" if query else ""
    if expected := a.get("expected") or b.get("expected"):
        top += f"<p><b>Expected</b>: {e(clip(expected))}</p>"
    sides = "".join(
        f"<div><h3>{s.upper()}: {e(fmt(side['score']))} ({e(side['status'])})</h3>"
        + item_list(side.get("items") or [], bool(side.get("texts")))
        + "</div>"
        for s, side in (("a", a), ("b", b))
    )
    return (
        f'<details class="row" data-id="{e(r["key"])}"><summary>{head}</summary>'
        f'<div class="body">{top}<div class="side">{sides}</div></div></details>'
    )
