"""The whole row table of one output, queried a page at a time for `ctxprec view`: search,
filters and sort are lazy Polars queries over the committed part files, and only the page (or
the one row opened) is ever collected, so a million-row output never sits in memory.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import polars as pl
import pyarrow.dataset as ds

from ctxprec.storage.core.constants import STATUS_EMPTY, STATUS_FAILED, STATUS_OK
from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.files import layout
from ctxprec.storage.files.confine import read_regular
from ctxprec.storage.files.objpath import ObjPath, OutPath
from ctxprec.storage.outdir.dataset import scan_parts
from ctxprec.storage.outdir.ownership import (
    incomplete_parts,
    missing_rows_line,
    part_files,
    read_manifest,
)
from ctxprec.storage.report.summary import BANDS

__all__ = [
    "BAND_NAMES",
    "MAX_ITEMS",
    "SORTS",
    "STATUSES",
    "RowFilter",
    "RowTable",
    "ranked_items",
]

STATUSES = (STATUS_OK, STATUS_EMPTY, STATUS_FAILED)
BAND_NAMES = tuple(name for name, *_ in BANDS)
# "": the order of the part files; "score": lowest first; "-score": highest first; "id"
SORTS = ("", "score", "-score", "id")
MAX_ITEMS = 200  # items of one opened row; the rest are counted, not sent
MAX_GROUP_VALUES = 200
_LIST_TEXT = 300  # characters of a query or an error in the list
_ITEM_TEXT = 4000  # characters of an item text or a reason in an opened row
_EPS = 1e-9  # as summary.py: absorbs float noise in score / scale
_ITEM_COLUMNS = ("verdicts", "verdict_reasons", "label_verdicts")
_ROW = "__ctxprec_row"  # a row's position in the scan, for sorts


@dataclass(frozen=True)
class RowFilter:
    """Which rows a page shows: `search` (a case-insensitive piece of the id or the query),
    a status, a score band, and a value of a grouping column."""

    search: str = ""
    status: str | None = None
    band: str | None = None
    group_by: str | None = None
    group: str | None = None


# Polars' streaming engine: joins, sorts and group-bys in bounded chunks
_STREAMING: Final = "streaming"


def _collect(lf: pl.LazyFrame) -> pl.DataFrame:
    got: pl.DataFrame = lf.collect(engine=_STREAMING)
    return got


def band_expr(scale: float) -> pl.Expr:
    """The band of each score as summary.md defines them (ctxprec.storage.report.summary.BANDS):
    "none" is exactly 0, each other band runs from its lower bound up to the next one."""
    n = pl.col("score") / scale if scale > 0 else pl.col("score") * 0.0
    expr = pl.when(n.is_null()).then(pl.lit(None, pl.String)).when(n < _EPS).then(pl.lit("none"))
    ranged = sorted((b for b in BANDS if b[0] != "none"), key=lambda b: b[1])
    for name, _, upper, *_ in ranged[:-1]:
        expr = expr.when(n < upper - _EPS).then(pl.lit(name))
    return expr.otherwise(pl.lit(ranged[-1][0]))


def _clip(value: Any, limit: int) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"… ({len(value) - limit:,} more characters)"
    return value


def _plain(value: Any) -> Any:
    """A cell as JSON can carry it (timestamps as ISO text)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and value != value:  # NaN
        return None
    return value


def ranked_items(
    verdicts: Sequence[bool | None] | None,
    reasons: Sequence[str | None] | None,
    labels: Sequence[bool | None] | None = None,
    texts: Sequence[str | None] | None = None,
) -> list[dict[str, Any]]:
    """Each item in rank order with its verdict, reason, label and text, and for a relevant
    item the precision at its position and what it added to the row's average precision
    (that precision ÷ the number of relevant items: the gains add up to the unrounded AP)."""
    verdicts = list(verdicts or [])
    n = max(len(verdicts), len(reasons or []), len(texts or []))
    relevant = sum(1 for v in verdicts if v is True)
    hits, out = 0, []
    for i in range(min(n, MAX_ITEMS)):
        verdict = verdicts[i] if i < len(verdicts) else None
        precision = gain = None
        if verdict is True:
            hits += 1
            precision = hits / (i + 1)
            gain = precision / relevant
        out.append(
            {
                "position": i + 1,
                "verdict": verdict,
                "reason": _clip(_at(reasons, i), _ITEM_TEXT),
                "label": _at(labels, i),
                "text": _clip(_at(texts, i), _ITEM_TEXT),
                "precision": precision,
                "gain": gain,
            }
        )
    return out


def _at(values: Sequence[Any] | None, i: int) -> Any:
    return values[i] if values is not None and i < len(values) else None


class RowTable:
    """One output folder (local or object store), read only: its part files as they were
    committed when the table was opened, and what its manifest and run record say."""

    def __init__(self, outdir: OutPath) -> None:
        manifest = read_manifest(outdir)
        if manifest is None:
            raise OutputError(
                f"{outdir} holds no ctxprec output (no {layout.manifest(outdir)}); pass an "
                "OUTDIR written by `ctxprec score`"
            )
        self.outdir = outdir
        if incomplete := incomplete_parts(outdir):  # never a Parquet error at query time
            raise OutputError(
                f"{missing_rows_line(outdir, incomplete)}: run the same `ctxprec score` command "
                "again (without --overwrite) to score them again, then view the output"
            )
        self.parts = part_files(outdir)
        self._stamps = _stamps(self.parts)  # as checked: a part changed later is not read
        self.describe: dict[str, Any] = manifest.get("describe") or {}
        self.scale = float(self.describe.get("scale", 1.0))
        self.run = _json_or_empty(layout.run_info(outdir))
        self.columns = list(self.scan().collect_schema().names()) if self.parts else []
        names = list(self.describe.get("columns") or [])
        self.query_column = self._present(names[1] if len(names) > 1 else None)
        self.context_column = self._present(names[3] if len(names) > 3 else None)
        self.group_columns = self._groups()
        # what a search matches, said where the search is typed (None: ids and query texts)
        query = names[1] if len(names) > 1 and isinstance(names[1], str) else "QUERY_COLUMN"
        self.search_note = (
            None
            if self.query_column
            else f"this output keeps no query text, so a search matches ids only: score with "
            f"--passthrough {query} to search the queries"
        )

    # -- what the output is --------------------------------------------------------------------
    def _present(self, name: Any) -> str | None:
        return name if isinstance(name, str) and name in self.columns else None

    def _groups(self) -> list[str]:
        """The run's --group-by column(s) and partition columns that the parts hold."""
        given = self.run.get("group_by")
        wanted = [given] if isinstance(given, str) else list(given or [])
        wanted += list(self.describe.get("partition_by") or [])
        return [c for c in dict.fromkeys(wanted) if isinstance(c, str) and c in self.columns]

    def scan(self) -> pl.LazyFrame:
        """The part files as one lazy frame (never collected whole). Each local part is first
        found as it was when it was checked against its record (the same regular file, of the
        same size and time): one swapped for a link or a FIFO, or rewritten, since the table was
        opened is an OutputError here, never a read that follows it or blocks on it."""
        if _stamps(self.parts) != self._stamps:
            raise OutputError(
                f"the part files of {self.outdir} changed since they were checked; nothing was "
                "read from them: restart `ctxprec view` to check them again"
            )
        if not self.parts:
            schema = {"id": pl.String(), "score": pl.Float64(), "status": pl.String()}
            return pl.LazyFrame(schema=schema)
        if isinstance(self.outdir, ObjPath):  # read through pyarrow.fs, as `score` writes
            paths = [p.path for p in self.parts if isinstance(p, ObjPath)]
            dataset = ds.dataset(
                paths,
                filesystem=self.outdir.fs,
                format="parquet",
                partitioning="hive",
                partition_base_dir=self.outdir.path,
            )
            return pl.scan_pyarrow_dataset(dataset)
        return scan_parts([str(p) for p in self.parts])

    def group_values(self) -> dict[str, list[dict[str, Any]]]:
        """Per grouping column, its most frequent values with their row counts."""
        out = {}
        for column in self.group_columns:
            got = (
                self.scan()
                .group_by(pl.col(column).cast(pl.String).alias("value"))
                .len()
                .sort(["len", "value"], descending=[True, False], nulls_last=True)
                .head(MAX_GROUP_VALUES)
                .collect(engine=_STREAMING)
            )
            out[column] = [{"value": v, "rows": int(n)} for v, n in got.iter_rows()]
        return out

    def summary(self) -> dict[str, Any]:
        """summary.json as written (the figures the page heads with); {} when there is none."""
        return _json_or_empty(layout.summary_json(self.outdir))

    # -- queries -------------------------------------------------------------------------------
    def _where(self, lf: pl.LazyFrame, f: RowFilter) -> pl.LazyFrame:
        if f.status:
            lf = lf.filter(pl.col("status") == f.status)
        if f.band:
            lf = lf.filter(band_expr(self.scale) == f.band)
        if f.group_by and f.group is not None:
            lf = lf.filter(pl.col(f.group_by).cast(pl.String) == f.group)
        term = f.search.strip().lower()
        if term:
            hit = pl.col("id").cast(pl.String).str.to_lowercase().str.contains(term, literal=True)
            if self.query_column:
                text = pl.col(self.query_column).cast(pl.String).str.to_lowercase()
                hit = hit | text.str.contains(term, literal=True).fill_null(False)
            lf = lf.filter(hit)
        return lf

    def count_all(self) -> int:
        return self.count(RowFilter())

    def count(self, f: RowFilter) -> int:
        got = self._where(self.scan(), f).select(pl.len()).collect(engine=_STREAMING)
        return int(got.item())

    def _list_columns(self) -> list[pl.Expr]:
        cols = [
            pl.col("id"),
            pl.col("score"),
            pl.col("status"),
            band_expr(self.scale).alias("band"),
        ]
        cols += [pl.col(c) for c in self.group_columns]
        if self.query_column:
            cols.append(pl.col(self.query_column).cast(pl.String).alias("query"))
        for name in ("relevant_count", "context_count", "error", "verdicts"):
            if name in self.columns:
                cols.append(pl.col(name))
        return cols

    def page(self, f: RowFilter, sort: str, number: int, size: int) -> dict[str, Any]:
        """Rows `size * (number - 1)` on of the filtered, sorted table, and how many match.
        A sort orders slim keys only (a row number and the score, or the id), then reads the
        page's rows: it never carries the reasons and verdicts of every row."""
        total = self.count(f)
        offset = size * (number - 1)
        if sort == "id":
            keys = self._where(self.scan(), f).select("id").sort("id").slice(offset, size)
            ids = _collect(keys).get_column("id")
            got = self._picked(pl.col("id"), ids)
        elif sort:
            keys = self._where(self._numbered(), f).select(_ROW, "score")
            by = keys.sort(["score", _ROW], descending=[sort == "-score", False], nulls_last=True)
            got = self._picked(pl.col(_ROW), _collect(by.slice(offset, size)).get_column(_ROW))
        else:
            got = _collect(
                self._where(self.scan(), f).select(self._list_columns()).slice(offset, size)
            )
        rows = [self._list_row(r) for r in got.iter_rows(named=True)]
        found: dict[str, Any] = {"total": total, "page": number, "size": size, "rows": rows}
        if f.search.strip() and self.search_note:
            found["note"] = self.search_note
        return found

    def _numbered(self) -> pl.LazyFrame:
        """The scan with each row's position in it (a stable tie-break, cheaper than the id)."""
        return self.scan().with_row_index(_ROW)

    def _picked(self, key: pl.Expr, wanted: pl.Series) -> pl.DataFrame:
        """The list columns of the rows whose `key` (id or row number) is in `wanted`, in the
        order given."""
        name = wanted.name
        lf = self._numbered() if name == _ROW else self.scan()
        order = pl.DataFrame({name: wanted, "_at": range(len(wanted))})
        cols = [*self._list_columns(), *([key] if name == _ROW else [])]
        got = _collect(lf.filter(key.is_in(wanted.implode())).select(cols))
        picked = got.join(order, on=name).sort("_at").drop("_at")
        return picked.drop(_ROW) if name == _ROW else picked

    def _list_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: _plain(v) for k, v in row.items() if k != "verdicts"}
        for key in ("query", "error"):
            if key in out:
                out[key] = _clip(out[key], _LIST_TEXT)
        verdicts = row.get("verdicts")
        if verdicts is not None:
            out["verdicts"] = list(verdicts[:MAX_ITEMS])
        return out

    def row(self, row_id: str) -> dict[str, Any] | None:
        """One row by its id (given as text: an integer id column is matched as text), with
        its ranked items; None when no row has that id."""
        lf = self.scan().filter(pl.col("id").cast(pl.String) == row_id)
        got = (
            lf.with_columns(band_expr(self.scale).alias("band")).head(1).collect(engine=_STREAMING)
        )
        if got.is_empty():
            return None
        return self._detail(got.row(0, named=True))

    def _detail(self, row: dict[str, Any]) -> dict[str, Any]:
        texts = row.get(self.context_column) if self.context_column else None
        items = ranked_items(
            row.get("verdicts"), row.get("verdict_reasons"), row.get("label_verdicts"), texts
        )
        skip = {*_ITEM_COLUMNS, "id", "score", "status", "band", "error", "reason"}
        skip |= {c for c in (self.context_column, self.query_column) if c}
        fields = [
            [k, _clip(_plain(v) if not isinstance(v, list) else json.dumps(v, default=str), 1000)]
            for k, v in row.items()
            if k not in skip
        ]
        n = max(len(row.get("verdicts") or []), len(texts or []))
        return {
            "id": _plain(row["id"]),
            "score": row.get("score"),
            "status": row.get("status"),
            "band": row.get("band"),
            "error": _clip(row.get("error"), _ITEM_TEXT),
            "reason": _clip(row.get("reason"), 3 * _ITEM_TEXT),
            "query": _clip(row.get(self.query_column), _ITEM_TEXT) if self.query_column else None,
            "items": items,
            "items_total": n,
            "texts": texts is not None,
            "fields": fields,
        }


_MAX_JSON = 64 << 20  # summary.json or run.json read back, at most


def _stamps(parts: Sequence[OutPath]) -> list[tuple[int, int, int, int] | None]:
    """What each local part file is now (device, inode, size, time; None: not a regular file
    reached through no link): one lstat each, far below a query's own cost."""
    found: list[tuple[int, int, int, int] | None] = []
    for path in parts:
        if isinstance(path, ObjPath):
            continue  # an object store: no links, no FIFOs
        try:
            info = os.lstat(path)
        except OSError:
            found.append(None)
            continue
        regular = stat.S_ISREG(info.st_mode)
        found.append(
            (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) if regular else None
        )
    return found


def _json_or_empty(path: OutPath) -> dict[str, Any]:
    """A JSON file of the output as a dict, {} when it is missing or not one: read through no
    link, never blocking on a FIFO, never past the cap."""
    try:
        if isinstance(path, ObjPath):
            raw = path.read_bytes() if path.stat().st_size <= _MAX_JSON else None
        else:
            raw = read_regular(path, _MAX_JSON)
        data = json.loads(raw) if raw is not None else {}
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}
