"""How a comparison reads in words, shared by compare.md, the terminal and compare.html: figures
rounded by the one rule, signed changes, intervals, p-values, the sides, what was left out and
the honesty lines (clustering, smallest detectable difference, non-inferiority).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxprec.storage.core.figures import figure_text
from ctxprec.storage.report.mdtext import md_code

__all__ = [
    "ci_text",
    "fmt",
    "gate_message",
    "honesty_lines",
    "left_out",
    "p_text",
    "side_text",
    "signed",
]


def fmt(value: Any, digits: int = 4) -> str:
    """A figure for people: rounded, thousands separated, "n/a" for missing or not finite."""
    return figure_text(value, digits, missing="n/a")  # the one rounding rule (ctxprec.storage.core)


def signed(value: Any) -> str:
    text = fmt(value)
    return text if text == "n/a" or text.startswith("-") or text == "0" else f"+{text}"


def ci_text(report: Mapping[str, Any]) -> str:
    ci = report.get("ci95")
    return "n/a" if not ci else f"[{signed(ci[0])}, {signed(ci[1])}]"


def p_text(value: Any) -> str:
    if value is None:
        return "n/a"
    return "< 0.0001" if value < 1e-4 else fmt(value)


def side_text(report: Mapping[str, Any], s: str) -> str:
    side = report[s]
    where = " and ".join(f"{c}={v}" for c, v in side["filters"].items())
    return md_code(side["source"]) + (f" where {md_code(where)}" if where else "")


def gate_message(report: Mapping[str, Any]) -> str | None:
    gate = report.get("gate") or {}
    return str(gate["message"]) if gate.get("failed") else None


def left_out(report: Mapping[str, Any]) -> str:
    left = report["left_out"]
    parts = [f"{k.replace('_', ' ')} {fmt(v)}" for k, v in left.items() if k != "total" and v]
    return f"{fmt(left['total'])} ids left out" + (f" ({', '.join(parts)})" if parts else "")


def honesty_lines(report: Mapping[str, Any], bullet: str) -> list[str]:
    """Clustering, the smallest detectable difference, d_z and non-inferiority."""
    c = report.get("clustering") or {}
    out = []
    if c.get("column"):
        extra = report.get("design_effect")
        deff = "" if extra is None else f", design effect {fmt(extra, 2)}"
        out.append(f"{bullet}clustered by `{c['column']}`: {fmt(c['clusters'])} clusters resampled "
                   f"whole ({c['how']}{deff})")  # fmt: skip
    elif c:
        out.append(f"{bullet}clusters: {c['how']}")
    if report.get("mde_80") is not None:
        out.append(
            f"{bullet}smallest difference this comparison could detect (80% power, two-sided 5%): "
            f"±{fmt(report['mde_80'])} at {fmt(report['n_pairs'])} pairs; a change smaller than "
            f"that may go unseen. Cohen's d_z {fmt(report.get('cohens_dz'), 3)}"
        )
    if t := report.get("non_inferiority"):
        shown = "SHOWN" if t["non_inferior"] else "NOT shown"
        out.append(
            f"{bullet}non-inferiority, margin {fmt(t['margin'])}: {shown} that B is no worse than "
            f"A by more than {fmt(t['margin'])} (lower end of the 95% CI "
            f"{signed(t['lower_bound'])} vs -{fmt(t['margin'])}; "
            f"bootstrap p {p_text(t['p_value'])})"
        )
    return out
