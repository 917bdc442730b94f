"""DataFrames in and out: `score_frame(data, ...)` scores a pandas DataFrame, a Polars DataFrame
or LazyFrame, a PyArrow Table or a list of dicts, and returns the same kind of object with the
scored columns of the Parquet output added, in the input's row order, plus a summary.

One code path with `ctxprec score`: the rows are written to a Parquet file in a temporary folder
ctxprec makes, scored by the local engine into an output folder there (memo, rate limits,
retries, statuses and errors as the CLI's), read back and the folder removed. The plain call
works in a script and inside a running event loop (a Jupyter cell): there the run gets an event
loop of its own in a worker thread. pandas is never imported here: a pandas frame is converted
by PyArrow, which imports it only when given one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import re
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import anyio
import anyio.from_thread
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ctxprec.analysis.quality_gate import run_mean
from ctxprec.analysis.verdict import EvalVerdict, decide, thresholds_of
from ctxprec.config import API_OPTIONS, Config, column_map_flags, with_settings
from ctxprec.engines.local import run_score
from ctxprec.run.driver import RunOptions, RunResult, run_blocking
from ctxprec.spelling import camel_case_keywords, snake_keys
from ctxprec.storage.core.constants import STATUS_EMPTY, STATUS_FAILED, STATUS_OK
from ctxprec.storage.core.errors import ConfigError, CtxprecError, first_meaningful
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.core.settings import DEFAULT_EXPECTED, named_as_options, settings
from ctxprec.storage.files import layout
from ctxprec.storage.files.objpath import out_path
from ctxprec.storage.outdir.ownership import part_files
from ctxprec.storage.outdir.schema import output_schema

__all__ = ["SCORER_ID", "FrameSummary", "ScoredFrame", "score_frame", "score_frame_async"]

SCORER_ID = "context-precision"  # the frame's one scorer, as named in thresholds and verdicts
_ROW = "__ctxprec_row__"  # the run's id: each row's position in the frame
_NOT_SCORABLE = "not_scorable"  # a row's status and columns= role: nothing to judge, held out
_ERRORS_SHOWN = 3
T = TypeVar("T")

# options by their short names (any setting whose name no other section has), else dotted keys;
# not the settings that have no meaning for rows in memory (where the output goes, logging)
_NOT_FOR_FRAMES = ("output.partition_by", "output.sinks", "output.charts", "gate.fail_under",
                   "run.log_level", "run.debug", "judge.batch_api")  # fmt: skip
_SHORT: dict[str, str] = {}
for _s in settings():
    if _s.section not in ("columns", "storage") and _s.key not in _NOT_FOR_FRAMES:
        _SHORT[_s.name] = "" if _s.name in _SHORT else _s.key  # "": two sections have it


@dataclasses.dataclass(frozen=True)
class FrameSummary:
    """What the run's summary.json says, the figures rounded as everywhere: the rows by status,
    the mean score and its 95 % interval over the scored rows, the corrected estimate (labels
    or an audit judge, else None), calls, memo hits and tokens; `verdict` judges the thresholds
    and outcomes; `data` is summary.json whole."""

    rows: int
    statuses: dict[str, int]
    mean: float | None
    ci95: tuple[float, float] | None
    median: float | None
    estimate: dict[str, Any] | None
    judge_calls: int
    memo_hits: int
    tokens: dict[str, Any]
    cost_usd: Any
    verdict: EvalVerdict
    data: dict[str, Any]


class ScoredFrame(NamedTuple):
    """`frame, summary = ctxprec.score_frame(...)`: the scored rows (the input's kind) and the
    summary."""

    frame: Any
    summary: FrameSummary

    @property
    def verdict(self) -> EvalVerdict:
        return self.summary.verdict


# -- the input's kind, to Arrow and back ------------------------------------------------------
def _kind(data: Any) -> str:
    module = type(data).__module__.partition(".")[0]
    if module == "pandas" and hasattr(data, "columns"):
        return "pandas"
    if isinstance(data, pl.LazyFrame):
        return "polars-lazy"
    if isinstance(data, pl.DataFrame):
        return "polars"
    if isinstance(data, pa.Table | pa.RecordBatch):
        return "arrow"
    if isinstance(data, list) and all(isinstance(r, Mapping) for r in data):
        return "rows"
    raise TypeError(
        "score_frame takes a pandas DataFrame, a Polars DataFrame or LazyFrame, a PyArrow "
        f"Table or a list of dicts; got {type(data).__module__}.{type(data).__name__}"
    )


def _to_arrow(data: Any, kind: str) -> tuple[Any, pa.Table]:
    """(the data as it will be returned into, its rows as an Arrow table)."""
    try:
        if kind == "pandas":
            return data, pa.Table.from_pandas(data, preserve_index=False)
        if kind == "polars-lazy":
            frame = data.collect()
            return frame, frame.to_arrow()
        if kind == "polars":
            return data, data.to_arrow()
        if kind == "arrow":
            table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
            return data, table
        return data, pa.Table.from_pylist([dict(r) for r in data])
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise ConfigError(f"score_frame cannot read the rows as Arrow: {exc}") from None


def _joined(data: Any, kind: str, scored: pa.Table) -> Any:
    """The input with the scored columns appended, rows in order."""
    if kind == "pandas":
        frame = scored.to_pandas()
        return data.assign(**{name: frame[name].array for name in scored.column_names})
    if kind in ("polars", "polars-lazy"):
        added = pl.DataFrame(pl.from_arrow(scored))
        out = data.hstack(added.get_columns())
        return out.lazy() if kind == "polars-lazy" else out
    if kind == "arrow":
        table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
        for name in scored.column_names:
            table = table.append_column(scored.schema.field(name), scored.column(name))
        return table
    return [{**row, **extra} for row, extra in zip(data, scored.to_pylist(), strict=True)]


# -- settings ---------------------------------------------------------------------------------
def _settings(
    config: Config | None,
    model: str | None,
    columns: Any,
    options: Mapping[str, Any] | None,
    audit: Mapping[str, Any],
) -> Config:
    values: dict[str, Any] = {} if model is None else {"judge.model": model}
    for name, value in snake_keys(options or {}, "options").items():
        key = name if "." in name else _SHORT.get(name)
        if not key or key in _NOT_FOR_FRAMES or key.partition(".")[0] in ("columns", "storage"):
            raise ConfigError(
                f"unknown option {name!r} for score_frame; options are settings by name "
                f"({', '.join(sorted(k for k, v in _SHORT.items() if v))}) or dotted keys, "
                "and the columns are given by columns="
            )
        values[key] = str(value) if isinstance(value, Path) else value
    if columns is not None:
        values.update(column_map_flags(columns, API_OPTIONS))
    values.update({f"judge.{k}": v for k, v in audit.items() if v is not None})
    cfg = with_settings(config or Config(), values)
    out = cfg.output
    if out.partition_by or out.sinks or out.charts:
        raise ConfigError(
            "score_frame returns its rows in memory: partition_by, sinks and charts are for "
            "ctxprec.score with an output folder"
        )
    if cfg.judge.batch_api:
        raise ConfigError("score_frame calls the judge online: batch_api is for ctxprec.score")
    return cfg


def _run_columns(cfg: Config, names: list[str]) -> Config:
    """The config the run gets: each row's position as its id, the summary's group column
    passed through; the expected column as the CLI takes it (absent default: none)."""
    c = cfg.columns
    passthrough = (cfg.output.group_by,) if cfg.output.group_by else ()
    expected = c.expected
    if expected is None and DEFAULT_EXPECTED not in names:
        expected = ""
    columns = dataclasses.replace(c, id=_ROW, expected=expected, passthrough=passthrough)
    return dataclasses.replace(cfg, columns=columns)


def _check_names(table: pa.Table, cfg: Config) -> None:
    spec = output_schema(
        labels=cfg.column_map.labels is not None, audit=bool(cfg.judge.audit_model),
        ks=cfg.scoring.ks,
    )  # fmt: skip
    taken = sorted(set(table.column_names) & set(spec.names[1:]))
    if taken:
        raise ConfigError(
            f"the frame already has column(s) {', '.join(taken)}, which score_frame adds; "
            "rename or drop them first"
        )
    if _ROW in table.column_names:
        raise ConfigError(f"the frame has a column {_ROW}, the name score_frame gives row numbers")


# -- the run ------------------------------------------------------------------------------------
def _read_back(outdir: Path, rows: int, held: Mapping[int, str | None]) -> pa.Table:
    """The run's rows in the frame's order, a row held out as not scorable in its place
    (status `not_scorable`, its reason in `reason`, no score)."""
    files = part_files(outdir)
    parts = [pq.ParquetFile(f).read() for f in files]  # read_table would import pandas
    if parts:
        table = pa.concat_tables(parts, promote_options="default").sort_by("id")
    else:
        table = output_schema().empty_table()
    ids = [i for i in range(rows) if i not in held]
    if table.num_rows != len(ids) or table.column("id").to_pylist() != ids:
        raise CtxprecError(f"the run wrote {table.num_rows} of the frame's {len(ids)} rows")
    table = table.drop_columns([c for c in (_ROW,) if c in table.column_names])
    if held:
        skipped = pl.DataFrame(
            {"id": list(held), "status": _NOT_SCORABLE, "reason": list(held.values())},
            schema={"id": pl.Int64, "status": pl.String, "reason": pl.String},
        )
        scored = pl.DataFrame(pl.from_arrow(table)).with_columns(pl.col("id").cast(pl.Int64))
        merged = pl.concat([scored, skipped], how="diagonal_relaxed").sort("id")
        fields = [pa.field(f.name, pa.int64() if f.name == "id" else f.type) for f in table.schema]
        table = merged.to_arrow().cast(pa.schema(fields))  # nullable: held rows have no figures
    return table.drop_columns(["id"])


def _held_out(table: pa.Table, column: str | None) -> dict[int, str | None]:
    """The rows the frame's `not_scorable` column marks: True, or a reason (a non-empty
    string); False, null and "" rows are scored."""
    if column is None:
        return {}
    if column not in table.column_names:
        raise ConfigError(f"columns={{'not_scorable': {column!r}}}: the frame has no such column")
    held: dict[int, str | None] = {}
    for i, value in enumerate(table.column(column).to_pylist()):
        if isinstance(value, str) and value.strip():
            held[i] = f"not scorable: {value.strip()}"
        elif value is True:
            held[i] = "not scorable"
        elif value not in (None, False, ""):
            raise ConfigError(
                f"column {column!r} (not_scorable) holds {value!r} in row {i}: give True, a "
                "reason (text), or False / null / empty for a row to score"
            )
    return held


def _api_words(exc: CtxprecError, path: Path) -> CtxprecError:
    """A run error as an API user reads it: "the frame" for the temporary file, the column map
    for `--map` (the error's class kept)."""
    text = str(exc).replace(str(path), "the frame")
    text = re.sub(r"--map (\w+)=COLUMN", r"columns={'\1': COLUMN}", text)
    text = text.replace("--map ", "columns=")
    if text == str(exc):
        return exc
    clone = type(exc).__new__(type(exc))
    clone.__dict__.update(exc.__dict__)
    clone.args = (text,)
    return clone


def _summary(result: RunResult, verdict: EvalVerdict, held: int) -> FrameSummary:
    s = result.summary
    ci = s.get("score_ci95") or {}
    score = s.get("score") or {}
    rows = s.get("rows") or {}
    judge = s.get("judge") or {}
    statuses = {k: int(v) for k, v in rows.items() if k != "total"}
    return FrameSummary(
        rows=int(rows.get("total", 0)) + held,
        statuses=statuses | ({_NOT_SCORABLE: held} if held else {}),
        mean=score.get("mean"),
        ci95=(ci["low"], ci["high"]) if ci.get("low") is not None else None,
        median=score.get("median"),
        estimate=s.get("estimate"),
        judge_calls=int(judge.get("calls", 0)),
        memo_hits=int(judge.get("memo_hits", 0)),
        tokens=dict(s.get("tokens") or {}),
        cost_usd=s.get("cost_usd"),
        verdict=verdict,
        data=s,
    )


def _verdict(outdir: Path, scored: pa.Table, limits: Mapping[str, float]) -> EvalVerdict:
    """The thresholds judged on the run's mean exactly as --fail-under judges it; the rows by
    outcome (ok and empty_context completed, not_scorable skipped, failed an error)."""
    mean, n = run_mean(out_path(outdir))
    statuses = scored.column("status").to_pylist()
    outcomes = {
        "completed": sum(s in (STATUS_OK, STATUS_EMPTY) for s in statuses),
        "skipped": statuses.count(_NOT_SCORABLE),
        "error": statuses.count(STATUS_FAILED),
    }
    errors = scored.column("error").to_pylist()
    shown = [f"row {i}: {errors[i]}" for i, s in enumerate(statuses) if s == STATUS_FAILED][
        :_ERRORS_SHOWN
    ]
    return decide({SCORER_ID: (mean, n)}, limits, outcomes, shown, noun="row")


async def _score(
    data: Any,
    cfg: Config,
    limits: Mapping[str, float],
    progress: bool | str,
    seams: Seams,
    skip: str | None = None,
) -> ScoredFrame:
    kind = _kind(data)
    source, table = _to_arrow(data, kind)
    cfg = _run_columns(cfg, table.column_names)
    _check_names(table, cfg)
    held = _held_out(table, skip)
    mode = progress if isinstance(progress, str) else ("notebook" if progress else "off")
    folder = Path(tempfile.mkdtemp(prefix="ctxprec-frame-"))  # ours: removed whatever happens
    try:
        path, outdir = layout.frame_rows(folder), layout.frame_outdir(folder)
        # row numbers by Polars: pa.array imports pandas, which a Polars user may not have
        numbers = pl.int_range(0, table.num_rows, eager=True, dtype=pl.Int64).to_arrow()
        run_table = table.append_column(_ROW, numbers)
        if held:  # rows with nothing to judge never reach the run
            keep = [i not in held for i in range(table.num_rows)]
            run_table = run_table.filter(pa.array(keep, pa.bool_()))
        await anyio.to_thread.run_sync(pq.write_table, run_table, path)
        options = RunOptions(progress=mode, seams=seams)
        with named_as_options():
            try:
                result = await run_score(str(path), out_path(outdir), cfg, options)
            except CtxprecError as exc:
                raise _api_words(exc, path) from None
        scored = await anyio.to_thread.run_sync(_read_back, outdir, table.num_rows, held)
        verdict = await anyio.to_thread.run_sync(_verdict, outdir, scored, limits)
        return ScoredFrame(_joined(source, kind, scored), _summary(result, verdict, len(held)))
    finally:
        await anyio.to_thread.run_sync(functools.partial(shutil.rmtree, folder, True))


@camel_case_keywords
async def score_frame_async(
    data: Any,
    *,
    model: str | None = None,
    columns: Mapping[str, str] | str | None = None,
    map: Mapping[str, str] | str | None = None,
    config: Config | None = None,
    options: Mapping[str, Any] | None = None,
    thresholds: float | Mapping[str, float] | None = None,
    progress: bool | str = True,
    audit_model: str | None = None,
    audit_fraction: float | None = None,
    seams: Seams = DEFAULT,
) -> ScoredFrame:
    """`score_frame` for async code: awaited on the caller's event loop."""
    if columns is not None and map is not None:
        raise TypeError("score_frame() got columns= and map=, the same thing; give one")
    audit = {"audit_model": audit_model, "audit_fraction": audit_fraction}
    given, skip = _not_scorable_column(columns if columns is not None else map)
    cfg = _settings(config, model, given, options, audit)
    limits = thresholds_of(thresholds, [SCORER_ID])
    return await _score(data, cfg, limits, progress, seams, skip)


def _not_scorable_column(columns: Any) -> tuple[Any, str | None]:
    """The column map without its `not_scorable` role (score_frame's own: the run never sees
    those rows), and that role's column."""
    if isinstance(columns, str) and _NOT_SCORABLE in columns:  # "query=q,not_scorable=skip"
        pairs = [part.partition("=") for part in columns.split(",") if part.strip()]
        columns = {key.strip(): value.strip() for key, _, value in pairs}
    if not isinstance(columns, Mapping) or _NOT_SCORABLE not in columns:
        return columns, None
    rest = {k: v for k, v in columns.items() if k != _NOT_SCORABLE}
    return rest or None, str(columns[_NOT_SCORABLE])


@camel_case_keywords
def score_frame(
    data: Any,
    *,
    model: str | None = None,
    columns: Mapping[str, str] | str | None = None,
    map: Mapping[str, str] | str | None = None,
    config: Config | None = None,
    options: Mapping[str, Any] | None = None,
    thresholds: float | Mapping[str, float] | None = None,
    progress: bool | str = True,
    audit_model: str | None = None,
    audit_fraction: float | None = None,
    seams: Seams = DEFAULT,
) -> ScoredFrame:
    """Score the rows of `data` (pandas, Polars DataFrame or LazyFrame, PyArrow Table, list of
    dicts) as `ctxprec score` scores a file; returns `(frame, summary)`: the same kind of
    object with the Parquet output's scored columns appended, and a `FrameSummary`.

    `columns=` (or `map=`, the CLI's word) maps the roles to columns ({"query": "question",
    "expected": "answer", "context": "docs", "labels": "relevance"}; defaults as the CLI's);
    no id is needed (rows come back in order). `model=` and `options=` ({"concurrency": 8,
    "rpm": 500, "cache_dir": ..., "memo": False, ...}: settings by name or dotted key) over
    `config=` (a `load_config(...)` Config, else the defaults; the environment is not read).
    `thresholds=` judges the mean by the rule of --fail-under (`summary.verdict`); the audit
    judge as in `ctxprec.score`. `progress`: tqdm.auto's bar (a widget in Jupyter), False for
    none. Inside a running event loop the run gets its own loop in a worker thread."""
    work = functools.partial(
        score_frame_async,
        data,
        model=model,
        columns=columns,
        map=map,
        config=config,
        options=options,
        thresholds=thresholds,
        progress=progress,
        audit_model=audit_model,
        audit_fraction=audit_fraction,
        seams=seams,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_blocking(work)
    return in_own_loop(work)


def in_own_loop(fn: Callable[[], Awaitable[T]]) -> T:
    """`fn` run to its end on an event loop of its own in a worker thread, for a caller whose
    thread already runs one (a Jupyter cell). Ctrl-C while waiting cancels the run (its
    shutdown runs to the end) and comes out as KeyboardInterrupt."""
    with anyio.from_thread.start_blocking_portal() as portal:
        future = portal.start_task_soon(fn)
        try:
            return _result(future)
        except KeyboardInterrupt:
            future.cancel()
            raise


def _result(future: concurrent.futures.Future[T]) -> T:
    try:
        return future.result()
    except BaseExceptionGroup as group:
        found = first_meaningful(group)
        if found is group and len(group.exceptions) == 1:
            found = group.exceptions[0]
        raise found from None
