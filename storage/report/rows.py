"""The rows the HTML report opens: the worst scored rows, the failed ones and a fixed sample of
the rest, read from the part files in two lazy passes (top-k over id, score and status, then
those ids' verdicts, reasons and texts from only the files that hold them), so a million-row
output never sits in memory.
"""

from __future__ import annotations

import bisect
import json
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from ctxprec.storage.core.constants import STATUS_FAILED, STATUS_OK
from ctxprec.storage.core.errors import StateDamagedError
from ctxprec.storage.files import confine, layout
from ctxprec.storage.files.atomic import atomic_write_bytes
from ctxprec.storage.files.objpath import OutPath
from ctxprec.storage.outdir import statefile
from ctxprec.storage.outdir.dataset import scan_parts

__all__ = [
    "KeptTexts",
    "RunTexts",
    "TextLookup",
    "Texts",
    "item_gains",
    "ranked_items",
    "report_rows",
    "text_columns",
    "text_exprs",
    "with_keys",
]

WORST = 50
SAMPLE = 50
FAILED = 20
_SEED = 35  # the sample is the same for the same ids, run after run
# id -> {"query": str | None, "expected": str | None, "context": list[str | None] | None}
Texts = dict[str, dict[str, Any]]
TextLookup = Callable[[Sequence[str]], Texts]


def text_columns(describe: Mapping[str, Any]) -> dict[str, str]:
    """{query|expected|context: input column} from the manifest's column mapping."""
    columns = describe.get("columns") or []
    names = dict(zip(("id", "query", "expected", "context"), columns, strict=False))
    return {k: str(v) for k, v in names.items() if k != "id" and isinstance(v, str)}


def report_rows(
    parts: Sequence[Path],
    *,
    group_by: str | None = None,
    texts: TextLookup | None = None,
    names: Mapping[str, str] | None = None,
    worst: int = WORST,
    sample: int = SAMPLE,
) -> dict[str, list[dict[str, Any]]]:
    """{"worst": [...], "failed": [...], "sample": [...]}: each row with its items. `names`:
    the input's query / expected / context columns, used when the output holds them
    (`--passthrough`); `texts` fetches the texts of the chosen ids otherwise."""
    if not parts:
        return {"worst": [], "failed": [], "sample": []}
    chosen, files = _choose(_scan(parts, "_file"), worst, sample)
    ids = [i for group in chosen.values() for i in group]
    if not ids:  # parts with no row in them (an empty input)
        return {"worst": [], "failed": [], "sample": []}
    lf = _scan([p for p in parts if str(p) in files])  # only the files holding a chosen row
    cols = set(lf.collect_schema().names())
    wide = _wide(lf, cols, ids, group_by, names or {})
    found = {str(r["id"]): r for r in wide.iter_rows(named=True)}
    missing = [i for i in ids if i in found and not _has_texts(found[i])]
    fetched = texts(missing) if texts and missing else {}
    return {
        name: [_row(found[i], fetched.get(i), group_by) for i in group if i in found]
        for name, group in chosen.items()
    }


def _scan(parts: Sequence[Path], file_column: str | None = None) -> pl.LazyFrame:
    return scan_parts(parts, file_column)


def _choose(lf: pl.LazyFrame, worst: int, sample: int) -> tuple[dict[str, list[str]], set[str]]:
    """The ids of each section and the files that hold them, in one pass over id, score and
    status: the lowest scores, the lowest hashes (the sample, once the lowest scores are out)
    and the failed rows, each a top-k (`RunTexts` keeps the same three during a run). Each
    top-k is sorted after: `bottom_k` gives its rows in no set order."""
    key = pl.col("id").cast(pl.String)
    slim = lf.select(key.alias("id"), pl.col("score"), pl.col("status"), pl.col("_file"))
    ok = slim.filter(pl.col("status") == STATUS_OK)
    low = ok.bottom_k(worst, by=["score", "id"]).sort(["score", "id"])
    hashed = (
        ok.with_columns(pl.col("id").hash(_SEED).alias("h"))
        .bottom_k(worst + sample, by=["h", "id"])
        .sort(["h", "id"])
    )
    failed = slim.filter(pl.col("status") == STATUS_FAILED).bottom_k(FAILED, by="id").sort("id")
    low_df, hashed_df, failed_df = pl.collect_all([low, hashed, failed], engine="streaming")
    low_ids = low_df.get_column("id").to_list()
    rest = hashed_df.filter(~pl.col("id").is_in(low_ids)).head(sample)
    picked = rest.sort(["score", "id"], descending=[True, False])
    files = {str(f) for frame in (low_df, picked, failed_df) for f in frame.get_column("_file")}
    sections = {
        "worst": low_ids,
        "failed": failed_df.get_column("id").to_list(),
        "sample": picked.get_column("id").to_list(),
    }
    return sections, files


class _BottomK:
    """The `k` smallest keys offered so far, in order (k is at most ~100: a sorted list)."""

    __slots__ = ("k", "keys")

    def __init__(self, k: int) -> None:
        self.k = k
        self.keys: list[tuple[Any, ...]] = []

    def offer(self, key: tuple[Any, ...]) -> None:
        keys = self.keys
        if len(keys) >= self.k:
            if not key < keys[-1]:
                return
            keys.pop()
        bisect.insort(keys, key)

    def ids(self) -> set[str]:
        return {key[-1] for key in self.keys}


class RunTexts:
    """The texts of the rows summary.html may open, kept while a run scores them, so that the
    report does not read the input a second time (a 1 M-item input: ~1.5 s of a warm re-run).

    Each section's top-k (as `_choose` picks them: the lowest (score, id) of the ok rows, the
    lowest (id hash, id) of the ok rows, the lowest ids of the failed rows) is kept over the rows as
    they come, chunk by chunk, and the texts of the rows in any of them are held (~170 rows).
    A top-k kept this way is the top-k of the whole run, so it holds whatever `_choose` picks
    from this run's rows. Rows of an earlier run in the same output (a resumed or incremental
    run) are left to `lookup`'s fallback, the input read back."""

    def __init__(self, flag_column: str, worst: int = WORST, sample: int = SAMPLE) -> None:
        self._flag = flag_column  # the reader's mark of a row it could not read as given
        self._low, self._hashed = _BottomK(worst), _BottomK(worst + sample)
        self._failed = _BottomK(FAILED)
        self._lock = threading.Lock()
        self._texts: Texts = {}

    def add(
        self,
        frame: pl.DataFrame,
        scores: Sequence[float | None],
        statuses: Sequence[str],
        contexts: Sequence[Sequence[str] | None] | None = None,
    ) -> None:
        """One chunk: its input rows as read (id, query, expected, context) and their scores
        and statuses in the same order; `contexts`: each row's items when an extractor made
        them (the frame has no context column then). Call it from a worker thread (a Python
        pass over the chunk's rows: ~0.8 ms for 1,000)."""
        if frame.height != len(scores) or ("context" not in frame.columns and contexts is None):
            return
        if contexts is not None and len(contexts) != frame.height:
            return
        column = frame.get_column("id").cast(pl.String)
        ids = column.to_list()
        hashes = column.hash(_SEED).to_list()
        rows = zip(ids, hashes, scores, statuses, strict=True)
        with self._lock:
            low, hashed, failed = self._low, self._hashed, self._failed
            for key, h, score, status in rows:
                if key is None:
                    continue
                if status == STATUS_OK and score is not None:
                    low.offer((score, key))
                    hashed.offer((h, key))
                elif status == STATUS_FAILED:
                    failed.offer((key,))
            kept = low.ids() | hashed.ids() | failed.ids()
            self._texts = {k: v for k, v in self._texts.items() if k in kept}
            new = [i for i, key in enumerate(ids) if key in kept and key not in self._texts]
            self._texts.update(_frame_texts(frame, new, self._flag, contexts))

    def lookup(self, fallback: TextLookup | None) -> TextLookup:
        """The kept texts, and `fallback`'s for ids this run did not keep."""

        def texts(ids: Sequence[str]) -> Texts:
            got = {i: self._texts[i] for i in ids if i in self._texts}
            rest = [i for i in ids if i not in got]
            if rest and fallback is not None:
                got.update(fallback(rest))
            return got

        return texts


class KeptTexts:
    """The texts of the rows summary.html opens that the output does not hold, kept in the
    output's state (`layout.report_texts`) once a report shows them: `ctxprec summary` shows
    them again without the input (a JSON Lines, CSV or object-store input is never read back,
    an extractor's items never were in it). A lookup: the kept texts first, then `fallback`'s;
    `save` keeps exactly what the last report showed."""

    def __init__(self, outdir: OutPath, fallback: TextLookup | None) -> None:
        self._outdir, self._fallback = outdir, fallback
        self._kept = _read_kept(outdir)
        self._shown: Texts = {}

    def __call__(self, ids: Sequence[str]) -> Texts:
        got = {i: self._kept[i] for i in ids if i in self._kept}
        rest = [i for i in ids if i not in got]
        if rest and self._fallback is not None:
            got.update(self._fallback(rest))
        self._shown.update(got)
        return got

    def save(self) -> None:
        if self._shown == self._kept:
            return
        path = layout.report_texts(self._outdir)
        data = json.dumps({"texts": self._shown}, ensure_ascii=False).encode()
        if not self._shown or len(data) > statefile.REPORT_TEXTS.cap:
            confine.unlink(self._outdir, path)  # too big to keep: the next summary reads the input
            return
        atomic_write_bytes(path, data)


def _read_kept(outdir: OutPath) -> Texts:
    """report-texts.json as a checked state file; a damaged one is only a lost cache."""
    path = layout.report_texts(outdir)
    try:
        data = statefile.read_json(outdir, path, statefile.REPORT_TEXTS, "it is rewritten")
    except StateDamagedError as exc:
        print(f"ctxprec: note: {str(exc).split('; nothing was changed')[0]}; ignored (it only "
              "holds the texts summary.html shows)", file=sys.stderr)  # fmt: skip
        return {}
    return dict(data["texts"]) if data else {}


def _frame_texts(
    frame: pl.DataFrame,
    rows: list[int],
    flag: str,
    contexts: Sequence[Sequence[str] | None] | None = None,
) -> Texts:
    """The query, expected and context of `rows` of a chunk as read (the context from
    `contexts` when given), in `TextLookup`'s shape; a row the reader flagged (`flag`) or whose
    values are not texts is left out."""
    if not rows:
        return {}
    fields = [c for c in ("query", "expected", "context") if c in frame.columns]
    if contexts is not None:
        fields = [c for c in fields if c != "context"]
    taken = frame[rows]
    flagged = taken.get_column(flag).to_list() if flag in taken.columns else [None] * len(rows)
    out: Texts = {}
    ids = taken.get_column("id").cast(pl.String).to_list()
    try:
        values = taken.select(fields).to_dicts()
    except (pl.exceptions.PolarsError, UnicodeDecodeError, ValueError):
        return {}
    if contexts is not None:
        for i, row in zip(rows, values, strict=True):
            items = contexts[i]
            row["context"] = list(items) if items is not None else None
        fields.append("context")
    for key, problem, row in zip(ids, flagged, values, strict=True):
        if problem is not None or key is None:
            continue
        context = row.get("context")
        if context is not None and not (
            isinstance(context, list) and all(isinstance(c, str | None) for c in context)
        ):
            continue
        if not all(isinstance(row.get(f), str | None) for f in ("query", "expected")):
            continue
        out[key] = {field: row[field] for field in fields}
    return out


def _wide(
    lf: pl.LazyFrame, cols: set[str], ids: list[str], group_by: str | None, names: Mapping[str, str]
) -> pl.DataFrame:
    """Second pass: the chosen rows' scored columns and the texts the output holds."""
    keep = ["score", "status", "error", "verdicts", "verdict_reasons", "label_verdicts"]
    exprs = [pl.col("id").cast(pl.String).alias("id")]
    exprs += [pl.col(c) for c in keep if c in cols]
    if group_by and group_by in cols:
        exprs.append(pl.col(group_by).cast(pl.String).alias("_group"))
    exprs += text_exprs(cols, names, taken=("id", *keep))
    chosen = with_keys(lf, pl.col("id").cast(pl.String), ids)
    return chosen.select(exprs).unique("id", keep="first").collect(engine="streaming")


def text_exprs(
    cols: set[str], names: Mapping[str, str], taken: Sequence[str] = ()
) -> list[pl.Expr]:
    """The query, expected and context columns the output holds (`--passthrough`), as
    `_query`, `_expected` and `_context`."""
    exprs = []
    for field, column in names.items():
        if column in cols and column not in taken:
            kind = pl.List(pl.String) if field == "context" else pl.String
            exprs.append(pl.col(column).cast(kind, strict=False).alias(f"_{field}"))
    return exprs


def with_keys(
    lf: pl.LazyFrame, key: pl.Expr, keys: Sequence[str], *, keep: bool = True
) -> pl.LazyFrame:
    """The rows whose `key` (as text) is among `keys` (or, `keep=False`, is not): a semi / anti
    join on a small frame, which Polars runs in one pass (a literal `is_in` list costs ~40 ms
    even on a 500-row part)."""
    wanted = pl.LazyFrame({"_key_": pl.Series(list(keys), dtype=pl.String)})
    tagged = lf.with_columns(key.cast(pl.String).alias("_key_"))
    return tagged.join(wanted, on="_key_", how="semi" if keep else "anti").drop("_key_")


def _has_texts(row: Mapping[str, Any]) -> bool:
    return row.get("_context") is not None and row.get("_query") is not None


def item_gains(verdicts: Sequence[bool | None] | None) -> list[float | None]:
    """What each relevant item added to the row's average precision (precision at its position
    over the number of relevant items); None for the others, or for all when one failed."""
    verdicts = list(verdicts or [])
    relevant = sum(1 for v in verdicts if v)
    if not relevant or any(v is None for v in verdicts):
        return [None] * len(verdicts)
    out: list[float | None] = []
    hits = 0
    for i, v in enumerate(verdicts):
        hits += bool(v)
        out.append(hits / (i + 1) / relevant if v else None)
    return out


def ranked_items(
    verdicts: Sequence[bool | None] | None,
    reasons: Sequence[str | None] | None,
    context: Sequence[str | None] | None,
    labels: Sequence[bool | None] | None = None,
) -> list[dict[str, Any]]:
    """A row's items in rank order: position, text, verdict, reason, label, AP added."""
    verdicts = list(verdicts or [])
    count = max(len(verdicts), len(context or []))
    gains = item_gains(verdicts)
    return [
        {
            "position": i + 1,
            "text": _at(context, i),
            "verdict": _at(verdicts, i),
            "reason": _at(reasons, i),
            "label": _at(labels, i),
            "added": _at(gains, i),
        }
        for i in range(count)
    ]


def _row(
    r: Mapping[str, Any], fetched: Mapping[str, Any] | None, group_by: str | None
) -> dict[str, Any]:
    """One report row: its figures and its ranked items."""
    texts = fetched or {}
    context = r.get("_context") if r.get("_context") is not None else texts.get("context")
    items = ranked_items(
        r.get("verdicts"), r.get("verdict_reasons"), context, r.get("label_verdicts")
    )
    query = r.get("_query") if r.get("_query") is not None else texts.get("query")
    expected = r.get("_expected") if r.get("_expected") is not None else texts.get("expected")
    return {
        "id": r["id"],
        "score": r.get("score"),
        "status": r.get("status"),
        "error": r.get("error"),
        "group": r.get("_group") if group_by else None,
        "query": query,
        "expected": expected,
        "texts": context is not None,
        "items": items,
    }


def _at(values: Sequence[Any] | None, i: int) -> Any:
    return values[i] if values is not None and i < len(values) else None
