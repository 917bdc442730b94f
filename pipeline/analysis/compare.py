"""`ctxprec compare`: two scored outputs, or two slices of one, paired by id (or `--on COL`):
what was left out and why, whether the judges match, paired deltas of the score and the rank
metrics with a bootstrap CI, per-group deltas, the rows that changed most, and the drop gate.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from ctxprec.analysis.corrected import REFERENCE_COLUMNS, corrected_delta
from ctxprec.analysis.evidence import side_evidence
from ctxprec.storage.core.constants import STATUS_EMPTY, STATUS_FAILED, STATUS_OK
from ctxprec.storage.core.errors import NothingToCompareError, OutputError, UserError
from ctxprec.storage.core.figures import round_figure
from ctxprec.storage.core.options import CompareOptions
from ctxprec.storage.files import layout
from ctxprec.storage.files.fs import is_uri
from ctxprec.storage.files.objpath import ObjPath, OutPath, local_copies, out_path
from ctxprec.storage.outdir.dataset import scan_parts
from ctxprec.storage.outdir.ownership import (
    incomplete_parts,
    missing_rows_line,
    part_files,
    read_manifest,
)
from ctxprec.storage.outdir.schema import OLD_TOKEN_COLUMNS, TOKEN_COLUMNS, token_columns
from ctxprec.storage.stats.agreement import agreement_figures, mcnemar
from ctxprec.storage.stats.paired import TIE_EPS, paired_figures

__all__ = [
    "CompareOptions",
    "Side",
    "compare",
    "compare_outputs",
    "drop_gate",
    "gate_figure",
    "local_output",
    "parse_filter",
    "sides_from_args",
]

_SCORED = (STATUS_OK, STATUS_EMPTY)
_ROW_COLS = ("score", "status", "reason", "verdicts", "error", "judge_model", "prompt_version",
             *TOKEN_COLUMNS, *OLD_TOKEN_COLUMNS, *REFERENCE_COLUMNS)  # fmt: skip
_RANK_PREFIXES = ("reciprocal_rank", "precision_at_", "hit_at_")
_JUDGE_KEYS = ("judge", "judge_model", "mode", "scale")  # manifest entries that change a score
_URL_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss", "http", "https", "file", "hf")


@dataclass(frozen=True)
class Side:
    """One side of a comparison: an output folder and `COL=VALUE` filters on its rows."""

    name: str  # "A" or "B"
    path: OutPath
    filters: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        where = " and ".join(f"{c}={v}" for c, v in self.filters)
        return f"{self.path}" + (f" where {where}" if where else "")


def local_output(source: str) -> OutPath:
    """The output folder `source` names: a local folder or an object-store URI (s3://, gs://,
    az://, abfs[s]://, file://, read through `ctxprec.storage.files.fs`); other URLs are refused
    (exit 2)."""
    scheme, sep, _ = source.partition("://")
    if sep and not is_uri(source) and (scheme.lower() in _URL_SCHEMES or scheme.isalpha()):
        raise UserError(
            f"{source}: compare reads local folders and s3://, gs://, az://, abfs[s]:// or "
            "file:// outputs; copy the output to one of those first"
        )
    path = out_path(source)
    if not path.is_dir():
        raise UserError(f"{source} is not a folder; pass an OUTDIR written by `ctxprec score`")
    return path


def parse_filter(text: str) -> tuple[str, str]:
    """`COL=VALUE` (the value compared as text, as in a Hive path) -> (COL, VALUE)."""
    column, sep, value = text.partition("=")
    if not sep or not column.strip():
        raise UserError(f"{text!r}: write COL=VALUE, e.g. --a dt=2026-11-28 or --a retriever=bm25")
    return column.strip(), value


def compare(a: Side, b: Side, opts: CompareOptions) -> dict[str, Any]:
    """Every figure of compare.json (full float precision; rounding is for people only)."""
    if opts.resamples < 1:
        raise UserError(f"--resamples must be at least 1, got {opts.resamples}")
    if opts.margin is not None and not opts.margin >= 0:
        raise UserError(f"--margin must be 0 or more, got {opts.margin}")
    candidates = [opts.cluster_by] if opts.cluster_by else _cluster_candidates(a, b)
    fa, fb = _read_side(a, opts, candidates), _read_side(b, opts, candidates)
    pairs, left_out = _pair(fa, fb)
    if pairs.height == 0:
        raise NothingToCompareError(_no_pairs_message(a, b, fa, fb, left_out, opts.on))
    judge = _judge_check(a, b, pairs)
    if opts.strict and judge["differences"]:
        raise UserError(
            "--strict: the two sides were not scored with the same judge configuration: "
            + "; ".join(judge["differences"])
        )
    clustering, pairs = _clusters(pairs, candidates, opts)
    metrics = {m: _metric(pairs, m, opts) for m in _metric_names(pairs)}
    agreement = judge_agreement(a, b, fa, fb, judge, metrics["score"], opts)
    audit_models = {s.name.lower(): _audit_model(s) for s in (a, b)}
    return {
        "a": _side_info(a, fa),
        "b": _side_info(b, fb),
        "on": opts.on,
        **metrics["score"],
        "bootstrap": {"resamples": opts.resamples, "seed": opts.seed, "interval": "percentile"},
        "clustering": clustering,
        "left_out": left_out,
        "judge_config": judge,
        "judge_agreement": agreement,
        # both sides carry labels or an audit judge: the difference of the corrected estimates
        "corrected": corrected_delta(pairs, audit_models, _CLUSTER),
        "metrics": {k: v for k, v in metrics.items() if k != "score"},
        "by_group": _by_group(pairs, opts) if opts.group_by else None,
        "changed_most": _changed_most(pairs, opts),
        "biggest": _biggest(pairs, a, b, opts),  # compare.html: wins, losses and their items
    }


def _scan(side: Side) -> pl.LazyFrame:
    if incomplete := incomplete_parts(side.path):  # checked before a Parquet reader meets it
        raise UserError(
            f"side {side.name}: {missing_rows_line(side.path, incomplete)}; run the same "
            "`ctxprec score` command again (without --overwrite) to score them again"
        )
    files = part_files(side.path)
    if not files:
        raise NothingToCompareError(
            f"side {side.name}: {side.path} holds no scored part files; "
            "pass an OUTDIR written by `ctxprec score`"
        )
    with local_copies(files, side.path) as local:  # object stores: read from a temp copy
        lf = scan_parts(local)
        # an object store's temp copy is gone once this returns: read it now
        return lf.collect().lazy() if isinstance(side.path, ObjPath) else lf


def _read_side(side: Side, opts: CompareOptions, clusters: Sequence[str] = ()) -> pl.DataFrame:
    """The side's rows: pairing key, scored columns, rank metrics, group and cluster columns
    (a default cluster column only when the side has it); filtered."""
    lf = _scan(side)
    cols = lf.collect_schema().names()
    named = [opts.on, *(c for c, _ in side.filters), opts.group_by or opts.on]
    for column in [*named, opts.cluster_by or opts.on]:
        if column not in cols:
            raise UserError(
                f"side {side.name}: column `{column}` is not in {side.path} "
                f"(columns: {', '.join(cols)})"
            )
    every = lf  # before the filters: the values a filter that matched nothing could have named
    for column, value in side.filters:
        lf = lf.filter(pl.col(column).cast(pl.String) == value)
    wanted = [c for c in cols if c in _ROW_COLS or c.startswith(_RANK_PREFIXES)]
    extra = [g for g in [opts.group_by] if g and g != opts.on and g not in wanted]
    extra += [c for c in clusters if c in cols and c != opts.on and c not in (*wanted, *extra)]
    frame = lf.select(pl.col(opts.on).alias("key"), *extra, *wanted).collect()
    _check_side(side, frame, opts.on, every)
    return frame


def _check_side(side: Side, frame: pl.DataFrame, on: str, lf: pl.LazyFrame) -> None:
    if side.filters and frame.height == 0:
        column, _ = side.filters[0]
        values = pl.col(column).cast(pl.String).drop_nulls().unique().sort()
        seen = lf.select(values.head(11)).collect().to_series().to_list()
        listed = ", ".join(seen[:10]) + (", …" if len(seen) > 10 else "")
        there = f"values of `{column}` there: {listed}" if seen else f"`{column}` is empty there"
        where = " and ".join(f"{c}={v}" for c, v in side.filters)
        raise NothingToCompareError(
            f"side {side.name}: no row of {side.path} matches {where} ({there})"
        )
    dupes = frame.group_by("key").len().filter(pl.col("len") > 1)
    if dupes.height:
        key, count = dupes.row(0)
        raise UserError(
            f"side {side.name}: `{on}` = {key!r} appears {count} times in {side.describe()} "
            f"({dupes.height} repeated values); pair on a column unique within each side "
            "(--on COL) or narrow the side with --a/--b COL=VALUE"
        )


def _pair(fa: pl.DataFrame, fb: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """Rows of both sides joined on the key; only keys scored on both sides are kept."""
    if fa.schema["key"] != fb.schema["key"]:  # e.g. integer ids on one side, text on the other
        fa, fb = (f.with_columns(pl.col("key").cast(pl.String)) for f in (fa, fb))
    a_cols = {c: f"{c}_a" for c in fa.columns if c != "key"}
    b_cols = {c: f"{c}_b" for c in fb.columns if c != "key"}
    joined = fa.rename(a_cols).join(fb.rename(b_cols), on="key", how="inner")
    fail_a = joined.get_column("status_a") == STATUS_FAILED
    fail_b = joined.get_column("status_b") == STATUS_FAILED
    left_out = {
        "only_in_a": fa.join(fb, on="key", how="anti").height,
        "only_in_b": fb.join(fa, on="key", how="anti").height,
        "failed_in_a": int((fail_a & ~fail_b).sum()),
        "failed_in_b": int((fail_b & ~fail_a).sum()),
        "failed_in_both": int((fail_a & fail_b).sum()),
    }
    left_out["total"] = sum(left_out.values())
    scored = pl.col("status_a").is_in(_SCORED) & pl.col("status_b").is_in(_SCORED)
    both = pl.col("score_a").is_not_null() & pl.col("score_b").is_not_null()
    pairs = joined.filter(scored & both)
    return pairs.sort("key"), left_out


def _no_pairs_message(
    a: Side, b: Side, fa: pl.DataFrame, fb: pl.DataFrame, left: dict[str, int], on: str
) -> str:
    why = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in left.items() if v and k != "total")
    return (
        f"no `{on}` is scored ok or empty_context on both sides, so there is nothing to compare "
        f"(A: {fa.height} rows of {a.describe()}; B: {fb.height} rows of {b.describe()}; "
        f"left out: {why or 'none'}); check that both sides hold the same queries, or pair "
        "them on another column with --on COL"
    )


def _metric_names(pairs: pl.DataFrame) -> list[str]:
    names = ["score"]
    for col in pairs.columns:
        base = col.removesuffix("_a")
        if col.endswith("_a") and base.startswith(_RANK_PREFIXES) and f"{base}_b" in pairs.columns:
            names.append(base)
    return names


def _metric(pairs: pl.DataFrame, name: str, opts: CompareOptions) -> dict[str, Any]:
    cluster = [pl.col(_CLUSTER)] if _CLUSTER in pairs.columns else []
    both = pairs.select(pl.col(f"{name}_a"), pl.col(f"{name}_b"), *cluster).drop_nulls()
    figures = _paired(both, name, opts, cluster)
    if both.schema[f"{name}_a"] == pl.Boolean:  # pass/fail per row (hit@k): McNemar, as MLflow
        va, vb = pl.col(f"{name}_a"), pl.col(f"{name}_b")
        counts = both.select(a=(va & ~vb).sum(), b=(~va & vb).sum())
        figures["mcnemar"] = mcnemar(int(counts["a"][0]), int(counts["b"][0]))
    return figures


def _paired(
    both: pl.DataFrame, name: str, opts: CompareOptions, cluster: list[pl.Expr]
) -> dict[str, Any]:
    return paired_figures(
        both.get_column(f"{name}_a").cast(pl.Float64).to_list(),
        both.get_column(f"{name}_b").cast(pl.Float64).to_list(),
        resamples=opts.resamples,
        seed=opts.seed,
        clusters=both.get_column(_CLUSTER).to_list() if cluster else None,
        margin=opts.margin if name == "score" else None,
    )


_CLUSTER = "__cluster"
_QUERY_COLUMNS = ("query", "query_id", "question")  # a passthrough column naming the query


def _cluster_candidates(a: Side, b: Side) -> list[str]:
    """Columns that may name the query of a row: the column the run mapped to `query` (from its
    manifest), then query, query_id, question."""
    mapped = []
    for side in (a, b):
        manifest = _state_json(layout.manifest(side.path))
        columns = (manifest.get("describe") or {}).get("columns") or []
        if len(columns) > 1 and isinstance(columns[1], str):
            mapped.append(columns[1])
    return list(dict.fromkeys([*mapped, *_QUERY_COLUMNS]))


def _clusters(
    pairs: pl.DataFrame, candidates: Sequence[str], opts: CompareOptions
) -> tuple[dict[str, Any], pl.DataFrame]:
    """Which column clusters the pairs (given, or by default the first query column in which
    several pairs share a value), with each pair's cluster code in `__cluster`."""
    for column in candidates:
        if column == opts.on:
            value = pl.col("key").cast(pl.String)
        elif f"{column}_a" in pairs.columns or f"{column}_b" in pairs.columns:
            sides = [pl.col(f"{column}_{s}") for s in "ab" if f"{column}_{s}" in pairs.columns]
            value = pl.coalesce(*sides).cast(pl.String)
        else:
            continue
        # a pair without a value is a cluster of its own
        value = pl.coalesce(value, pl.lit("\x00") + pl.col("key").cast(pl.String))
        coded = pairs.with_columns(value.rank("dense").cast(pl.Int64).alias(_CLUSTER))
        n = int(coded.get_column(_CLUSTER).n_unique())
        if opts.cluster_by is None and n == pairs.height:
            continue  # every pair its own query: nothing to cluster
        how = (f"--cluster-by {column}" if opts.cluster_by else
               f"default: `{column}` names the query and {pairs.height - n:,} pairs share a "
               "query with another pair")  # fmt: skip
        return {"column": column, "clusters": n, "how": how}, coded
    return {"column": None, "clusters": pairs.height,
            "how": "none: no query column shared by several pairs; each pair resampled alone "
                   "(--cluster-by COL to cluster)"}, pairs  # fmt: skip


def _by_group(pairs: pl.DataFrame, opts: CompareOptions) -> dict[str, Any]:
    """Score deltas per value of `--group-by` (taken from side A; B's where A has none)."""
    column = opts.group_by or ""
    a_col, b_col = f"{column}_a", f"{column}_b"
    if column == opts.on:
        value = pl.col("key").cast(pl.String)
    else:
        value = pl.coalesce(pl.col(a_col), pl.col(b_col)).cast(pl.String)
    grouped = pairs.with_columns(value.alias("__group")).partition_by(
        "__group", as_dict=True, maintain_order=False
    )
    groups = []
    for (name, *_), frame in grouped.items():
        figures = paired_figures(
            frame.get_column("score_a").to_list(),
            frame.get_column("score_b").to_list(),
            resamples=opts.resamples,
            seed=opts.seed,
            test=False,
        )
        groups.append({"group": name, **figures})
    groups.sort(key=lambda g: (-g["n_pairs"], str(g["group"])))
    return {"column": column, "groups": groups}


def _changed_most(pairs: pl.DataFrame, opts: CompareOptions) -> list[dict[str, Any]]:
    """The `top` pairs with the largest |B − A| score change, with both sides' evidence."""
    if opts.top <= 0:
        return []
    delta = (pl.col("score_b") - pl.col("score_a")).alias("delta")
    top = (
        pairs.with_columns(delta)
        .filter(pl.col("delta").abs() > TIE_EPS)
        .sort([pl.col("delta").abs(), pl.col("key").cast(pl.String)], descending=[True, False])
        .head(opts.top)
    )
    out = []
    for row in top.iter_rows(named=True):
        item: dict[str, Any] = {"key": row["key"], "delta": row["delta"]}
        for s in ("a", "b"):
            item[s] = {f: row.get(f"{f}_{s}") for f in ("score", "status", "verdicts", "reason")}
        out.append(item)
    return out


def _biggest(pairs: pl.DataFrame, a: Side, b: Side, opts: CompareOptions) -> dict[str, Any]:
    """The `top` largest wins (B above A) and losses, each side with its ranked items."""
    delta = pl.col("score_b") - pl.col("score_a")
    moved = pairs.with_columns(delta.alias("delta"), pl.col("key").cast(pl.String).alias("_k"))
    chosen = {
        "wins": moved.filter(delta > TIE_EPS).sort(["delta", "_k"], descending=[True, False]),
        "losses": moved.filter(delta < -TIE_EPS).sort(["delta", "_k"]),
    }
    chosen = {k: v.head(max(opts.top, 0)) for k, v in chosen.items()}
    keys = [k for frame in chosen.values() for k in frame.get_column("_k").to_list()]
    evidence = {s.name: side_evidence(s.path, s.filters, opts.on, keys) for s in (a, b)}
    out: dict[str, Any] = {}
    for name, frame in chosen.items():
        out[name] = []
        for row in frame.iter_rows(named=True):
            item: dict[str, Any] = {"key": row["key"], "delta": row["delta"]}
            for s, side in (("a", a), ("b", b)):
                fields = ("score", "status", "verdicts", "reason")
                item[s] = {f: row.get(f"{f}_{s}") for f in fields}
                item[s] |= evidence[side.name].get(row["_k"]) or {}
            out[name].append(item)
    return out


def _side_info(side: Side, frame: pl.DataFrame) -> dict[str, Any]:
    counts = dict(frame.group_by("status").len().iter_rows())
    return {
        "source": str(side.path),
        "filters": dict(side.filters),
        "rows": frame.height,
        "rows_by_status": {s: int(counts.get(s, 0)) for s in (*_SCORED, STATUS_FAILED)},
        "judge": _manifest_judge(side.path),
    }


def _manifest_judge(path: OutPath) -> dict[str, Any] | None:
    """The judge configuration the output's manifest records (None for a foreign folder)."""
    try:
        manifest = read_manifest(path)
    except OutputError:
        return None
    if manifest is None:
        return None
    describe = manifest.get("describe", {})
    return {k: describe.get(k) for k in _JUDGE_KEYS}


def _judge_check(a: Side, b: Side, pairs: pl.DataFrame) -> dict[str, Any]:
    """Differences between the sides' judge configurations (manifest and row columns)."""
    ja, jb = _manifest_judge(a.path), _manifest_judge(b.path)
    differences, notes, settings = [], [], []
    if ja is None or jb is None:
        notes.append("a side has no ctxprec manifest: only the row columns were compared")
    else:
        ida, idb = dict(ja.pop("judge") or {}), dict(jb.pop("judge") or {})
        url_a, url_b = ida.pop("base_url", None), idb.pop("base_url", None)
        for key in sorted(set(ida) | set(idb)):
            if ida.get(key) != idb.get(key):
                differences.append(f"judge {key}: A {ida.get(key)!r}, B {idb.get(key)!r}")
                settings.append(f"judge {key}")
        for key in ("judge_model", "mode", "scale"):
            if ja.get(key) != jb.get(key):
                differences.append(f"{key}: A {ja.get(key)!r}, B {jb.get(key)!r}")
                settings.append(key)
        if url_a != url_b:
            notes.append(f"judge base URL: A {url_a!r}, B {url_b!r} (same provider settings)")
    for col in ("judge_model", "prompt_version"):
        if f"{col}_a" in pairs.columns and f"{col}_b" in pairs.columns:
            diff = pairs.filter(pl.col(f"{col}_a") != pl.col(f"{col}_b"))
            if diff.height:
                first = diff.row(0, named=True)
                differences.append(
                    f"{col} differs on {diff.height} of {pairs.height} pairs "
                    f"(e.g. A {first[f'{col}_a']!r}, B {first[f'{col}_b']!r})"
                )
                settings.append(col)
    judges = {k: (j or {}).get("judge_model") for k, j in (("a", ja), ("b", jb))}
    return {
        "same": not differences,
        "differences": differences,
        "settings": list(dict.fromkeys(settings)),  # the names of what differs, once each
        "notes": notes,
        "judges": judges,
    }


def _verdict_counts(fa: pl.DataFrame, fb: pl.DataFrame) -> tuple[np.ndarray, int]:
    """Per row judged on both sides (paired by key, any status), the 2×2 counts of its items
    judged by both (paired by position); and how many paired rows hold lists of different
    lengths (not the same items: left out)."""
    if "verdicts" not in fa.columns or "verdicts" not in fb.columns:
        return np.zeros((0, 4), dtype=np.int64), 0
    if fa.schema["key"] != fb.schema["key"]:
        fa, fb = (f.with_columns(pl.col("key").cast(pl.String)) for f in (fa, fb))
    va, vb = pl.col("va"), pl.col("vb")
    joined = (
        fa.select("key", va=pl.col("verdicts"))
        .join(fb.select("key", vb=pl.col("verdicts")), on="key", how="inner")
        .filter(va.is_not_null() & vb.is_not_null())
    )
    same = va.list.len() == vb.list.len()
    differ = joined.filter(~same).height
    items = (
        joined.filter(same & (va.list.len() > 0))
        .with_row_index("row")
        .explode(["va", "vb"])
        .drop_nulls(["va", "vb"])
    )
    counts = (
        items.group_by("row")
        .agg(
            (va & vb).sum().alias("n11"),
            (va & ~vb).sum().alias("n10"),
            (~va & vb).sum().alias("n01"),
            (~va & ~vb).sum().alias("n00"),
        )
        .sort("row")
        .select("n11", "n10", "n01", "n00")
    )
    return counts.to_numpy().astype(np.int64).reshape(-1, 4), differ


def _side_cost(side: Side, frame: pl.DataFrame) -> dict[str, Any]:
    """What judging the side's rows cost, twice: what the runs that wrote them paid (their
    `paid_*` columns; null for an output written before they existed) and what their verdicts
    cost when first paid (`verdict_*`: each call once, on the row that first used it), priced
    with the run's `[prices]` when run.json has them; and the whole output's figures as its
    summary states them."""
    sums = frame.select(t.sum() for t in token_columns(frame.columns)).row(0, named=True)
    if "paid_input_tokens" not in frame.columns:  # schema 1: not recorded
        sums["paid_input_tokens"] = sums["paid_output_tokens"] = None
    run = _state_json(layout.run_info(side.path))
    summary = _state_json(layout.summary_json(side.path))
    price = run.get("price") or {}
    judge = summary.get("judge") or {}
    cost = summary.get("cost_usd") or {}
    return {
        "judge_model": run.get("judge_model") or judge.get("model"),
        "prompt_version": run.get("prompt_version") or judge.get("prompt_version"),
        **{name: sums[name] for name in TOKEN_COLUMNS},
        "paid_cost_usd": _usd(price, sums["paid_input_tokens"], sums["paid_output_tokens"]),
        "verdict_cost_usd": _usd(
            price, sums["verdict_input_tokens"], sums["verdict_output_tokens"]
        ),
        "output_paid_cost_usd": cost.get("paid_all_runs"),
        # a summary written before the two figures had one, the verdicts' ("all_rows")
        "output_verdict_cost_usd": cost.get("verdicts_all_rows", cost.get("all_rows")),
        "output_judge_calls": judge.get("calls"),
    }


def _usd(price: Mapping[str, Any], t_in: Any, t_out: Any) -> float | None:
    """Tokens priced per million (full precision: compare.json keeps it)."""
    p_in, p_out = price.get("input_per_mtok"), price.get("output_per_mtok")
    if p_in is None or p_out is None or t_in is None or t_out is None:
        return None
    return float(t_in * p_in + t_out * p_out) / 1e6


def _state_json(path: OutPath) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def judge_agreement(
    a: Side, b: Side, fa: pl.DataFrame, fb: pl.DataFrame, judge: dict[str, Any],
    score: dict[str, Any], opts: CompareOptions,
) -> dict[str, Any] | None:  # fmt: skip
    """Item-level agreement of the two sides' judges on the items both judged (paired by key and
    position), the score difference it causes, and each side's cost. None when no item was
    judged on both sides (e.g. outputs without a verdicts column)."""
    counts, differ = _verdict_counts(fa, fb)
    if counts.sum() == 0:
        return None
    figures = agreement_figures(counts, resamples=opts.resamples, seed=opts.seed)
    return {
        "judges_differ": bool(judge["differences"]) or any("base URL" in n for n in judge["notes"]),
        **figures,
        "rows_not_same_items": differ,
        "score_delta": {k: score[k] for k in ("n_pairs", "mean_a", "mean_b", "mean_delta", "ci95")}
        | {"rows_changed": score["wins"] + score["losses"]},
        "cost": {"a": _side_cost(a, fa), "b": _side_cost(b, fb)},
    }


def _audit_model(side: Side) -> str | None:
    """The audit judge a side's run used (run.json), if any."""
    return (_state_json(layout.run_info(side.path)).get("audit") or {}).get("model")


def gate_figure(report: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What `--fail-drop` gates on, in words, and its figures: the difference of the corrected
    estimates when both sides carry them with an interval, else the judge's paired scores."""
    corrected = report.get("corrected")
    if corrected and corrected.get("ci95") is not None:
        return f"the corrected estimate (reference: {corrected['reference']})", corrected
    return "the judge's scores", report


def drop_gate(report: dict[str, Any], fail_drop: float, margin: float | None = None) -> str | None:
    """The failure message when B is worse than A by more than `fail_drop` and the CI's upper
    bound is below zero, or (with `margin`) when B is not shown to be within `margin` of A (the
    lower end of the CI below −margin); None when the gate passes. A drop of exactly
    `fail_drop` passes. The figure gated on is `gate_figure`'s (the message names it)."""
    which, fig = gate_figure(report)
    delta, (lo, hi) = fig["mean_delta"], fig["ci95"]
    if delta < -fail_drop - TIE_EPS and hi < 0:
        return (
            f"--fail-drop {fail_drop:g} failed on {which}: B's mean is {_num(-delta)} below A's "
            f"({_num(fig['mean_a'])} -> {_num(fig['mean_b'])}, 95% CI of the change "
            f"[{_num(lo)}, {_num(hi)}]), {_num(-delta - fail_drop)} more than allowed"
        )
    if margin is None:
        return None
    if fig is report:
        test = report.get("non_inferiority")
        shown = test is None or test["non_inferior"]
    else:
        shown = lo > -margin + TIE_EPS
    if shown:
        return None
    return (
        f"--fail-drop {fail_drop:g} --margin {margin:g} failed on {which}: B is not shown to be "
        f"within {margin:g} of A: the 95% CI of the change [{_num(lo)}, {_num(hi)}] "
        f"reaches below -{margin:g} (mean change {_num(delta)}; more pairs narrow the CI)"
    )


def _num(value: float) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{round_figure(value):.4f}"  # the one rounding rule (storage/core/figures.py)


def compare_outputs(
    a: str, b: str | None = None, *, a_where: Sequence[str] = (), b_where: Sequence[str] = (),
    **options: Any,
) -> dict[str, Any]:  # fmt: skip
    """The Python API of `ctxprec compare`: the report dict compare.json holds (judge agreement
    under `judge_agreement`). `compare_outputs("out/gpt-4.1", "out/gpt-4o-mini")`, or one output
    and two slices: `compare_outputs("out", a_where=["dt=2026-11-28"], b_where=["dt=..."])`.
    `options` are CompareOptions' fields (on, group_by, cluster_by, margin, resamples, ...)."""
    outputs = [a] if b is None else [a, b]
    side_a, side_b = sides_from_args(outputs, a_where, b_where)
    return compare(side_a, side_b, CompareOptions(**options))


def sides_from_args(
    outputs: Sequence[str], a_filters: Sequence[str], b_filters: Sequence[str]
) -> tuple[Side, Side]:
    """`A B [--a ..] [--b ..]` or `OUT --a COL=V --b COL=W` -> the two sides."""
    fa = tuple(parse_filter(f) for f in a_filters)
    fb = tuple(parse_filter(f) for f in b_filters)
    if len(outputs) == 1:
        if not fa or not fb:
            raise UserError(
                "one output given: say which rows are A and which are B, e.g. "
                "--a dt=2026-11-28 --b dt=2026-11-29 (or pass two output folders)"
            )
        path = local_output(outputs[0])
        return Side("A", path, fa), Side("B", path, fb)
    if len(outputs) != 2:
        raise UserError(f"compare takes one or two output folders, got {len(outputs)}")
    return Side("A", local_output(outputs[0]), fa), Side("B", local_output(outputs[1]), fb)
