"""The shell every HTML report shares: one self-contained page (inline CSS, inline SVG, no
script), a Content-Security-Policy that lets nothing load, light and dark colours, and the
pieces the pages are built of: escaped text, tables, figure cards and a row that opens to its
ranked items. Every value from the data passes through `e` (html.escape) exactly once.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from ctxprec.storage.core.figures import figure_text
from ctxprec.storage.core.printable import visible

__all__ = [
    "CSP",
    "card",
    "clip",
    "e",
    "item_list",
    "page",
    "row_details",
    "row_head",
    "section",
    "stats",
    "table",
]

# Nothing may load: no script at all, styles only inline, images only as data: URIs.
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'"
)
_TEXT_CHARS = 1000  # of one item, a query or an expected output (the page stays small)
_REASON_CHARS = 400
_ITEMS = 30  # items shown per row: 120 rows x 30 items x 1.4 kB stays a few MB at most

_CSS = """
:root{--bg:#fff;--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--card:#f6f8fa;--accent:#0969da;
--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700;--grid:#e6eaef;--bar:#4575b4;
--excellent:#1a9850;--good:#91cf60;--medium:#fee08b;--low:#fc8d59;--none:#d73027}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--muted:#9198a1;
--line:#3d444d;--card:#151b23;--accent:#4493f8;--ok:#3fb950;--bad:#f85149;--warn:#d29922;
--grid:#262c36;--bar:#6ea8fe}}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0 auto;max-width:1100px;padding:16px;background:var(--bg);color:var(--fg);
font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;overflow-wrap:break-word}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.2em;margin:1.6em 0 .5em;
border-bottom:1px solid var(--line);padding-bottom:.2em}h3{font-size:1em;margin:1em 0 .4em}
p{margin:.4em 0}.muted{color:var(--muted)}code{font-size:.92em}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(160px,1fr));gap:8px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:8px 10px}
.card .k{font-size:.8em;color:var(--muted)}.card .v{font-size:1.35em;font-weight:600}
.card .s{font-size:.82em;color:var(--muted)}
.note{border-left:4px solid var(--warn);background:var(--card);padding:6px 10px;margin:8px 0}
.note.bad{border-color:var(--bad)}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.3em 0;font-size:.92em}
th,td{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
th{color:var(--muted);font-weight:600}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
svg.chart{display:block;width:100%;max-width:640px;height:auto;margin:.4em 0}
svg .ax{fill:var(--muted);font-size:12px}svg .grid{stroke:var(--grid);stroke-width:1}
svg .pos{fill:var(--bar)}svg .zero{stroke:var(--muted);stroke-width:1}
svg .b-excellent{fill:var(--excellent)}svg .b-good{fill:var(--good)}
svg .b-medium{fill:var(--medium)}svg .b-low{fill:var(--low)}svg .b-none{fill:var(--none)}
svg .ci{fill:var(--bar);opacity:.22}svg .line{fill:none;stroke:var(--bar);stroke-width:2}
svg .dot{fill:var(--bar)}svg .dot.up,svg .dot.win{fill:var(--ok)}
svg .dot.down,svg .dot.loss{fill:var(--bad)}svg .dot.flat{fill:var(--muted)}
svg .cibar{stroke-width:3;stroke:var(--muted)}svg .cibar.win{stroke:var(--ok)}
svg .cibar.loss{stroke:var(--bad)}
.bar{display:inline-block;height:.7em;background:var(--bar);border-radius:2px;vertical-align:middle}
.band{display:inline-block;width:.8em;height:.8em;border-radius:2px;vertical-align:-1px;margin-right:4px}
.band.excellent{background:var(--excellent)}.band.good{background:var(--good)}
.band.medium{background:var(--medium)}.band.low{background:var(--low)}.band.none{background:var(--none)}
details.row{border:1px solid var(--line);border-radius:6px;margin:4px 0;background:var(--bg)}
details.row>summary{cursor:pointer;padding:5px 8px;list-style-position:inside}
details.row[open]>summary{border-bottom:1px solid var(--line);background:var(--card)}
details.row .body{padding:6px 10px}
.pill{display:inline-block;min-width:3.2em;text-align:center;border-radius:10px;padding:0 6px;
font-weight:600;font-variant-numeric:tabular-nums;background:var(--card);
border:1px solid var(--line)}
.rid{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.88em}
ol.items{padding-left:0;list-style:none;margin:.3em 0}
ol.items>li{border-left:4px solid var(--line);padding:3px 8px;margin:6px 0}
ol.items>li.rel{border-color:var(--ok)}ol.items>li.irr{border-color:var(--muted)}
ol.items>li.unk{border-color:var(--warn)}
.verdict{font-weight:600}.rel .verdict{color:var(--ok)}.unk .verdict{color:var(--warn)}
.text{white-space:pre-wrap;margin:.2em 0;font-size:.93em}
.reason{color:var(--muted);font-size:.9em}
.side{display:grid;grid-template-columns:1fr 1fr;gap:10px}
@media (max-width:640px){body{padding:10px;font-size:14px}.side{grid-template-columns:1fr}
th,td{padding:3px 5px}}
dl.stats{display:grid;grid-template-columns:repeat(auto-fill,minmax(88px,1fr));gap:4px 8px;
margin:.4em 0}dl.stats div{border-bottom:1px solid var(--line)}dl.stats dt{font-size:.8em;
color:var(--muted)}dl.stats dd{margin:0;font-weight:600;font-variant-numeric:tabular-nums}
td.n{white-space:nowrap}
@media (max-width:640px){svg .ax{font-size:15px}}
footer{margin-top:2em;font-size:.85em;color:var(--muted)}
"""


def e(value: Any) -> str:
    """Text for HTML: escaped, quotes too (safe in an attribute as in an element); control
    and bidi characters shown as escapes (`\\u202egnp.exe` does not read "exe.png")."""
    return html.escape(visible("" if value is None else str(value)), quote=True)


def clip(value: Any, limit: int = _TEXT_CHARS) -> str:
    """At most `limit` characters of a text, saying how many more there were."""
    text = "" if value is None else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def page(title: str, body: Sequence[str]) -> str:
    """The whole document."""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<meta name="color-scheme" content="light dark">'
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def section(title: str, *parts: str, anchor: str = "") -> str:
    if not [p for p in parts if p]:
        return ""
    ident = f' id="{e(anchor)}"' if anchor else ""
    return f"<section{ident}><h2>{e(title)}</h2>" + "".join(parts) + "</section>"


def card(key: str, value: str, sub: str = "", ident: str = "") -> str:
    """A headline figure (`value`, `sub` already escaped or built of escaped parts)."""
    data = f' data-figure="{e(ident)}"' if ident else ""
    return (
        f'<div class="card"><div class="k">{e(key)}</div><div class="v"{data}>{value}</div>'
        + (f'<div class="s">{sub}</div>' if sub else "")
        + "</div>"
    )


def table(head: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    """A table of escaped cells; a cell given as ("html", markup) is inserted as built."""
    if not rows:
        return ""
    num = set(numeric)
    ths = "".join(f"<th{' class=n' if i in num else ''}>{e(h)}</th>" for i, h in enumerate(head))
    out = [f'<div class="scroll"><table><thead><tr>{ths}</tr></thead><tbody>']
    for r in rows:
        cells = []
        for i, c in enumerate(r):
            markup = c[1] if isinstance(c, tuple) and c and c[0] == "html" else e(_cell(c))
            cells.append(f"<td{' class=n' if i in num else ''}>{markup}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "".join(out) + "</tbody></table></div>"


def stats(figures: Mapping[str, Any]) -> str:
    """Named figures as a grid that wraps to the width (the score statistics)."""
    cells = "".join(
        f'<div><dt>{e(k)}</dt><dd data-figure="{e(k)}">{e(figure_text(v))}</dd></div>'
        for k, v in figures.items()
    )
    return f'<dl class="stats">{cells}</dl>'


def _cell(value: Any) -> str:
    return figure_text(value) if not isinstance(value, str) else value


def _verdict(item: Mapping[str, Any]) -> tuple[str, str]:
    v = item.get("verdict")
    return (
        ("rel", "relevant")
        if v
        else ("unk", "not judged")
        if v is None
        else ("irr", "not relevant")
    )


def item_list(items: Sequence[Mapping[str, Any]], texts: bool) -> str:
    """The ranked items of one row: position, verdict, label, what it added to AP, text, reason."""
    if not items:
        return '<p class="muted">No context items.</p>'
    out = ['<ol class="items">']
    for it in items[:_ITEMS]:
        cls, word = _verdict(it)
        bits = [f'<span class="verdict">#{it["position"]} {word}</span>']
        if it.get("added") is not None:
            bits.append(f"added {e(figure_text(it['added']))} to AP")
        if it.get("label") is not None:
            agree = bool(it["label"]) == bool(it.get("verdict"))
            label = "relevant" if it["label"] else "not relevant"
            bits.append(
                f"label: {label}" + ("" if agree or it.get("verdict") is None else " (differs)")
            )
        text = (
            f'<div class="text">{e(clip(it.get("text")))}</div>'
            if texts and it.get("text") is not None
            else ""
        )
        reason = it.get("reason")
        why = f'<div class="reason">{e(clip(reason, _REASON_CHARS))}</div>' if reason else ""
        out.append(f'<li class="{cls}"><div>{" · ".join(bits)}</div>{text}{why}</li>')
    out.append("</ol>")
    if len(items) > _ITEMS:
        rest = items[_ITEMS:]
        relevant = sum(1 for it in rest if it.get("verdict"))
        out.append(
            f'<p class="muted">{len(rest):,} more items not shown '
            f"({relevant:,} of them judged relevant).</p>"
        )
    return "".join(out)


def row_head(row: Mapping[str, Any]) -> str:
    """What a closed row shows: score, id, status, group and the start of its query."""
    score = figure_text(row.get("score"))
    head = [f'<span class="pill">{e(score)}</span>', f'<span class="rid">{e(row["id"])}</span>']
    if row.get("status") != "ok":
        head.append(f'<span class="muted">{e(row.get("status"))}</span>')
    if row.get("group") is not None:
        head.append(f'<span class="muted">[{e(row["group"])}]</span>')
    if row.get("query"):
        head.append(e(clip(row["query"], 120)))
    return " ".join(head)


def row_details(row: Mapping[str, Any]) -> str:
    """One row as a <details> element: it opens to the query, expected output and items."""
    body = []
    if row.get("query") is not None:
        body.append(f"<p><b>Query</b>: {e(clip(row['query']))}</p>")
    if row.get("expected") is not None:
        body.append(f"<p><b>Expected</b>: {e(clip(row['expected']))}</p>")
    if row.get("error"):
        body.append(f'<p class="note bad">{e(clip(row["error"], _REASON_CHARS))}</p>')
    if not row.get("texts"):
        body.append(
            '<p class="muted">Item texts are not in the output (keep them with '
            "<code>--passthrough</code> of the context column, or keep the input "
            "where the run read it): verdicts and reasons only.</p>"
        )
    body.append(item_list(row.get("items") or [], bool(row.get("texts"))))
    return (
        f'<details class="row" data-id="{e(row["id"])}"><summary>{row_head(row)}</summary>'
        f'<div class="body">{"".join(body)}</div></details>'
    )
