"""Streaming Parquet input: resolve files, folders, globs and Hive datasets, check them up front,
and yield normalized Polars batches under deterministic part keys (never a whole file in memory).
"""

from __future__ import annotations

import glob
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from connectors.sources.validate import (
    INPUT_ERROR,
    NORMALIZED_TYPES,
    ColumnTypes,
    Wanted,
    check_ids,
    check_names,
    check_partition_overlap,
    dataset_partitions,
    detail,
    file_columns,
    merge_columns,
    open_parquet,
    read_schema,
)
from pipeline.errors import ConfigError, InputError
from storage.runlog import STATE_DIR

__all__ = [
    "DEFAULT_EXPECTED",
    "INPUT_ERROR",
    "ColumnMap",
    "SourceBatch",
    "SourceInfo",
    "inspect_source",
    "iter_batches",
    "resolve_inputs",
]

DEFAULT_EXPECTED = "expected_output"
_GLOB_CHARS = frozenset("*?[")
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


@dataclass(frozen=True, slots=True)
class ColumnMap:
    """Which source column plays which role; `passthrough` columns are copied to the output."""

    id: str = "id"
    query: str = "query"
    expected: str | None = DEFAULT_EXPECTED  # may be absent: then judged vs the query alone
    context: str | None = "contexts"  # list<string>; None when an extractor gives the context
    labels: str | None = None  # optional list<bool> human labels
    passthrough: tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()  # passthrough (source, output name) pairs

    def output_name(self, source: str) -> str:
        """The output column a passthrough source column is written as."""
        return dict(self.renames).get(source, source)


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """What `inspect_source` learned from the Parquet footers and the id scan."""

    files: tuple[Path, ...]
    total_rows: int
    id_type: pa.DataType
    passthrough_fields: tuple[pa.Field, ...]
    has_expected: bool
    partition_columns: tuple[str, ...]
    use_extractor: bool = False  # context comes from an extractor: batches carry `source_row`


@dataclass(frozen=True, slots=True)
class SourceBatch:
    """One record batch of one file, normalized; `key` names its output part."""

    key: str
    file: Path
    first_row: int
    frame: pl.DataFrame


# ---------------------------------------------------------------- resolving the input


def _visible(rel: Path) -> bool:
    return not any(part.startswith(("_", ".")) for part in rel.parts)


def _sorted(paths: Collection[Path]) -> list[Path]:
    return sorted(set(paths), key=lambda p: p.as_posix())


def _outside_outputs(paths: Sequence[Path], root: Path) -> list[Path]:
    """Leave out the part files of ctxprec output folders below `root`: an output folder put
    inside the input folder must not be read as input by the next run (resume, incremental)."""
    known: dict[Path, bool] = {}

    def is_output(folder: Path) -> bool:
        if folder not in known:
            known[folder] = (folder / STATE_DIR / "manifest.json").is_file()
        return known[folder]

    kept = []
    for path in paths:
        parts = path.relative_to(root).parts
        if not any(is_output(root.joinpath(*parts[:i])) for i in range(1, len(parts))):
            kept.append(path)
    return kept


def _folder_files(folder: Path) -> list[Path]:
    found = [
        p for p in folder.rglob("*.parquet") if p.is_file() and _visible(p.relative_to(folder))
    ]
    return _sorted(_outside_outputs(found, folder))


def _glob_root(pattern: str) -> Path:
    prefix: list[str] = []
    for part in Path(pattern).parts:
        if _GLOB_CHARS & set(part):
            break
        prefix.append(part)
    return Path(*prefix) if prefix else Path()


def _glob_files(pattern: str) -> list[Path]:
    root = _glob_root(pattern)
    found: list[Path] = []
    for match in glob.glob(pattern, recursive=True):
        path = Path(match)
        if not _visible(path.relative_to(root)):
            continue
        found += _folder_files(path) if path.is_dir() else [path] if path.is_file() else []
    found = _outside_outputs(found, root)
    if not found:
        raise InputError(
            f"glob `{pattern}` matched no Parquet files; check the pattern (and quote it so the "
            "shell does not expand it)"
        )
    return _sorted(found)


def resolve_inputs(spec: str | Path) -> list[Path]:
    """A file, a folder (recursive *.parquet, skipping `_*` and `.*`), a glob, or a Hive dataset."""
    path = Path(spec)
    if path.is_dir():
        files = _folder_files(path)
        if not files:
            raise InputError(
                f"folder {path} holds no *.parquet files (names starting with '_' or '.' and "
                "ctxprec output folders are skipped); point at the folder with the data or use "
                "a glob"
            )
        return files
    if path.exists():
        return [path]
    if _GLOB_CHARS & set(str(spec)):
        return _glob_files(str(spec))
    raise InputError(
        f"input {path} does not exist; give a Parquet file, a folder of Parquet files or a glob "
        "such as 'data/**/*.parquet'"
    )


# ---------------------------------------------------------------- Hive partitions


def _input_root(spec: str | Path) -> Path:
    path = Path(spec)
    if path.is_dir():
        return path
    return path.parent if path.exists() else _glob_root(str(spec))


def _partition_values(path: Path, keys: Sequence[str]) -> dict[str, str | None]:
    """The value of each partition key from the innermost `key=value` folder of `path`."""
    values: dict[str, str | None] = {}
    for part in reversed(path.parent.parts):
        key, sep, raw = part.partition("=")
        if sep and key in keys and key not in values:
            values[key] = None if raw == _HIVE_NULL else unquote(raw)
    return {key: values.get(key) for key in keys}


# ---------------------------------------------------------------- inspection


def _wanted(columns: ColumnMap, use_context: bool, expected_explicit: bool) -> list[Wanted]:
    wanted = [Wanted("id", columns.id), Wanted("query", columns.query)]
    if columns.expected is not None:
        optional = not expected_explicit and columns.expected == DEFAULT_EXPECTED
        wanted.append(Wanted("expected", columns.expected, optional))
    if use_context and columns.context is not None:
        wanted.append(Wanted("context", columns.context))
    if columns.labels is not None:
        wanted.append(Wanted("labels", columns.labels))
    return wanted + [Wanted("passthrough", name) for name in _passthrough_names(columns)]


def _passthrough_names(columns: ColumnMap) -> list[str]:
    names = [columns.id] if columns.id != "id" else []
    return list(dict.fromkeys([*names, *columns.passthrough]))


def _mapped(columns: ColumnMap, use_context: bool) -> dict[str, str | None]:
    context = columns.context if use_context else None
    return {
        "query": columns.query,
        "expected": columns.expected,
        "context": context,
        "labels": columns.labels,
    }


def _scan_schemas(
    files: Sequence[Path], wanted: list[Wanted], keys: Sequence[str]
) -> tuple[ColumnTypes, int]:
    merged: ColumnTypes | None = None
    total = 0
    for path in files:
        with open_parquet(path) as pf:
            schema = read_schema(pf, path)
            total += pf.metadata.num_rows
        check_partition_overlap(path, schema, keys)
        current = file_columns(path, schema, wanted)
        merged = current if merged is None else merge_columns(merged, current)
    assert merged is not None  # resolve_inputs never returns an empty list
    return merged, total


def _passthrough_fields(
    columns: ColumnMap, types: ColumnTypes, keys: Sequence[str]
) -> tuple[pa.Field, ...]:
    fields = []
    for name in _passthrough_names(columns):
        source_type = types[name][0]
        out = columns.output_name(name)
        fields.append(pa.field(out, NORMALIZED_TYPES.get(out, source_type)))
    return (*fields, *(pa.field(key, pa.string()) for key in keys))


def _require_context_source(columns: ColumnMap, use_extractor: bool) -> None:
    if columns.context is None and not use_extractor:
        raise ConfigError(
            "no context source: map a list<string> column with --map context=COLUMN "
            '([columns] context = "COLUMN") or give an extractor with --extractor module:function'
        )


def inspect_source(
    spec: str | Path,
    columns: ColumnMap,
    *,
    use_extractor: bool,
    expected_explicit: bool = False,
) -> SourceInfo:
    """Check the whole input before any judge call: files, columns, types, schema, ids."""
    _require_context_source(columns, use_extractor)
    files = tuple(resolve_inputs(spec))
    use_context = not use_extractor
    check_names(
        [columns.output_name(n) for n in _passthrough_names(columns)],
        _mapped(columns, use_context),
        "passthrough column",
    )
    keys = dataset_partitions(files, _input_root(spec))
    check_names(keys, {}, "Hive partition column")
    types, total = _scan_schemas(files, _wanted(columns, use_context, expected_explicit), keys)
    id_type = types[columns.id][0]
    assert id_type is not None  # the id column is never optional
    check_ids(files, columns.id, id_type)
    expected = None if columns.expected is None else types[columns.expected][0]
    return SourceInfo(
        files=files,
        total_rows=total,
        id_type=id_type,
        passthrough_fields=_passthrough_fields(columns, types, keys),
        has_expected=expected is not None,
        partition_columns=keys,
        use_extractor=use_extractor,
    )


# ---------------------------------------------------------------- streaming


def _read_columns(info: SourceInfo, columns: ColumnMap) -> list[str] | None:
    """Only the columns the run needs; all of them when an extractor must see the whole row."""
    if info.use_extractor:
        return None
    names = [columns.id, columns.query]
    names += [columns.expected] if info.has_expected and columns.expected else []
    names += [columns.context] if columns.context else []
    names += [columns.labels] if columns.labels else []
    sources = {columns.output_name(n): n for n in _passthrough_names(columns)}
    names += [
        sources.get(f.name, f.name)
        for f in info.passthrough_fields
        if f.name not in info.partition_columns
    ]
    return list(dict.fromkeys(names))


def _column_or_null(name: str | None) -> pl.Expr:
    return pl.lit(None) if name is None else pl.col(name)


def _core_exprs(info: SourceInfo, columns: ColumnMap) -> list[pl.Expr]:
    ids = pl.col(columns.id)
    expected = columns.expected if info.has_expected else None
    context = None if info.use_extractor else columns.context
    exprs = [
        (ids.cast(pl.String) if info.id_type == pa.string() else ids).alias("id"),
        pl.col(columns.query).cast(pl.String).alias("query"),
        _column_or_null(expected).cast(pl.String).alias("expected"),
        _column_or_null(context).cast(pl.List(pl.String)).alias("context"),
    ]
    if columns.labels is not None:
        exprs.append(pl.col(columns.labels).cast(pl.List(pl.Boolean)).alias("labels"))
    return exprs


def _frame_exprs(
    info: SourceInfo, columns: ColumnMap, raw: Sequence[str], parts: dict[str, str | None]
) -> list[pl.Expr]:
    """id, query, expected, context[, labels], passthrough[, partitions][, source_row]."""
    exprs = _core_exprs(info, columns)
    taken = {*(e.meta.output_name() for e in exprs), *parts}
    sources = {columns.output_name(n): n for n in _passthrough_names(columns)}
    exprs += [
        pl.col(sources.get(f.name, f.name)).alias(f.name)
        for f in info.passthrough_fields
        if f.name not in taken
    ]
    literals = [pl.lit(value, pl.String).alias(key) for key, value in parts.items()]
    exprs += literals
    if info.use_extractor:
        exprs.append(pl.struct(*[pl.col(c) for c in raw], *literals).alias("source_row"))
    return exprs


_NOT_UTF8 = (
    "invalid_input: column `{}` holds bytes that are not valid UTF-8 (read with U+FFFD in their "
    "place); re-export the data as UTF-8"
)


def _decode(raw: bytes | None) -> tuple[str | None, bool]:
    if raw is None:
        return None, True
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace"), False


def _repair_text(column: pa.Array) -> tuple[pa.Array, list[int]] | None:
    """A string or list<string> column with its non-UTF-8 values decoded with U+FFFD, and the
    rows that held them; None for other types. Only used once a batch failed validation."""
    t = column.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        raw = column.view(pa.large_binary() if pa.types.is_large_string(t) else pa.binary())
        pairs = [_decode(v) for v in raw.to_pylist()]
        bad = [row for row, (_, ok) in enumerate(pairs) if not ok]
        return pa.array([text for text, _ in pairs], t), bad
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
    if not is_list or not pa.types.is_string(t.value_type):
        return None
    item = pa.field(t.value_field.name, pa.binary())
    as_bytes = column.view(pa.large_list(item) if pa.types.is_large_list(t) else pa.list_(item))
    rows: list[list[str | None] | None] = []
    bad = []
    for row, items in enumerate(as_bytes.to_pylist()):
        if items is None:
            rows.append(None)
            continue
        decoded = [_decode(v) for v in items]
        rows.append([text for text, _ in decoded])
        if not all(ok for _, ok in decoded):
            bad.append(row)
    return pa.array(rows, t), bad


def _repair_utf8(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[str | None]] | None:
    """Non-UTF-8 text is a row-level problem: such rows get an `INPUT_ERROR` naming the column
    (their text decoded with U+FFFD); None when the batch is invalid for another reason."""
    problems: list[str | None] = [None] * batch.num_rows
    arrays = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        try:
            column.validate(full=True)
        except pa.ArrowInvalid:
            repaired = _repair_text(column)
            if repaired is None or not repaired[1]:
                return None
            column = repaired[0]
            for row in repaired[1]:
                problems[row] = problems[row] or _NOT_UTF8.format(field.name)
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema), problems


def _to_frame(
    batch: pa.RecordBatch, path: Path, first_row: int, exprs: list[pl.Expr]
) -> pl.DataFrame:
    problems: list[str | None] | None = None
    try:
        batch.validate(full=True)
    except pa.ArrowInvalid as exc:
        repaired = _repair_utf8(batch)
        if repaired is None:
            raise InputError(
                f"{path} rows {first_row}-{first_row + batch.num_rows - 1} hold invalid data "
                f"({detail(exc)}); re-export the file or leave it out of the input"
            ) from exc
        batch, problems = repaired
    frame = pl.from_arrow(batch)
    assert isinstance(frame, pl.DataFrame)
    frame = frame.select(exprs)
    if problems is not None:
        frame = frame.with_columns(pl.Series(INPUT_ERROR, problems, pl.String))
    return frame


def _read(
    pf: pq.ParquetFile, path: Path, batch_rows: int, names: list[str] | None
) -> Iterator[pa.RecordBatch]:
    batches = pf.iter_batches(batch_size=batch_rows, columns=names)
    first_row = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            raise InputError(
                f"cannot read {path} after row {first_row} ({detail(exc)}); the file is "
                "corrupt: re-export it or leave it out of the input"
            ) from exc
        yield batch
        first_row += batch.num_rows


def _key(file_index: int, batch_index: int) -> str:
    return f"{file_index:05d}-{batch_index:05d}"


def _file_batches(
    info: SourceInfo, columns: ColumnMap, index: int, batch_rows: int, done: frozenset[str]
) -> Iterator[SourceBatch]:
    path = info.files[index]
    with open_parquet(path) as pf:
        count = -(-pf.metadata.num_rows // batch_rows)  # iter_batches yields full batches
        todo = [b for b in range(count) if _key(index, b) not in done]
        if not todo:
            return
        parts = _partition_values(path, info.partition_columns)
        exprs = _frame_exprs(info, columns, read_schema(pf, path).names, parts)
        first_row = 0
        for b, batch in enumerate(_read(pf, path, batch_rows, _read_columns(info, columns))):
            if b > todo[-1]:
                return  # the rest is done (or another task's share of the file)
            if _key(index, b) not in done:  # committed parts are read past, never converted
                frame = _to_frame(batch, path, first_row, exprs)
                yield SourceBatch(_key(index, b), path, first_row, frame)
            first_row += batch.num_rows


def iter_batches(
    info: SourceInfo,
    columns: ColumnMap,
    *,
    batch_rows: int,
    skip: Collection[str] = (),
    only_files: Collection[int] | None = None,
) -> Iterator[SourceBatch]:
    """Normalized batches of every file in order; keys `f"{file:05d}-{batch:05d}"` are stable
    for the same files and `batch_rows`. Keys in `skip` are not yielded (whole files not read);
    `only_files` (indexes into `info.files`) reads just those files, keys keep the global index."""
    if batch_rows < 1:
        raise ConfigError(f"batch_rows must be at least 1, got {batch_rows}")
    done = frozenset(skip)
    wanted = range(len(info.files)) if only_files is None else sorted(set(only_files))
    for index in wanted:
        yield from _file_batches(info, columns, index, batch_rows, done)
