"""What compare.html shows of the pairs that moved most: for each side, the row's ranked items
(text when the output or the unchanged input holds it, verdict, the judge's reason, what it
added to AP), read for those keys only, lazily from the side's part files. Texts are clipped
to 1,000 characters (compare.json carries them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import polars as pl

from ctxprec.connectors.sources import input_texts
from ctxprec.storage.files import layout
from ctxprec.storage.files.objpath import OutPath, local_copies
from ctxprec.storage.outdir.dataset import scan_parts
from ctxprec.storage.outdir.ownership import part_files
from ctxprec.storage.report.page import clip
from ctxprec.storage.report.rows import ranked_items, text_columns, text_exprs, with_keys

__all__ = ["side_evidence"]


def _describe(path: OutPath) -> dict[str, Any]:
    try:
        manifest = json.loads(layout.manifest(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return dict(manifest.get("describe") or {})


def side_evidence(
    path: OutPath, filters: Sequence[tuple[str, str]], on: str, keys: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """{key: {"id", "query", "expected", "texts", "items"}} for the given keys of one side."""
    if not keys:
        return {}
    describe = _describe(path)
    names = text_columns(describe)
    with local_copies(part_files(path), path) as local:
        lf = scan_parts(local)
        for column, value in filters:
            lf = lf.filter(pl.col(column).cast(pl.String) == value)
        cols = set(lf.collect_schema().names())
        keep = [c for c in ("verdicts", "verdict_reasons", "label_verdicts") if c in cols]
        exprs = [pl.col(on).cast(pl.String).alias("_key"), pl.col("id").cast(pl.String)]
        exprs += [pl.col(c) for c in keep]
        exprs += text_exprs(cols, names, taken=("id", on, *keep))
        wanted = with_keys(lf, pl.col(on), keys)
        got = wanted.select(exprs).unique("_key", keep="first").collect(engine="streaming")
    rows = {r["_key"]: r for r in got.iter_rows(named=True)}
    lookup = input_texts(describe)
    missing = [r["id"] for r in rows.values() if r.get("_context") is None]
    fetched = lookup(missing) if lookup and missing else {}
    return {key: _evidence(r, fetched.get(r["id"]) or {}) for key, r in rows.items()}


def _evidence(r: dict[str, Any], texts: dict[str, Any]) -> dict[str, Any]:
    context = r.get("_context") if r.get("_context") is not None else texts.get("context")
    query = r.get("_query") if r.get("_query") is not None else texts.get("query")
    expected = r.get("_expected") if r.get("_expected") is not None else texts.get("expected")
    shown = None if context is None else [None if t is None else clip(t) for t in context]
    items = ranked_items(
        r.get("verdicts"), r.get("verdict_reasons"), shown, r.get("label_verdicts")
    )
    return {
        "id": r["id"],
        "query": None if query is None else clip(query),
        "expected": None if expected is None else clip(expected),
        "texts": context is not None,
        "items": items,
    }
