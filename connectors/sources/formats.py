"""Reading one input file as record batches, whatever its format and wherever it lives: Parquet
(footer, then row groups), JSON Lines and CSV (streamed, gzip/zstd decompressed on the fly).
Text formats are cut into batches of exactly `batch_rows` records, like Parquet, so batch keys
are the same on every read (resume, Dask slices).

JSON Lines types are inferred over the whole file at inspection (JSON has no timestamps: such
strings stay strings) and then read with that schema. CSV columns are text; a mapped list
column (context, labels) in a text format may hold each row's list as a JSON array.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import polars as pl
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from ctxprec.connectors.sources.files import InputFile
from ctxprec.connectors.sources.validate import canonical_type, detail
from ctxprec.storage.core.errors import InputError
from ctxprec.storage.core.settings import StorageSettings
from ctxprec.storage.files import fs

__all__ = [
    "TextScan",
    "check_expansion",
    "decode_json_text",
    "decode_lists",
    "json_line",
    "open_parquet",
    "parquet_batches",
    "scan_text",
    "text_batches",
]

_READ_BUFFER = 1 << 20
_BLOCK = 1 << 20
_SCAN_ROWS = 2_000
_MAX_BLOCK = (1 << 31) - 1
_ENCODED = b"ctxprec.encoded"
# A column chunk may expand to _BOMB_FLOOR bytes whatever its ratio; past that, to at most
# _MAX_RATIO times what it takes in the file. Real text compresses 2-20 times (snappy cannot go
# past ~21, gzip past ~1,032); a 7.7 KB file holding one 200 MB string took 1.1 GB to read.
_BOMB_FLOOR = 32 << 20
_MAX_RATIO = 1_000


# ---------------------------------------------------------------- Parquet


@contextlib.contextmanager
def open_parquet(file: InputFile, options: StorageSettings | None) -> Iterator[pq.ParquetFile]:
    """The Parquet file (footer only), closed on exit; unreadable files are an InputError."""
    if file.size == 0:
        raise InputError(f"{file} is empty (0 bytes), not a Parquet file; re-export or remove it")
    filesystem, path = fs.resolve(file.path, options)
    try:
        source = filesystem.open_input_file(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot open {file} ({detail(exc)}); check the path and access") from exc
    try:
        try:
            # pre_buffer (pyarrow's default) keeps every column chunk read so far until the
            # file is closed: memory would grow with the file. 1 MiB buffered reads stay flat.
            pf = pq.ParquetFile(source, pre_buffer=False, buffer_size=_READ_BUFFER)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InputError(_unreadable_parquet(file, source, exc)) from exc
        with pf:
            yield pf
    finally:
        source.close()


def _reads(path: str, names: Sequence[str] | None) -> bool:
    return names is None or any(path == n or path.startswith(f"{n}.") for n in names)


def check_expansion(pf: pq.ParquetFile, file: InputFile, names: Sequence[str] | None) -> None:
    """Refuse (InputError) a Parquet file whose column chunks of `names` (all when None) would
    expand, once decompressed, past _BOMB_FLOOR bytes and _MAX_RATIO times their stored size:
    a decompression bomb, or values far over any judge call (the item limit is 200,000
    characters). Read from the footer's sizes before a page is read."""
    meta = pf.metadata
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            size, stored = chunk.total_uncompressed_size, max(chunk.total_compressed_size, 1)
            if size <= _BOMB_FLOOR or size <= _MAX_RATIO * stored:
                continue
            path = chunk.path_in_schema
            if not _reads(path, names):
                continue
            raise InputError(
                f"{file}: column `{path}` of row group {g} ({group.num_rows:,} rows) expands from "
                f"{stored:,} bytes to {size:,} once decompressed ({size // stored:,} times): a "
                "decompression bomb, or values no judge call could take; nothing was read from "
                "it: re-export the file or leave it out"
            )


def _unreadable_parquet(file: InputFile, source: pa.NativeFile, exc: Exception) -> str:
    source.seek(0)
    magic = source.read(4)
    why = detail(exc)
    if magic != b"PAR1":
        return f"{file} is not a Parquet file ({why}); convert it to Parquet or leave it out"
    return f"{file} is a corrupt or truncated Parquet file ({why}); re-export it or leave it out"


def parquet_batches(
    pf: pq.ParquetFile, file: InputFile, batch_rows: int, names: list[str] | None
) -> Iterator[pa.RecordBatch]:
    check_expansion(pf, file, names)  # (the file may have changed since it was inspected)
    batches = pf.iter_batches(batch_size=batch_rows, columns=names)
    first_row = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            raise InputError(
                f"cannot read {file} after row {first_row:,} ({detail(exc)}); the file is "
                "corrupt: re-export it or leave it out of the input"
            ) from exc
        yield batch
        first_row += batch.num_rows


# ---------------------------------------------------------------- text formats: bytes


def _stream(file: InputFile, options: StorageSettings | None) -> pa.NativeFile:
    filesystem, path = fs.resolve(file.path, options)
    try:
        stream = filesystem.open_input_stream(path, compression=file.compression)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot open {file} ({detail(exc)}); check the path and access") from exc
    assert isinstance(stream, pa.NativeFile)
    return stream


def _read_error(file: InputFile, exc: BaseException) -> InputError:
    hint = f"a {file.compression} file that cannot be decompressed" if file.compression else ""
    what = hint or "unreadable"
    return InputError(f"cannot read {file}: {what} ({detail(exc)}); re-export it or leave it out")


def _line_chunks(file: InputFile, stream: pa.NativeFile, rows: int) -> Iterator[list[bytes]]:
    """Non-blank lines of a JSON Lines stream in lists of `rows` (the last may be shorter)."""
    pending = b""
    lines: list[bytes] = []
    first = True
    while True:
        try:
            block = stream.read(_BLOCK)
        except (OSError, pa.ArrowException) as exc:
            raise _read_error(file, exc) from exc
        if not block:
            break
        if first and block.lstrip()[:1] == b"[":
            raise InputError(
                f"{file} holds a JSON array, not JSON Lines; write one JSON object per line "
                "(for example `jq -c '.[]' in.json > out.jsonl`)"
            )
        first = False
        *complete, pending = (pending + block).split(b"\n")
        for line in complete:
            if line.strip():
                lines.append(line)
                if len(lines) == rows:
                    yield lines
                    lines = []
    if pending.strip():
        lines.append(pending)
    if lines:
        yield lines


def json_line(file: InputFile, options: StorageSettings | None, record: int) -> int:
    """The line number (from 1, blank lines counted) of a JSON Lines file's record number
    `record` (from 0, blank lines skipped as the reader skips them); for an error message."""
    seen, line = -1, 0
    with _stream(file, options) as stream:
        pending = b""
        while True:
            try:
                block = stream.read(_BLOCK)
            except (OSError, pa.ArrowException):
                return record + 1  # unreadable here: the record's number is the best guess
            if not block:
                break
            *complete, pending = (pending + block).split(b"\n")
            for text in complete:
                line += 1
                seen += bool(text.strip())
                if seen == record:
                    return line
    return line + 1 if pending.strip() and seen + 1 == record else record + 1


MAX_JSON_DEPTH = 64  # nesting an input line may have; PyArrow's reader crashes on ~100,000
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[][{}]')


def _depth(line: bytes) -> int:
    """How deep `line`'s arrays and objects nest; brackets inside strings do not count."""
    if line.count(b"[") + line.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # cannot be deeper: the common case costs two C-speed counts
    depth = deepest = 0
    for token in _JSON_TOKEN.finditer(line):
        mark = token.group()
        if mark in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif mark in (b"]", b"}"):
            depth -= 1
    return deepest


def _check_depth(file: InputFile, lines: list[bytes], first_row: int) -> None:
    for offset, line in enumerate(lines):
        if _depth(line) > MAX_JSON_DEPTH:
            raise InputError(
                f"{file} row {first_row + offset + 1:,} nests arrays or objects more than "
                f"{MAX_JSON_DEPTH} levels deep; no retrieval log needs that: fix the export "
                "or leave the row out"
            )


def _parse_json(
    file: InputFile, lines: list[bytes], first_row: int, schema: pa.Schema | None
) -> pa.Table:
    _check_depth(file, lines, first_row)
    data = b"\n".join(lines) + b"\n"
    read = pajson.ReadOptions(use_threads=False, block_size=min(len(data) + 1, _MAX_BLOCK))
    parse = pajson.ParseOptions(
        explicit_schema=schema,
        unexpected_field_behavior="ignore" if schema is not None else "infer",
    )
    try:
        return pajson.read_json(pa.BufferReader(data), read_options=read, parse_options=parse)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(
            f"{file} rows {first_row + 1:,}-{first_row + len(lines):,} are not valid JSON Lines "
            f"({detail(exc)}); every line must be one JSON object with the same field types: "
            "fix the export or leave the file out"
        ) from exc


def _csv_names(file: InputFile, options: StorageSettings | None) -> list[str]:
    with _stream(file, options) as stream:
        try:
            reader = pacsv.open_csv(stream, read_options=pacsv.ReadOptions(block_size=_BLOCK))
        except (pa.ArrowException, OSError) as exc:
            if "Empty CSV file" in str(exc):
                return []
            raise InputError(
                f"cannot read the CSV header of {file} ({detail(exc)}); check the file"
            ) from exc
        names = reader.schema.names
        reader.close()
    return list(names)


def _csv_reader(
    file: InputFile, stream: pa.NativeFile, names: Sequence[str]
) -> pacsv.CSVStreamingReader:
    convert = pacsv.ConvertOptions(
        column_types={name: pa.string() for name in names},
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
    )
    try:
        return pacsv.open_csv(
            stream,
            read_options=pacsv.ReadOptions(block_size=_BLOCK),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=convert,
        )
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"cannot read {file} as CSV ({detail(exc)}); check the file") from exc


def _rebatch(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """The same records in batches of exactly `rows` (the last may be shorter)."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        while batch.num_rows:
            take = min(rows - count, batch.num_rows)
            held.append(batch.slice(0, take))
            count += take
            batch = batch.slice(take)
            if count == rows:
                yield pa.concat_batches(held)
                held, count = [], 0
    if count:
        yield pa.concat_batches(held)


def _csv_batches(
    file: InputFile, options: StorageSettings | None, rows: int
) -> Iterator[pa.RecordBatch]:
    names = _csv_names(file, options)
    if not names:
        return
    with _stream(file, options) as stream:
        reader = _csv_reader(file, stream, names)
        first_row = 0

        def raw() -> Iterator[pa.RecordBatch]:
            nonlocal first_row
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                except (pa.ArrowException, OSError) as exc:
                    raise InputError(
                        f"cannot read {file} after row {first_row:,} ({detail(exc)}); fix the CSV "
                        "(quoting, column count) or leave the file out"
                    ) from exc
                first_row += batch.num_rows
                yield batch

        yield from _rebatch(raw(), rows)


# ---------------------------------------------------------------- text formats: inspection


def _json_type(t: pa.DataType) -> pa.DataType:
    """JSON has strings, not timestamps: Arrow's inferred timestamps go back to strings."""
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t):
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_json_type(t.value_type))
    return canonical_type(t)


def _widen(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The common type of two inferred JSON types (null fits anything, int widens to double)."""
    if a.equals(b) or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    numeric = {pa.types.is_integer(a) or pa.types.is_floating(a)}
    numeric.add(pa.types.is_integer(b) or pa.types.is_floating(b))
    if numeric == {True}:
        return pa.float64()
    if pa.types.is_list(a) and pa.types.is_list(b):
        inner = _widen(a.value_type, b.value_type)
        return None if inner is None else pa.list_(inner)
    return None


@dataclass(frozen=True, slots=True)
class TextScan:
    """What one pass over a text file learned: its schema (as the checks see it) and rows."""

    schema: pa.Schema
    rows: int
    conflicts: tuple[str, ...] = ()  # fields whose JSON types differ between rows (dropped)


def scan_text(
    file: InputFile, options: StorageSettings | None, lists: dict[str, pa.DataType]
) -> TextScan:
    """Read a JSON Lines or CSV file once: unified schema, row count, and that every mapped
    list column (`lists`: name -> list type) holds lists, or text that decodes as JSON arrays."""
    fields: dict[str, pa.DataType] = {}
    conflicts: list[str] = []
    rows = 0
    for batch in _raw_text(file, options, None, _SCAN_ROWS):
        for field in batch.schema:
            t = _json_type(field.type) if file.format == "json" else pa.string()
            if field.name in conflicts:
                continue
            seen = fields.get(field.name)
            merged = t if seen is None else _widen(seen, t)
            if merged is None:
                conflicts.append(field.name)
                fields.pop(field.name)
            else:
                fields[field.name] = merged
        _check_encoded_lists(file, batch, lists, rows)
        rows += batch.num_rows
    schema = pa.schema(list(fields.items()))
    for name, list_type in lists.items():  # JSON-encoded lists read as lists
        if name in fields and fields[name] == pa.string():
            field = pa.field(name, list_type, metadata={_ENCODED: b"1"})
            schema = schema.set(schema.get_field_index(name), field)
    return TextScan(schema, rows, tuple(conflicts))


def _check_encoded_lists(
    file: InputFile, batch: pa.RecordBatch, lists: dict[str, pa.DataType], first_row: int
) -> None:
    for name, list_type in lists.items():
        if name not in batch.schema.names:
            continue
        column = batch.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue
        for row, value in enumerate(column.to_pylist()):
            if value is None or _decode_list(value, list_type) is not None:
                continue
            shown = value if len(value) <= 60 else value[:59] + "…"
            kind = "strings" if list_type.value_type == pa.string() else "booleans"
            raise InputError(
                f"column `{name}` in {file} row {first_row + row + 1:,} is text, not a JSON "
                f"array of {kind} ({shown!r}); {file.format.upper()} has no list type: write "
                'each row\'s items as a JSON array such as ["first passage", "second"], or give an '
                "extractor (--extractor module:function) that builds the list from the row"
            )


def _decode_list(value: str, list_type: pa.DataType) -> list[object] | None:
    try:
        items = json.loads(value)
    except (ValueError, RecursionError):
        return None
    want = str if list_type.value_type == pa.string() else bool
    if not isinstance(items, list) or not all(i is None or type(i) is want for i in items):
        return None
    return items


def _text_lists(
    batch: pa.RecordBatch, lists: dict[str, pa.DataType]
) -> Iterator[tuple[int, str, pa.Array, pa.DataType]]:
    """The mapped list columns of `batch` that hold text: (index, name, column, list type)."""
    for name, list_type in lists.items():
        if name not in batch.schema.names:
            continue
        index = batch.schema.get_field_index(name)
        column = batch.column(index)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            yield index, name, column, list_type


def decode_lists(batch: pa.RecordBatch, lists: dict[str, pa.DataType]) -> pa.RecordBatch:
    """Mapped list columns that arrived as text (CSV, or a JSON string) decoded from JSON."""
    for index, name, column, list_type in list(_text_lists(batch, lists)):
        values = [None if v is None else _decode_list(v, list_type) for v in column.to_pylist()]
        batch = batch.set_column(index, name, pa.array(values, list_type))
    return batch


_NOT_A_LIST = (
    "invalid_input: column `{}` holds text that is not a JSON array of {} (one per item, "
    'e.g. ["first passage", "second"])'
)


def decode_json_text(
    batch: pa.RecordBatch, lists: dict[str, pa.DataType]
) -> tuple[pa.RecordBatch, list[str | None] | None]:
    """Parquet list roles held as JSON text (`'["first", "second"]'`, as CSV holds them)
    decoded into lists, the whole column at once (Polars); only when that fails or yields
    another type are the values read one by one, and a row whose text is not a JSON array of
    the list's kind is that row's input error (its list null), never the batch's."""
    problems: list[str | None] | None = None
    for index, name, column, list_type in list(_text_lists(batch, lists)):
        decoded = _decode_column(column, list_type)
        if decoded is None:  # the slow way, value by value
            values = column.to_pylist()
            items = [None if v is None else _decode_list(v, list_type) for v in values]
            kind = "strings" if list_type.value_type == pa.string() else "booleans"
            problems = problems or [None] * batch.num_rows
            for row, (value, got) in enumerate(zip(values, items, strict=True)):
                if value is not None and got is None:
                    problems[row] = problems[row] or _NOT_A_LIST.format(name, kind)
            decoded = pa.array(items, list_type)
        batch = batch.set_column(index, name, decoded)
    return batch, problems


def _decode_column(column: pa.Array, list_type: pa.DataType) -> pa.Array | None:
    """The column decoded by Polars, or None unless every value is a JSON array of the list's
    kind (strings or booleans: Polars would coerce numbers, ctxprec refuses them as CSV does)."""
    want = pl.List(pl.String) if list_type.value_type == pa.string() else pl.List(pl.Boolean)
    text = pl.Series(values=column)
    filled = text.drop_nulls()
    if filled.len() and not bool(filled.str.strip_chars_start().str.starts_with("[").all()):
        return None
    try:
        decoded = text.str.json_decode(infer_schema_length=None)
    except pl.exceptions.PolarsError:
        return None
    if decoded.dtype == pl.List(pl.Null):
        decoded = decoded.cast(want)
    if decoded.dtype != want or decoded.null_count() != text.null_count():
        return None
    return decoded.to_arrow(compat_level=pl.CompatLevel.oldest()).cast(list_type)


# ---------------------------------------------------------------- text formats: batches


def _raw_text(
    file: InputFile, options: StorageSettings | None, schema: pa.Schema | None, rows: int
) -> Iterator[pa.RecordBatch]:
    if file.format == "csv":
        yield from _csv_batches(file, options, rows)
        return
    with _stream(file, options) as stream:
        first_row = 0
        for lines in _line_chunks(file, stream, rows):
            table = _parse_json(file, lines, first_row, schema)
            yield from _as_one_batch(table)
            first_row += len(lines)


def _as_one_batch(table: pa.Table) -> Iterator[pa.RecordBatch]:
    batches = table.combine_chunks().to_batches()
    if batches:
        yield pa.concat_batches(batches) if len(batches) > 1 else batches[0]


def text_batches(
    file: InputFile,
    options: StorageSettings | None,
    schema: pa.Schema,
    rows: int,
    wanted: Sequence[int] | None = None,
) -> Iterator[tuple[int, pa.RecordBatch | None]]:
    """(batch index, batch) for each batch of `rows` records; batches not in `wanted` come
    as None (JSON Lines: their lines are not even parsed)."""
    keep = None if wanted is None else set(wanted)
    last = None if wanted is None else max(wanted, default=-1)
    if file.format == "csv":
        for index, batch in enumerate(_csv_batches(file, options, rows)):
            if last is not None and index > last:
                return
            yield index, batch if keep is None or index in keep else None
        return
    read_schema = pa.schema([pa.field(f.name, pa.string()) if _encoded(f) else f for f in schema])
    with _stream(file, options) as stream:
        first_row = 0
        for index, lines in enumerate(_line_chunks(file, stream, rows)):
            if last is not None and index > last:
                return
            if keep is None or index in keep:
                table = _parse_json(file, lines, first_row, read_schema)
                yield index, next(_as_one_batch(table), None)
            else:
                yield index, None
            first_row += len(lines)


def _encoded(field: pa.Field) -> bool:
    """Whether `scan_text` found this list column as JSON-encoded text."""
    return (field.metadata or {}).get(_ENCODED) == b"1"
