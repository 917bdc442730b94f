"""Streaming input: resolve files, folders, globs and Hive datasets (local or in an object
store), check them up front, and yield normalized Polars batches under deterministic part keys
(never a whole file in memory). Parquet, JSON Lines and CSV (see `formats`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import polars as pl
import pyarrow as pa

from ctxprec.connectors.sources.files import InputFile, NotRead, find_inputs
from ctxprec.connectors.sources.formats import (
    TextScan,
    check_expansion,
    decode_json_text,
    decode_lists,
    json_line,
    open_parquet,
    parquet_batches,
    scan_text,
    text_batches,
)
from ctxprec.connectors.sources.validate import (
    INPUT_ERROR,
    NORMALIZED_TYPES,
    ColumnTypes,
    Duplicates,
    FieldRef,
    IdScan,
    Wanted,
    Where,
    check_ids,
    check_names,
    check_partition_overlap,
    dataset_partitions,
    detail,
    field_ref,
    file_columns,
    merge_columns,
    path_parts,
)
from ctxprec.storage.core.constants import HIVE_NULL
from ctxprec.storage.core.errors import ConfigError, InputError
from ctxprec.storage.core.settings import (  # roles derived from [columns]
    DEFAULT_EXPECTED,
    ColumnMap,
    ColumnsSettings,
    StorageSettings,
)

__all__ = [
    "SourceChunk",
    "SourceInfo",
    "inspect_input",
    "inspect_source",
    "iter_batches",
    "read_ids",
    "resolve_inputs",
]


_DEFAULT_ID = ColumnMap().id  # a renamed id column is also kept under its own name


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """What `inspect_source` learned from the footers (text files: one pass) and the id scan."""

    files: tuple[InputFile, ...]
    total_rows: int
    id_type: pa.DataType
    passthrough_fields: tuple[pa.Field, ...]
    has_expected: bool
    partition_columns: tuple[str, ...]
    use_extractor: bool = False  # context comes from an extractor: batches carry `source_row`
    rows: tuple[int, ...] = ()  # per file
    schemas: tuple[pa.Schema | None, ...] = ()  # per text file: the schema it is read with
    skipped: tuple[str, ...] = ()  # files in no input format (named in one notice line)
    not_read: NotRead | None = None  # a local input folder's other files, with the reasons
    storage: StorageSettings = dataclasses.field(default_factory=StorageSettings, repr=False)
    # --duplicate-ids keep-first|keep-last: the rows that repeat an id (read past); total_rows
    # counts the rows that are scored
    duplicates: Duplicates | None = None
    # mapped COLUMN.FIELD names of struct and list<struct> columns: name -> (column, field path,
    # over the list's items); read as Polars expressions over the column, never row by row
    field_refs: tuple[tuple[str, FieldRef], ...] = ()
    # list roles (context, labels) held as JSON text in Parquet: decoded batch by batch
    encoded: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SourceChunk:
    """One record batch of one file, normalized; `key` names its output part."""

    key: str
    file: InputFile
    first_row: int
    frame: pl.DataFrame


# ---------------------------------------------------------------- resolving the input


def resolve_inputs(spec: str | Path, storage: StorageSettings | None = None) -> list[InputFile]:
    """A file, a folder (recursive, skipping `_*` and `.*`), a glob, or a Hive dataset; local
    or an object-store URI."""
    return list(find_inputs(spec, storage).files)


def _partition_values(path: InputFile, keys: Sequence[str]) -> dict[str, str | None]:
    """The value of each partition key from the innermost `key=value` folder of `path`."""
    values: dict[str, str | None] = {}
    for part in reversed(path_parts(path.path)[:-1]):
        key, sep, raw = part.partition("=")
        if sep and key in keys and key not in values:
            values[key] = None if raw == HIVE_NULL else unquote(raw)
    return {key: values.get(key) for key in keys}


# ---------------------------------------------------------------- inspection


def _wanted(
    columns: ColumnMap, use_context: bool, expected_explicit: bool, keys: Sequence[str] = ()
) -> list[Wanted]:
    wanted = [Wanted("id", columns.id), Wanted("query", columns.query)]
    if columns.expected is not None:
        optional = not expected_explicit and columns.expected == DEFAULT_EXPECTED
        wanted.append(Wanted("expected", columns.expected, optional))
    if use_context and columns.context is not None:
        wanted.append(Wanted("context", columns.context))
    if columns.labels is not None:
        wanted.append(Wanted("labels", columns.labels))
    # a partition key named in passthrough is the partition's value, not a column in the files
    names = [name for name in _passthrough_names(columns) if name not in keys]
    return wanted + [Wanted("passthrough", name) for name in names]


def _passthrough_names(columns: ColumnMap) -> list[str]:
    names = [columns.id] if columns.id != _DEFAULT_ID else []
    return list(dict.fromkeys([*names, *columns.passthrough]))


def _mapped(columns: ColumnMap, use_context: bool) -> dict[str, str | None]:
    context = columns.context if use_context else None
    return {
        "query": columns.query,
        "expected": columns.expected,
        "context": context,
        "labels": columns.labels,
    }


def _lists(columns: ColumnMap, use_context: bool) -> dict[str, pa.DataType]:
    """Mapped list columns: in a text format they may hold JSON-encoded lists."""
    lists: dict[str, pa.DataType] = {}
    if use_context and columns.context is not None:
        lists[columns.context] = NORMALIZED_TYPES["context"]
    if columns.labels is not None:
        lists[columns.labels] = NORMALIZED_TYPES["labels"]
    return lists


@dataclass
class _Scanned:
    types: ColumnTypes
    rows: list[int]
    schemas: list[pa.Schema | None]
    first: pa.Schema | None = None  # the first file with columns (struct field references)


def _file_schema(
    file: InputFile, storage: StorageSettings, lists: dict[str, pa.DataType], wanted: list[Wanted]
) -> tuple[pa.Schema, int, pa.Schema | None]:
    if file.format == "parquet":
        with open_parquet(file, storage) as pf:
            try:
                schema = pf.schema_arrow
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise InputError(
                    f"{file} is a corrupt or truncated Parquet file ({detail(exc)}); re-export "
                    "it or leave it out"
                ) from exc
            check_expansion(pf, file, [w.column for w in wanted])  # before any judge call
            return schema, pf.metadata.num_rows, None
    scan: TextScan = scan_text(file, storage, lists)
    for want in wanted:
        if want.column in scan.conflicts:
            raise InputError(
                f"column `{want.column}` ({want.role}) in {file} holds values of different "
                "JSON types (e.g. strings in some rows, numbers in others); write one type "
                "per field"
            )
    return scan.schema, scan.rows, scan.schema


def _scan_schemas(
    files: Sequence[InputFile],
    wanted: list[Wanted],
    keys: Sequence[str],
    storage: StorageSettings,
    lists: dict[str, pa.DataType],
) -> _Scanned:
    merged: ColumnTypes | None = None
    scanned = _Scanned({}, [], [])
    for file in files:
        schema, rows, read_schema = _file_schema(file, storage, lists, wanted)
        scanned.rows.append(rows)
        scanned.schemas.append(read_schema)
        if read_schema is not None and rows == 0:
            continue  # an empty text file has no columns to check (an idle day's export)
        check_partition_overlap(file, schema, keys)
        scanned.first = scanned.first or schema
        current = file_columns(file, schema, wanted)
        merged = current if merged is None else merge_columns(merged, current)
    if merged is None:  # every file was an empty text file: an empty dataset, as Parquet's
        merged = _empty_columns(files[0], wanted)
    scanned.types = merged
    return scanned


def _empty_columns(file: InputFile, wanted: list[Wanted]) -> ColumnTypes:
    """The column types of an input of empty text files only (no column to read a type from):
    the normalized types of the mapped roles, strings for the id and passthrough columns (the
    expected output is taken as there: no row is judged without it)."""
    return {w.column: (NORMALIZED_TYPES.get(w.role, pa.string()), file) for w in wanted}


def _passthrough_fields(
    columns: ColumnMap, types: ColumnTypes, keys: Sequence[str]
) -> tuple[pa.Field, ...]:
    fields = []
    for name in _passthrough_names(columns):
        if name in keys:
            continue
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


def inspect_input(
    spec: str | Path, columns: ColumnsSettings, storage: StorageSettings
) -> SourceInfo:
    """`inspect_source` with a run's [columns] and [storage] settings (the run and the
    estimate read an input alike)."""
    return inspect_source(
        spec,
        columns.map,
        use_extractor=columns.extractor is not None,
        expected_explicit=columns.expected_explicit,
        storage=storage,
        duplicates=columns.duplicate_ids,
    )


def inspect_source(
    spec: str | Path,
    columns: ColumnMap,
    *,
    use_extractor: bool,
    expected_explicit: bool = False,
    storage: StorageSettings | None = None,
    duplicates: str = "refuse",
) -> SourceInfo:
    """Check the whole input before any judge call: files, columns, types, schema, ids (an id
    on two rows is refused, or with `duplicates` "keep-first" / "keep-last" one row of each
    is scored and the others are read past)."""
    _require_context_source(columns, use_extractor)
    storage = storage or StorageSettings()
    found = find_inputs(spec, storage)
    files = found.files
    use_context = not use_extractor
    check_names(
        [columns.output_name(n) for n in _passthrough_names(columns)],
        _mapped(columns, use_context),
        "passthrough column",
    )
    keys = dataset_partitions(files, found.root)
    check_names(keys, {}, "Hive partition column")
    wanted = _wanted(columns, use_context, expected_explicit, keys)
    scanned = _scan_schemas(files, wanted, keys, storage, _lists(columns, use_context))
    types = scanned.types
    id_type = types[columns.id][0]
    assert id_type is not None  # the id column is never optional
    refs = _field_refs(scanned.first, [w.column for w in wanted])
    info = SourceInfo(
        files=files,
        total_rows=sum(scanned.rows),
        id_type=id_type,
        passthrough_fields=_passthrough_fields(columns, types, keys),
        has_expected=types[columns.expected][0] is not None if columns.expected else False,
        partition_columns=keys,
        use_extractor=use_extractor,
        rows=tuple(scanned.rows),
        schemas=tuple(scanned.schemas),
        skipped=found.skipped,
        not_read=found.not_read,
        storage=storage,
        field_refs=refs,
        encoded=_encoded(files, types, columns, use_context, storage),
    )
    where = _position(info)
    dups = check_ids(
        files, _id_scans(info, columns.id), columns.id, id_type, policy=duplicates, where=where
    )
    if dups is None:
        return info
    return dataclasses.replace(info, duplicates=dups, total_rows=info.total_rows - dups.rows)


def _field_refs(schema: pa.Schema | None, names: Sequence[str]) -> tuple[tuple[str, FieldRef], ...]:
    """The mapped names that are struct field references (COLUMN.FIELD), resolved."""
    if schema is None:
        return ()
    found = [(name, field_ref(schema, name)) for name in dict.fromkeys(names)]
    return tuple((name, ref[0]) for name, ref in found if ref is not None)


_SAMPLE_ROWS = 64  # rows of a Parquet text column looked at to tell JSON arrays from prose


def _encoded(
    files: Sequence[InputFile],
    types: ColumnTypes,
    columns: ColumnMap,
    use_context: bool,
    storage: StorageSettings,
) -> tuple[str, ...]:
    """Parquet list roles stored as text (a JSON array per row), as CSV holds them. A column
    whose first rows hold no JSON array at all (prose, a joined string) is refused here, before
    any judge call, rather than failing every row; a row here and there fails on its input."""
    if not any(f.format == "parquet" for f in files):
        return ()  # text formats decode their JSON arrays themselves (`formats.decode_lists`)
    roles = {"context": columns.context if use_context else None, "labels": columns.labels}
    found = []
    for role, name in roles.items():
        if name and types.get(name, (None,))[0] == pa.string():
            _check_json_sample(files, name, role, storage)
            found.append(name)
    return tuple(found)


def _check_json_sample(
    files: Sequence[InputFile], name: str, role: str, storage: StorageSettings
) -> None:
    for file in files:
        if file.format != "parquet":
            continue
        with open_parquet(file, storage) as pf:
            batch = next(pf.iter_batches(batch_size=_SAMPLE_ROWS, columns=[name]), None)
        values = [] if batch is None else batch.column(0).to_pylist()
        filled = [(row, v) for row, v in enumerate(values) if v is not None]
        if filled and not any(v.lstrip().startswith("[") for _, v in filled):
            for row, value in filled[:1]:  # prose, not JSON: a row at a time would all fail
                shown = value if len(value) <= 60 else value[:59] + "…"
                kind = "strings" if role == "context" else "booleans"
                raise InputError(
                    f"column `{name}` ({role}) in {file} has type string; {role} must be a "
                    f"list<{'string' if role == 'context' else 'bool'}> column, a field of a "
                    f"list<struct> column, or text holding a JSON array of {kind}, and row "
                    f"{row + 1:,} holds {shown!r}: store the items as "
                    f"list<{'string' if role == 'context' else 'bool'}>, write a JSON array "
                    "per row, or give an extractor that splits the text "
                    "(--extractor module:function)"
                )
        return  # the first Parquet file tells


def _position(info: SourceInfo) -> Where:
    """Where row `index` (0-based) of a file is, counted from 1 as editors count: a Parquet or
    CSV file's row (CSV: data rows, after the header), a JSON Lines file's line (blank lines
    counted, as an editor shows them)."""

    def where(file: int, index: int) -> str:
        path = info.files[file]
        if path.format == "json":
            return f"{path} line {json_line(path, info.storage, index):,}"
        return f"{path} row {index + 1:,}"

    return where


def _id_scans(info: SourceInfo, column: str) -> list[IdScan]:
    """Per file, its id column as a lazy frame: Polars' own scan for local Parquet, else read
    through the file's reader (only that column is kept in memory)."""
    scans: list[IdScan] = []
    for index, file in enumerate(info.files):
        if file.format == "parquet" and not file.remote:
            path = file.path

            def local(path: str = path) -> pl.LazyFrame:
                return pl.scan_parquet(path, hive_partitioning=False).select(
                    pl.col(column).alias("id")
                )

            scans.append(local)
        else:

            def read(index: int = index) -> pl.LazyFrame:
                return _read_id_column(info, index, column).lazy()

            scans.append(read)
    return scans


_ID_BATCH = 65_536


def _read_id_column(info: SourceInfo, index: int, column: str) -> pl.DataFrame:
    chunks = [b.select([column]) for _, b in _raw_batches(info, index, _ID_BATCH, [column]) if b]
    table = pa.Table.from_batches(chunks) if chunks else pa.table({column: pa.array([])})
    frame = pl.from_arrow(table.rename_columns(["id"]))
    assert isinstance(frame, pl.DataFrame)
    return frame


def read_ids(info: SourceInfo, column: str) -> pl.Series:
    """Every input row's id (the mapped column), all files in order."""
    frames = [scan().collect() for scan in _id_scans(info, column)]
    if not frames:
        return pl.Series("id", [])
    return pl.concat(frames, how="vertical_relaxed").get_column("id")


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
    refs = dict(info.field_refs)  # a struct field is read with its column
    return list(dict.fromkeys(refs[n][0] if n in refs else n for n in names))


def _source(name: str, info: SourceInfo) -> pl.Expr:
    """A mapped name as an expression over the batch: its column, or a field of a struct
    column, or of every struct of a list<struct> column (`list.eval`: columnar)."""
    ref = dict(info.field_refs).get(name)
    if ref is None:
        return pl.col(name)
    column, path, over_list = ref
    expr = pl.element() if over_list else pl.col(column)
    for step in path:
        expr = expr.struct.field(step)
    return pl.col(column).list.eval(expr) if over_list else expr


def _column_or_null(name: str | None, info: SourceInfo) -> pl.Expr:
    return pl.lit(None) if name is None else _source(name, info)


def _core_exprs(info: SourceInfo, columns: ColumnMap) -> list[pl.Expr]:
    ids = pl.col(columns.id)
    expected = columns.expected if info.has_expected else None
    context = None if info.use_extractor else columns.context
    exprs = [
        (ids.cast(pl.String) if info.id_type == pa.string() else ids).alias("id"),
        _source(columns.query, info).cast(pl.String).alias("query"),
        _column_or_null(expected, info).cast(pl.String).alias("expected"),
        _column_or_null(context, info).cast(pl.List(pl.String)).alias("context"),
    ]
    if columns.labels is not None:
        labels = _source(columns.labels, info).cast(pl.List(pl.Boolean))
        exprs.append(labels.alias("labels"))
    return exprs


def _frame_exprs(
    info: SourceInfo, columns: ColumnMap, raw: Sequence[str], parts: dict[str, str | None]
) -> list[pl.Expr]:
    """id, query, expected, context[, labels], passthrough[, partitions][, source_row]."""
    exprs = _core_exprs(info, columns)
    taken = {*(e.meta.output_name() for e in exprs), *parts}
    sources = {columns.output_name(n): n for n in _passthrough_names(columns)}
    exprs += [
        _source(sources.get(f.name, f.name), info).alias(f.name)
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
    batch: pa.RecordBatch,
    path: InputFile,
    first_row: int,
    exprs: list[pl.Expr],
    problems: list[str | None] | None = None,
) -> pl.DataFrame:
    """The batch as the normalized frame; `problems` (a row's input error, or None), from a
    decoding already done, are merged with those found here."""
    try:
        batch.validate(full=True)
    except pa.ArrowInvalid as exc:
        repaired = _repair_utf8(batch)
        if repaired is None:
            raise InputError(
                f"{path} rows {first_row + 1:,}-{first_row + batch.num_rows:,} hold invalid data "
                f"({detail(exc)}); re-export the file or leave it out of the input"
            ) from exc
        batch, found = repaired
        problems = (
            found if problems is None else [a or b for a, b in zip(problems, found, strict=True)]
        )
    frame = pl.from_arrow(batch)
    assert isinstance(frame, pl.DataFrame)
    frame = frame.select(exprs)
    if problems is not None:
        frame = frame.with_columns(pl.Series(INPUT_ERROR, problems, pl.String))
    return frame


def _key(file_index: int, batch_index: int) -> str:
    return f"{file_index:05d}-{batch_index:05d}"


def _raw_batches(
    info: SourceInfo,
    index: int,
    batch_rows: int,
    names: list[str] | None,
    wanted: Sequence[int] | None = None,
) -> Iterator[tuple[int, pa.RecordBatch | None]]:
    """(batch index, record batch) of one file; batches not in `wanted` come as None."""
    file = info.files[index]
    schema = info.schemas[index] if index < len(info.schemas) else None
    if file.format != "parquet":
        assert schema is not None  # inspect_source scanned every text file
        for b, batch in text_batches(file, info.storage, schema, batch_rows, wanted):
            if batch is not None and names is not None:
                batch = batch.select([n for n in names if n in batch.schema.names])
            yield b, batch
        return
    keep = None if wanted is None else set(wanted)
    with open_parquet(file, info.storage) as pf:
        last = None if wanted is None else max(wanted, default=-1)
        for b, batch in enumerate(parquet_batches(pf, file, batch_rows, names)):
            if last is not None and b > last:
                return  # the rest is done (or another task's share of the file)
            yield b, batch if keep is None or b in keep else None


def _file_rows(info: SourceInfo, index: int) -> int:
    if index < len(info.rows):
        return info.rows[index]
    with open_parquet(info.files[index], info.storage) as pf:
        return int(pf.metadata.num_rows)


def _file_batches(
    info: SourceInfo, columns: ColumnMap, index: int, batch_rows: int, done: frozenset[str]
) -> Iterator[SourceChunk]:
    file = info.files[index]
    count = -(-_file_rows(info, index) // batch_rows)  # every batch is full but the last
    todo = [b for b in range(count) if _key(index, b) not in done]
    if not todo:
        return
    parts = _partition_values(file, info.partition_columns)
    lists = _lists(columns, not info.use_extractor)
    exprs: list[pl.Expr] | None = None
    first_row = 0
    names = _read_columns(info, columns)
    for b, batch in _raw_batches(info, index, batch_rows, names, todo):
        if batch is None:  # committed parts are read past, never converted
            first_row += batch_rows
            continue
        problems: list[str | None] | None = None
        if file.format != "parquet":
            batch = decode_lists(batch, lists)
        elif info.encoded:
            batch, problems = decode_json_text(batch, {n: lists[n] for n in info.encoded})
        if exprs is None:
            exprs = _frame_exprs(info, columns, batch.schema.names, parts)
        frame = _to_frame(batch, file, first_row, exprs, problems)
        if info.duplicates is not None:
            frame = _without(frame, info.duplicates.drop[index], first_row)
        yield SourceChunk(_key(index, b), file, first_row, frame)
        first_row += batch.num_rows


def _without(frame: pl.DataFrame, drop: Sequence[int], first_row: int) -> pl.DataFrame:
    """The batch without the rows (file row indexes, sorted) a duplicate-ids policy drops."""
    if not drop:
        return frame
    rows = np.asarray(drop, dtype=np.int64)
    lo, hi = np.searchsorted(rows, [first_row, first_row + frame.height])
    if lo == hi:
        return frame
    keep = np.ones(frame.height, dtype=bool)
    keep[rows[lo:hi] - first_row] = False
    return frame.filter(pl.Series(keep))


def iter_batches(
    info: SourceInfo,
    columns: ColumnMap,
    *,
    batch_rows: int,
    skip: Collection[str] = (),
    only_files: Collection[int] | None = None,
) -> Iterator[SourceChunk]:
    """Normalized batches of every file in order; keys `f"{file:05d}-{batch:05d}"` are stable
    for the same files and `batch_rows`. Keys in `skip` are not yielded (whole files not read);
    `only_files` (indexes into `info.files`) reads just those files, keys keep the global index."""
    if batch_rows < 1:
        raise ConfigError(f"batch_rows must be at least 1, got {batch_rows}")
    done = frozenset(skip)
    wanted = range(len(info.files)) if only_files is None else sorted(set(only_files))
    for index in wanted:
        yield from _file_batches(info, columns, index, batch_rows, done)
