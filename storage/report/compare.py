"""The comparison for people and machines: compare.json (full precision), compare.md with a chart
(compare.png), compare.html (`ctxprec.storage.report.compare_html`) and the terminal text. Drawn
from the report dict alone; the chart on matplotlib's Agg canvas.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.files import layout
from ctxprec.storage.files.atomic import atomic_write_bytes, temp_path
from ctxprec.storage.files.layout import (
    COMPARE_CHART,
    COMPARE_FILES,
    COMPARE_HTML,
    COMPARE_JSON,
    COMPARE_MD,
)
from ctxprec.storage.report.charts import charts_available, fit_title, png, short_label
from ctxprec.storage.report.compare_html import render_compare_html
from ctxprec.storage.report.compare_text import ci_text as _ci
from ctxprec.storage.report.compare_text import fmt
from ctxprec.storage.report.compare_text import gate_message as _gate_message
from ctxprec.storage.report.compare_text import honesty_lines as _honesty_lines
from ctxprec.storage.report.compare_text import left_out as _left_out
from ctxprec.storage.report.compare_text import p_text as _p
from ctxprec.storage.report.compare_text import side_text as _side
from ctxprec.storage.report.compare_text import signed as _signed
from ctxprec.storage.report.mdtext import md_code, md_text

__all__ = [
    "chart_figure",
    "check_compare_target",
    "render_chart",
    "render_markdown",
    "render_text",
    "write_compare",
]

_SIZE = (8.0, 4.5)
_INK = "#333333"
_MAX_GROUPS = 20
_REASON_CHARS = 300


def check_compare_target(outdir: Path) -> None:
    """`-o DIR` must be a folder ctxprec can write (made when it is missing) that holds no
    compare.* file of anyone else's, checked before the comparison is worked out: a file, a
    folder below a file, a read-only or missing file system are one line each (exit 2), and
    nothing is left behind. An earlier comparison there is replaced; a compare.json that is not
    a ctxprec comparison means the others are not ours either. Nor may DIR be a score output
    (a compare.* file there would make the next run refuse it)."""
    if os.path.lexists(outdir) and not outdir.is_dir():
        raise OutputError(
            f"-o {outdir} is a file, not a folder; give a folder for compare.json, compare.md "
            "and compare.html (it is made when it does not exist)"
        )
    if layout.state_dir(outdir).exists():
        raise OutputError(
            f"{outdir} is a ctxprec output folder; write the comparison elsewhere "
            "(a compare.* file there would make the next score run refuse the folder)"
        )
    _probe_writable(outdir)
    present = [name for name in COMPARE_FILES if layout.compare_file(outdir, name).exists()]
    if not present:
        return
    try:
        earlier = json.loads(layout.compare_file(outdir, COMPARE_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        earlier = None
    if not (isinstance(earlier, dict) and {"n_pairs", "mean_delta"} <= earlier.keys()):
        raise OutputError(
            f"{outdir} holds {', '.join(present)} that ctxprec compare did not write; "
            "choose another folder with -o"
        )


_WHY = {
    errno.ENOTDIR: "a part of its path is a file, not a folder",
    errno.ENOENT: "its folder cannot be made there",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOSPC: "no space left on the device",
}


def _probe_writable(outdir: Path) -> None:
    """Make the folders of `outdir` that are missing and a temp file in it, then remove what
    the probe made: a folder that cannot be made or written is refused before any work."""
    made: list[Path] = []
    here = outdir
    while not os.path.lexists(here) and here != here.parent:
        made.append(here)
        here = here.parent
    probe = temp_path(layout.compare_file(outdir, COMPARE_JSON))
    try:
        for folder in reversed(made):
            folder.mkdir()
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        reason = _WHY.get(exc.errno or 0) or exc.strerror or str(exc)
        raise OutputError(
            f"cannot write the comparison into -o {outdir}: {reason}; nothing was written: give "
            "a folder you can write with -o"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()


def write_compare(outdir: Path, report: Mapping[str, Any]) -> list[Path]:
    """Write compare.json, compare.md, compare.html and compare.png into `outdir`, each
    atomically."""
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # checked before the work (`check_compare_target`); changed since
        reason = _WHY.get(exc.errno or 0) or exc.strerror or str(exc)
        raise OutputError(f"cannot write the comparison into -o {outdir}: {reason}") from None
    files: dict[str, bytes] = {
        **({COMPARE_CHART: render_chart(report)} if charts_available() else {}),
        COMPARE_JSON: (
            json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n"
        ).encode(),
        COMPARE_MD: render_markdown(report).encode(),
        COMPARE_HTML: render_compare_html(report).encode(),
    }
    written = []
    for name, data in files.items():
        path = layout.compare_file(outdir, name)
        atomic_write_bytes(path, data)
        written.append(path)
    return written


def _verdicts(verdicts: Sequence[Any] | None) -> str:
    if verdicts is None:
        return "n/a"
    return "".join("+" if v else ("?" if v is None else "-") for v in verdicts) or "(none)"


def _judge_lines(report: Mapping[str, Any], shown: Callable[[Any], str] = str) -> list[str]:
    """The judge check in words; `shown` writes each difference and note (md_text in
    compare.md: they name the sides' models and settings)."""
    j = report["judge_config"]
    if j["differences"]:
        return [
            "**WARNING: the two sides were NOT scored with the same judge configuration; "
            "the deltas mix a change of judge with a change of retrieval** (when both sides "
            "hold the same rows, they measure the change of judge: see Judge against judge).",
            *(f"- {shown(d)}" for d in j["differences"]),
        ]
    return ["Same judge configuration on both sides."] + [f"- note: {shown(n)}" for n in j["notes"]]


def _metric_rows(report: Mapping[str, Any]) -> list[list[str]]:
    metrics = {"score": report, **report["metrics"]}
    return [
        [name, fmt(m["n_pairs"]), fmt(m["mean_a"]), fmt(m["mean_b"]), _signed(m["mean_delta"]),
         _ci(m), _p(m["p_value"]), fmt(m["wins"]), fmt(m["losses"]), fmt(m["ties"])]
        for name, m in metrics.items()
    ]  # fmt: skip


_METRIC_HEAD = ["metric", "pairs", "mean A", "mean B", "delta B−A", "95% CI", "p", "wins", "losses",
                "ties"]  # fmt: skip


def render_text(report: Mapping[str, Any], written: Path | None = None) -> str:
    """The terminal view: sides, pairs, the score delta with its CI and test, rank metrics.
    `written`: the folder compare.json was written to (-o), which its lines may point to."""
    lines = [
        f"ctxprec compare: A = {_side(report, 'a')}",
        f"                 B = {_side(report, 'b')}",
        f"  {fmt(report['n_pairs'])} pairs on `{report['on']}`; {_left_out(report)}",
        f"  score: A {fmt(report['mean_a'])}  B {fmt(report['mean_b'])}  "
        f"delta {_signed(report['mean_delta'])}  95% CI {_ci(report)}  p {_p(report['p_value'])}",
        f"  B vs A per id: {fmt(report['wins'])} better, {fmt(report['losses'])} worse, "
        f"{fmt(report['ties'])} tied",
    ]
    for name, m in report["metrics"].items():
        lines.append(
            f"  {name}: A {fmt(m['mean_a'])}  B {fmt(m['mean_b'])}  "
            f"delta {_signed(m['mean_delta'])}  95% CI {_ci(m)}"
        )
    lines.append(f"  test: {report['test']}")
    lines += [f"  {line}" for line in corrected_lines(report)]
    lines += _honesty_lines(report, "  ")
    if (agree := report.get("judge_agreement")) and agree["judges_differ"]:
        lines += _agreement_text(agree)
    lines += _judge_warning(report["judge_config"], written)
    if gate := _gate_message(report):
        lines.append(f"  GATE FAILED: {gate}")
    elif (g := report.get("gate")) and g.get("figure"):
        lines.append(f"  gate --fail-drop {g['fail_drop']:g} passed, on {g['figure']}")
    return "\n".join(lines)


def corrected_lines(report: Mapping[str, Any]) -> list[str]:
    """The difference of the corrected estimates in words (both sides carry a reference)."""
    c = report.get("corrected")
    if not c:
        return []
    ref = c["reference"]
    said = "human labels" if ref == "labels" else f"the audit judge {ref.removeprefix('audit:')}"
    line = (
        f"corrected (reference: {said}; {fmt(c['n_reference_a'])} / {fmt(c['n_reference_b'])} "
        f"reference rows): A {fmt(c['mean_a'])}  B {fmt(c['mean_b'])}  delta "
        f"{_signed(c['mean_delta'])}  95% CI {_ci(c) if c.get('ci95') else 'n/a'}"
    )
    return [line] + ([f"note: {c['note']}"] if c.get("note") else [])


_NAMED_SETTINGS = 4  # up to this many differing settings are named in the warning line


def _judge_warning(judge: Mapping[str, Any], written: Path | None) -> list[str]:
    """One line however many settings differ: one difference in full, a few by name, more by
    count; the values are in compare.json (pointed to when -o wrote it) and --json."""
    differences = judge["differences"]
    if not differences:
        return []
    names = judge.get("judges") or {}
    head = f"  WARNING judge configuration differs (A {names.get('a') or '?'}, B "
    head += f"{names.get('b') or '?'}):"
    if len(differences) == 1:
        return [f"{head} {differences[0]}"]
    settings = judge.get("settings") or []
    if written is not None:
        where = f"{layout.compare_file(written, COMPARE_JSON)} lists each under "
        where += "judge_config.differences"
    else:
        where = "--json lists each under judge_config.differences"
    if settings and len(settings) <= _NAMED_SETTINGS:
        return [f"{head} {', '.join(settings)} ({where})"]
    return [f"{head} {len(differences)} settings differ ({where})"]


def render_markdown(report: Mapping[str, Any]) -> str:
    """compare.md: sides, judge check, metrics table, chart, groups, rows that changed most."""
    b = report["bootstrap"]
    lines = [
        "# ctxprec comparison: B vs A",
        "",
        f"- A: {_side(report, 'a')} ({fmt(report['a']['rows'])} rows)",
        f"- B: {_side(report, 'b')} ({fmt(report['b']['rows'])} rows)",
        f"- **{fmt(report['n_pairs'])}** pairs on {md_code(report['on'])} (ids scored ok or "
        f"empty_context on both sides); {md_text(_left_out(report))}",
        "",
        *_judge_lines(report, md_text),
        "",
    ]
    if gate := _gate_message(report):
        lines += [f"> **Gate failed: {md_text(gate)}**", ""]
    agree = report.get("judge_agreement")
    if agree and agree["judges_differ"]:  # judge against judge: what the reader came for
        lines += _agreement_md(agree)
    lines += _table("Paired deltas", _METRIC_HEAD, _metric_rows(report))
    if said := [md_text(line) for line in corrected_lines(report)]:
        lines += [f"**Corrected estimates** (prediction-powered): {said[0]}", "",
                  *([said[1], ""] if len(said) > 1 else [])]  # fmt: skip
    lines += [
        f"Delta is B − A per id, averaged. 95% CI: paired percentile bootstrap, "
        f"{fmt(b['resamples'])} resamples, seed {b['seed']}. p: {report['test']}.",
        "",
        *(f"- {md_text(line)}" for line in _honesty_lines(report, "")),
        "",
        *([f"![mean delta with 95% CI]({COMPARE_CHART})", ""] if charts_available() else []),
    ]
    if g := report["by_group"]:
        rows = [[x["group"], fmt(x["n_pairs"]), fmt(x["mean_a"]), fmt(x["mean_b"]),
                 _signed(x["mean_delta"]), _ci(x), fmt(x["wins"]), fmt(x["losses"])]
                for x in g["groups"]]  # fmt: skip
        head = [g["column"], "pairs", "mean A", "mean B", "delta", "95% CI", "wins", "losses"]
        lines += _table(f"By {g['column']}", head, rows)
    lines += _changed_md(report)
    return "\n".join(lines).rstrip() + "\n"


# -- judge against judge (item-level agreement) ----------------------------------------------
def _pair(values: Any) -> str:
    return "n/a" if not values else f"[{fmt(values[0])}, {fmt(values[1])}]"


def _agreement_md(g: Mapping[str, Any]) -> list[str]:
    """Item-level agreement of the two judges: table, κ, McNemar, score change, cost."""
    t, m, d = g["table"], g["mcnemar"], g["score_delta"]
    lines = [
        "## Judge against judge",
        "",
        f"{fmt(g['items'])} items judged by both (paired by id and position, over "
        f"{fmt(g['rows'])} rows).",
        "",
        "| | B relevant | B not relevant |",
        "| --- | --- | --- |",
        f"| **A relevant** | {fmt(t['both_relevant'])} | {fmt(t['only_a_relevant'])} |",
        f"| **A not relevant** | {fmt(t['only_b_relevant'])} | {fmt(t['neither_relevant'])} |",
        "",
        f"- agreement {fmt(g['agreement'])} (flip rate {fmt(g['flip_rate'])}); Cohen's κ "
        f"**{fmt(g['cohen_kappa'])}**, 95% CI {_pair(g['kappa_ci95'])} ({g['kappa_ci']}; "
        f"asymptotic {_pair(g['kappa_ci95_asymptotic'])})",
        f"- relevant rate: A {fmt(g['relevant_rate_a'])}, B {fmt(g['relevant_rate_b'])}; "
        f"McNemar ({m['method']}, {fmt(m['discordant'])} discordant items) p {_p(m['p_value'])}",
        f"- score change this causes: mean {fmt(d['mean_a'])} → {fmt(d['mean_b'])} "
        f"({_signed(d['mean_delta'])}, 95% CI {_ci(d)}); {fmt(d['rows_changed'])} of "
        f"{fmt(d['n_pairs'])} rows changed score",
    ]
    if g["rows_not_same_items"]:
        lines.append(f"- {fmt(g['rows_not_same_items'])} paired rows hold different numbers of "
                     "items on the two sides: left out")  # fmt: skip
    rows = []
    for s in ("a", "b"):
        c = g["cost"][s]
        rows.append([s.upper(), c["judge_model"] or "n/a",
                     f"{fmt(c['paid_input_tokens'])} / {fmt(c['paid_output_tokens'])}",
                     fmt(c["paid_cost_usd"]),
                     f"{fmt(c['verdict_input_tokens'])} / {fmt(c['verdict_output_tokens'])}",
                     fmt(c["verdict_cost_usd"]), fmt(c["output_paid_cost_usd"])])  # fmt: skip
    head = ["side", "judge", "tokens paid in / out (these rows)", "paid USD (these rows)",
            "verdicts' tokens in / out", "verdicts' USD (when first paid)",
            "paid USD (whole output, summary)"]  # fmt: skip
    return [*lines, "", "Cost of each judge:", "", *_table("cost", head, rows)[2:]]


def _agreement_text(g: Mapping[str, Any]) -> list[str]:
    t, m = g["table"], g["mcnemar"]
    cost = "; ".join(_side_cost_text(s, g["cost"][s]) for s in ("a", "b"))
    return [
        f"  judge agreement: {fmt(g['items'])} items judged by both, agreement "
        f"{fmt(g['agreement'])}, kappa {fmt(g['cohen_kappa'])} 95% CI {_pair(g['kappa_ci95'])}",
        f"    A+B+ {fmt(t['both_relevant'])}  A+B- {fmt(t['only_a_relevant'])}  "
        f"A-B+ {fmt(t['only_b_relevant'])}  A-B- {fmt(t['neither_relevant'])}; McNemar "
        f"p {_p(m['p_value'])} ({m['method']})",
        f"    cost: {cost}",
    ]


def _changed_md(report: Mapping[str, Any]) -> list[str]:
    rows = report["changed_most"]
    if not rows:
        none = "No pair changed its score." if report["wins"] + report["losses"] == 0 else ""
        return ["## Rows that changed most", "", none, ""] if none else []
    legend = "Verdicts by position: + relevant, - not relevant, ? not judged."
    out = ["## Rows that changed most", "", legend, ""]
    for r in rows:
        out += [f"### {md_code(r['key'])}: {fmt(r['a']['score'])} → {fmt(r['b']['score'])} "
                f"({_signed(r['delta'])})", ""]  # fmt: skip
        for s in ("a", "b"):
            side = r[s]
            reason = " ".join(str(side["reason"] or "").split())
            if len(reason) > _REASON_CHARS:
                reason = reason[: _REASON_CHARS - 1] + "…"
            out.append(
                f"- {s.upper()}: {md_text(side['status'])}, verdicts "
                f"{md_code(_verdicts(side['verdicts']))}"
                + (f": {md_text(reason)}" if reason else "")
            )
        out.append("")
    return out


def _table(title: str, head: list[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A titled table; every title, heading and cell is shown as the text it holds (md_text):
    group values and model names come from the data."""
    if not rows:
        return []
    lines = [f"## {md_text(title)}", "", "| " + " | ".join(map(md_text, head)) + " |"]
    lines.append("|" + " --- |" * len(head))
    return [*lines, *("| " + " | ".join(md_text(c) for c in r) + " |" for r in rows), ""]


def render_chart(report: Mapping[str, Any]) -> bytes:
    """Mean delta (B − A) with its 95% CI per metric and, with --group-by, per group."""
    return png(chart_figure(report))


def chart_figure(report: Mapping[str, Any]) -> Any:
    """The matplotlib figure of `render_chart`."""
    from matplotlib.figure import Figure

    metrics = {"score": report, **report["metrics"]}
    groups = (report.get("by_group") or {}).get("groups", [])[:_MAX_GROUPS]
    fig = Figure(figsize=_SIZE, dpi=100, layout="constrained")
    axes = fig.subplots(1, 2 if groups else 1, squeeze=False)[0]
    _delta_bars(axes[0], list(metrics.items()), "score and rank metrics" if groups else "")
    if groups:
        labelled = [(short_label(str(g["group"]), 24), g) for g in groups]
        _delta_bars(axes[1], labelled, "score by group")  # a half-width title stays short
        axes[1].set_ylabel(short_label(report["by_group"]["column"], 40))
    fit_title(fig, f"B − A, mean over {fmt(report['n_pairs'])} pairs (bars: 95% CI)")
    return fig


def _delta_bars(ax: Any, items: list[tuple[str, Mapping[str, Any]]], title: str) -> None:
    from matplotlib.ticker import MaxNLocator

    items = [(n, m) for n, m in items if m["mean_delta"] is not None][::-1]
    ys = list(range(len(items)))
    deltas = [m["mean_delta"] for _, m in items]
    lo = [m["mean_delta"] - m["ci95"][0] for _, m in items]
    hi = [m["ci95"][1] - m["mean_delta"] for _, m in items]
    colors = ["#1a9850" if m["ci95"][0] > 0 else "#d73027" if m["ci95"][1] < 0 else "#999999"
              for _, m in items]  # fmt: skip
    ax.barh(ys, deltas, color=colors, alpha=0.8)
    ax.errorbar(deltas, ys, xerr=[lo, hi], fmt="none", ecolor=_INK, capsize=3)
    ax.axvline(0, color=_INK, lw=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=4))  # a half-width panel: few, readable ticks
    ax.set_yticks(ys, [n for n, _ in items])
    ax.set_title(title)
    ax.set_xlabel("mean delta B − A")


def _side_cost_text(side: str, c: Mapping[str, Any]) -> str:
    """One side's cost for the terminal: what its rows' runs paid, and their verdicts' cost."""
    paid = f"paid {fmt(c['paid_input_tokens'])}/{fmt(c['paid_output_tokens'])} tokens"
    if c.get("paid_cost_usd") is not None:
        paid += f" ${fmt(c['paid_cost_usd'])}"
    verdicts = f"verdicts {fmt(c['verdict_input_tokens'])}/{fmt(c['verdict_output_tokens'])}"
    if c.get("verdict_cost_usd") is not None:
        verdicts += f" ${fmt(c['verdict_cost_usd'])}"
    return f"{side.upper()} {c['judge_model'] or 'n/a'} {paid}, {verdicts} when first paid"
