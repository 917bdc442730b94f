"""Up-front checks of the input: readable files, mapped columns and their types, one schema
across files, unique non-null ids. Every failure is an `InputError` that says what to do next.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from ctxprec.connectors.sources.files import InputFile
from ctxprec.storage.core.errors import InputError
from ctxprec.storage.core.figures import counted
from ctxprec.storage.outdir.schema import output_schema

__all__ = [
    "INPUT_ERROR",
    "LIST_ROLES",
    "NORMALIZED_TYPES",
    "Duplicates",
    "FieldRef",
    "IdScan",
    "Wanted",
    "Where",
    "canonical_type",
    "check_ids",
    "check_names",
    "check_partition_overlap",
    "dataset_partitions",
    "detail",
    "field_ref",
    "file_columns",
    "merge_columns",
    "path_parts",
    "root_partitions",
    "with_field_refs",
]

# normalized frame columns (besides "id") and the Arrow type each one is given
NORMALIZED_TYPES: dict[str, pa.DataType] = {
    "query": pa.string(),
    "expected": pa.string(),
    "context": pa.list_(pa.string()),
    "labels": pa.list_(pa.bool_()),
}
# normalized frame column: a row-level problem found while reading the row (else null)
INPUT_ERROR = "_input_error"
_RESERVED_FRAME = frozenset({"id", "source_row", INPUT_ERROR, *NORMALIZED_TYPES})
_RANK_COLUMN = re.compile(r"(precision|hit|ndcg)_at_\d+")
_ROW_BITS = 32
_MAX_LISTED = 20


@dataclass(frozen=True, slots=True)
class Wanted:
    """One column the run needs: its role (id, query, ..., passthrough) and whether it may be
    absent (only the default expected-output column)."""

    role: str
    column: str
    optional: bool = False


ColumnTypes = dict[str, tuple[pa.DataType | None, InputFile]]


def detail(exc: BaseException, limit: int = 300) -> str:
    """A library error's text on one line (Arrow's can hold newlines and stray bytes)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def canonical_type(t: pa.DataType) -> pa.DataType:
    """Collapse physical variants (large_, _view, dictionary) so producers can be compared."""
    if pa.types.is_dictionary(t):
        return canonical_type(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(canonical_type(t.value_type))
    return t


def _unify(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The common type of two canonical types (null fits anything), None when they differ."""
    if a.equals(b) or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_list(a) and pa.types.is_list(b):
        inner = _unify(a.value_type, b.value_type)
        return None if inner is None else pa.list_(inner)
    return None


def _is_text(t: pa.DataType) -> bool:
    return _unify(canonical_type(t), pa.string()) is not None


_RULES: dict[str, tuple[Callable[[pa.DataType], bool], str]] = {
    "id": (
        lambda t: pa.types.is_integer(canonical_type(t)) or canonical_type(t) == pa.string(),
        "a string or integer column",
    ),
    "query": (_is_text, "a string column"),
    "expected": (_is_text, "a string column"),
    "context": (
        lambda t: _unify(canonical_type(t), pa.list_(pa.string())) is not None or _is_text(t),
        "a list<string> column (one string per context item, in ranked order), a field of a "
        "list<struct> column (--map context=COLUMN.FIELD), or text holding a JSON array",
    ),
    "labels": (
        lambda t: _unify(canonical_type(t), pa.list_(pa.bool_())) is not None or _is_text(t),
        "a list<bool> column, a field of a list<struct> column, or text holding a JSON array",
    ),
}
LIST_ROLES = ("context", "labels")  # roles a JSON array held as text may fill


# column names that often hold a field under another name, most likely first (any case)
_LIKELY: dict[str, tuple[str, ...]] = {
    "id": ("id", "row_id", "uuid", "qid", "query_id", "question_id", "example_id", "sample_id"),
    "query": ("query", "question", "user_input", "input", "prompt", "user_query", "query_text"),
    "expected": (
        "expected_output", "ground_truth", "answer", "reference", "expected", "expected_answer",
        "gold_answer", "reference_answer", "ground_truths", "target",
    ),
    "context": (
        "contexts", "context", "retrieved_contexts", "passages", "documents", "docs", "chunks",
        "retrieved", "retrieved_docs",
    ),
    "labels": ("labels", "relevance", "relevance_labels", "gold_labels", "is_relevant"),
}  # fmt: skip
_WHY = {
    "expected": "is the expected output: without it each item is judged against the query alone",
    "labels": "are human relevance labels, optional: the summary then shows the judge's agreement",
}


# the field of a list<struct> column's items that most likely holds an item's text (a
# warehouse's or a tracing tool's retrieved documents)
_ITEM_FIELDS = {
    "context": ("text", "content", "page_content", "chunk", "passage", "document", "body"),
    "labels": ("relevant", "is_relevant", "label", "relevance"),
}


def _struct_field(kind: pa.DataType, role: str) -> str | None:
    """The field of list<struct> items that most likely holds `role`'s values."""
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return None
    inner = kind.value_type
    if not pa.types.is_struct(inner) or role not in _ITEM_FIELDS:
        return None
    element = pa.string() if role == "context" else pa.bool_()
    fields = {inner.field(i).name.lower(): inner.field(i) for i in range(inner.num_fields)}
    for guess in _ITEM_FIELDS[role]:
        found = fields.get(guess)
        if found is not None and canonical_type(found.type) == element:
            return str(found.name)
    return None


def _likely(schema: pa.Schema, role: str, taken: set[str]) -> str | None:
    """The column of `schema` that most likely holds `role` (right type, not mapped already),
    or the field of a list<struct> column's items that does (`retrieved_docs.text`)."""
    by_name: dict[str, str] = {str(n).lower(): str(n) for n in schema.names if n not in taken}
    for guess in _LIKELY.get(role, ()):
        name = by_name.get(guess)
        if name is None:
            continue
        if _RULES[role][0](schema.field(name).type):
            return name
        if (inner := _struct_field(schema.field(name).type, role)) is not None:
            return f"{name}.{inner}"
    return None


def _suggestion(schema: pa.Schema, wanted: Sequence[Wanted]) -> str:
    """`--map` for every field of `wanted` whose column is absent and that the data seems to
    hold under another name (an absent optional expected output included), or ""."""
    taken = {w.column for w in wanted if w.column in schema.names}
    roles = [w.role for w in wanted if w.column not in schema.names and w.role != "passthrough"]
    if not any(w.role == "labels" for w in wanted):  # not mapped: offered when the data has them
        roles.append("labels")
    pairs, notes = [], []
    for role in roles:
        if (name := _likely(schema, role, taken)) is not None:
            taken.add(name)
            pairs.append(f"{role}={name}")
            notes += [f"{role} {_WHY[role]}"] if role in _WHY else []
    if not pairs:
        return ""
    why = f" ({'; '.join(notes)})" if notes else ""
    return f"; the data seems to hold these fields: --map {','.join(pairs)}{why}"


def _listed(names: Sequence[str]) -> str:
    extra = len(names) - _MAX_LISTED
    shown = ", ".join(names[:_MAX_LISTED])
    return f"{shown}, … ({extra} more)" if extra > 0 else shown


def _missing(path: InputFile, schema: pa.Schema, want: Wanted) -> InputError:
    head = f"column `{want.column}` is missing in {path} (columns: {_listed(schema.names)})"
    if want.role == "passthrough":
        return InputError(f"{head}; fix the name or remove it from passthrough")
    fix = f'map it with --map {want.role}=COLUMN or [columns] {want.role} = "COLUMN"'
    if want.role == "context":
        fix += ", or give a context extractor (--extractor module:function)"
    return InputError(f"{head}; {fix}")


def _type_hint(role: str, t: pa.DataType, column: str) -> str:
    c = canonical_type(t)
    if c == pa.binary() or (pa.types.is_list(c) and c.value_type == pa.binary()):
        return "binary is not text: decode the bytes to UTF-8 strings and rewrite the file"
    inner = c.value_type if pa.types.is_list(c) else c
    if pa.types.is_struct(inner):  # a warehouse's list<struct<doc_id, text, score>>
        names = [inner.field(i).name for i in range(inner.num_fields)]
        text = [n for n in names if _is_text(inner.field(n).type)] or names
        guess = _struct_field(t, role) or text[0]
        return (
            f"its items are structs with the fields {', '.join(names)}: map the one that holds "
            f"the {role}, e.g. --map {role}={column}.{guess} (other fields can go to the "
            f"output with --passthrough {column}.FIELD)"
        )
    if role == "context" and pa.types.is_list(c):
        return "the context items must be strings: cast them to string when writing the data"
    return f"convert it, or map another column with --map {role}=COLUMN"


def _check_type(path: InputFile, field: pa.Field, role: str) -> None:
    rule = _RULES.get(role)
    if rule is None or rule[0](field.type):
        return
    raise InputError(
        f"column `{field.name}` ({role}) in {path} has type {field.type}; {role} must be "
        f"{rule[1]}; {_type_hint(role, field.type, field.name)}"
    )


def _all_missing(path: InputFile, schema: pa.Schema, wants: Sequence[Wanted]) -> InputError:
    """Every missing mapped column in one message, so one run shows all there is to fix."""
    if len(wants) == 1:
        return _missing(path, schema, wants[0])
    names = ", ".join(f"`{w.column}` ({w.role})" for w in wants)
    fixes = "; ".join(
        f"remove {w.column} from passthrough"
        if w.role == "passthrough"
        else f"--map {w.role}=COLUMN"
        + (" or --extractor module:function" if w.role == "context" else "")
        for w in wants
    )
    return InputError(
        f"columns {names} are missing in {path} (columns: {_listed(schema.names)}); "
        f"map them: {fixes}"
    )


FieldRef = tuple[str, tuple[str, ...], bool]  # (column, struct field path, over a list's items)


def field_ref(schema: pa.Schema, name: str) -> tuple[FieldRef, pa.DataType] | None:
    """`name` as COLUMN.FIELD (or COLUMN.FIELD.FIELD): a field of a struct column, or of every
    struct of a list<struct> column (then a list of the field), with the type it reads as; None
    when `name` is a column itself or no column of `schema` starts it. A field the struct
    lacks is an InputError naming the fields it has."""
    if name in schema.names or "." not in name:
        return None
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        column = ".".join(parts[:cut])
        if column not in schema.names:
            continue
        kind = schema.field(column).type
        over_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        inner = kind.value_type if over_list else kind
        for i, step in enumerate(parts[cut:]):
            if not pa.types.is_struct(inner):
                where = ".".join([column, *parts[cut : cut + i]])
                raise InputError(
                    f"`{name}`: `{where}` is {inner}, not a struct with fields; map a column "
                    "or a field of a struct column (COLUMN.FIELD)"
                )
            if inner.get_field_index(step) < 0:
                have = ", ".join(inner.field(j).name for j in range(inner.num_fields))
                raise InputError(
                    f"`{name}`: the structs of column `{column}` have no field `{step}` (their "
                    f"fields: {have}); map one of those"
                )
            inner = inner.field(step).type
        return (column, tuple(parts[cut:]), over_list), (pa.list_(inner) if over_list else inner)
    return None


def with_field_refs(schema: pa.Schema, names: Iterable[str]) -> pa.Schema:
    """`schema` with a field for each of `names` that is a struct field reference (named as
    given, typed as it reads): the checks then treat it as a column."""
    for name in names:
        found = field_ref(schema, name)
        if found is not None:
            schema = schema.append(pa.field(name, found[1]))
    return schema


def file_columns(path: InputFile, schema: pa.Schema, wanted: Iterable[Wanted]) -> ColumnTypes:
    """Check one file's mapped columns; canonical type per column (None: optional and absent).
    A mapped COLUMN.FIELD of a struct or list<struct> column counts as a column of the field's
    type (a list of it over a list)."""
    found: ColumnTypes = {}
    wanted = list(wanted)
    schema = with_field_refs(schema, [w.column for w in wanted])
    absent = list(
        {
            w.column: w for w in reversed(wanted) if w.column not in schema.names and not w.optional
        }.values()
    )[::-1]
    if absent:
        error = _all_missing(path, schema, absent)
        raise InputError(f"{error}{_suggestion(schema, wanted)}")
    for want in wanted:
        if want.column not in schema.names:
            found.setdefault(want.column, (None, path))
            continue
        field = schema.field(want.column)
        _check_type(path, field, want.role)
        found[want.column] = (canonical_type(field.type), path)
    return found


def merge_columns(merged: ColumnTypes, current: ColumnTypes) -> ColumnTypes:
    """Fold one file's column types into those seen so far; differences name both files."""
    out = dict(merged)
    for name, (seen, seen_in) in merged.items():
        now, path = current[name]
        if (seen is None) != (now is None):
            has, lacks = (seen_in, path) if now is None else (path, seen_in)
            raise InputError(
                f"column `{name}` is in {has} but not in {lacks}; all input files need the same "
                "mapped columns: add it, or score the two groups of files separately"
            )
        if seen is None or now is None:
            continue
        unified = _unify(seen, now)
        if unified is None:
            raise InputError(
                f"column `{name}` is {seen} in {seen_in} but {now} in {path}; all input files "
                "need the same schema: rewrite one of them, or score them separately"
            )
        out[name] = (unified, seen_in if unified.equals(seen) else path)
    return out


def check_names(names: Iterable[str], mapped: Mapping[str, str | None], what: str) -> None:
    """Passthrough (or partition) names must not collide with output or normalized columns.

    A passthrough named like a normalized column is fine when it *is* that mapped column.
    """
    taken = set(output_schema(labels=True, audit=True).names)
    for name in names:
        if name in taken or _RANK_COLUMN.fullmatch(name):
            raise InputError(
                f"{what} `{name}` has the name of an output column; rename it on the way out "
                f"with --passthrough {name}=NEW_NAME (or leave it out of passthrough)"
            )
        if name in _RESERVED_FRAME and mapped.get(name) != name:
            raise InputError(
                f"{what} `{name}` clashes with the normalized `{name}` column; rename it in "
                "the data (or leave it out of passthrough)"
            )


def check_partition_overlap(path: InputFile, schema: pa.Schema, keys: Iterable[str]) -> None:
    """A Hive partition key may not also be a column inside the file."""
    for key in keys:
        if key in schema.names:
            raise InputError(
                f"`{key}` is both a Hive partition folder ({key}=...) and a column in {path}; "
                "drop the column from the files or rename the folders"
            )


def path_parts(path: str) -> tuple[str, ...]:
    """The components of a local path or an object URI (`s3://b/k/x` -> ("b", "k", "x"))."""
    if "://" in path:
        path = path.split("://", 1)[1]
    return tuple(part for part in path.replace("\\", "/").split("/") if part not in ("", "."))


def _is_partition(part: str) -> bool:
    return "=" in part[1:]


def root_partitions(root: str) -> tuple[str, ...]:
    """The `key=value` folders that end the given input path itself (`logs/dt=2026-11-28`,
    `s3://b/logs/dt=2026-11-28/`): partition columns like those below it. Only the trailing
    run counts, so a `a=b` folder higher up in a path is not taken for a partition."""
    parts = path_parts(root)
    trailing: list[str] = []
    for part in reversed(parts):
        if not _is_partition(part):
            break
        trailing.append(part.split("=", 1)[0])
    return tuple(reversed(trailing))


def _partition_keys(path: InputFile, root: str) -> tuple[str, ...]:
    parts = path_parts(path.path)[len(path_parts(root)) : -1]
    keys = root_partitions(root) + tuple(p.split("=", 1)[0] for p in parts if _is_partition(p))
    if len(set(keys)) != len(keys):
        raise InputError(
            f"{path} repeats a Hive partition key ({', '.join(keys)}); rename a folder"
        )
    return keys


def dataset_partitions(files: Sequence[InputFile], root: str) -> tuple[str, ...]:
    """Partition keys shared by every file (`.../dt=2026-11-30/region=eu/part.parquet`),
    counting those that end the input path itself."""
    keys = _partition_keys(files[0], root)
    for path in files[1:]:
        other = _partition_keys(path, root)
        if other != keys:
            raise InputError(
                f"Hive partition folders differ: {files[0]} has ({', '.join(keys)}) but {path} "
                f"has ({', '.join(other)}); give one dataset with the same folder levels"
            )
    return keys


IdScan = Callable[[], pl.LazyFrame]  # one file's id column as a frame with an `id` column
# where row `index` (0-based) of file number `file` is, for people: "data/x.parquet row 11",
# "data/x.jsonl line 11" (`ctxprec.connectors.sources.stream` knows how to find the line)
Where = Callable[[int, int], str]


@dataclass(frozen=True)
class Duplicates:
    """Ids on several input rows, under a keep policy ("keep-first", "keep-last"): the rows
    that are not scored, per file as sorted 0-based row indexes (read past when streaming)."""

    policy: str
    ids: int  # distinct ids found on more than one row
    rows: int  # rows dropped
    drop: tuple[tuple[int, ...], ...]  # per file

    def as_dict(self) -> dict[str, object]:
        """What run.json and the summary say of them."""
        return {"policy": self.policy, "ids": self.ids, "rows_dropped": self.rows}


def _id_frame(scans: Sequence[IdScan], as_string: bool) -> pl.LazyFrame:
    parts = []
    for index, scan in enumerate(scans):
        ids = pl.col("id").cast(pl.String) if as_string else pl.col("id")
        parts.append(
            scan()
            .select(ids.alias("id"))
            .with_row_index("row")
            .with_columns(pl.lit(index, pl.UInt64).alias("file"))
        )
    position = (pl.col("file") * (1 << _ROW_BITS) + pl.col("row").cast(pl.UInt64)).alias("pos")
    return pl.concat(parts, how="vertical_relaxed").select("id", position)


def _row_where(files: Sequence[InputFile]) -> Where:
    """Rows counted from 1, as editors and spreadsheets count them."""
    return lambda file, index: f"{files[file]} row {index + 1:,}"


def _split(pos: int) -> tuple[int, int]:
    return pos >> _ROW_BITS, pos & ((1 << _ROW_BITS) - 1)


def _check_nulls(ids: pl.LazyFrame, where: Where, id_column: str) -> None:
    nulls = ids.select(
        pl.col("id").null_count().alias("n"),
        pl.col("pos").filter(pl.col("id").is_null()).min().alias("at"),
    ).collect(engine="streaming")
    count, at = nulls.row(0)
    if count:
        raise InputError(
            f"column `{id_column}` (id) is null in {where(*_split(at))} ({count} null ids in "
            "total); every row needs an id: fill them in, or map another column with "
            "--map id=COLUMN"
        )


_POLICY_FLAG = "--duplicate-ids keep-first|keep-last ([columns] duplicate_ids)"


def _check_unique(
    ids: pl.LazyFrame, where: Where, id_column: str, policy: str, n_files: int
) -> Duplicates | None:
    """No id on two rows (policy "refuse", an InputError naming the first repeated id and
    where it is); or, keeping the first or the last row of each, the rows to drop."""
    dups = (
        ids.group_by("id")
        .agg(pl.len().alias("n"), pl.col("pos").min().alias("first"))
        .filter(pl.col("n") > 1)
        .select(pl.len().alias("ids"), pl.col("id").sort_by("first").first())
        .collect(engine="streaming")
    )
    count, value = dups.row(0)
    if not count:
        return None
    if policy == "refuse":
        hits = ids.filter(pl.col("id") == value).select("pos").head(3).collect(engine="streaming")
        said = "; ".join(where(*_split(pos)) for pos in hits["pos"])
        raise InputError(
            f"duplicate id {value!r} in column `{id_column}`: {said} "
            f"({counted(count, 'duplicated id')} in total); ids must be unique across all input "
            f"files: deduplicate the data, map a unique column with --map id=COLUMN, or score "
            f"one row of each id with {_POLICY_FLAG}"
        )
    keep = pl.col("pos").min() if policy == "keep-first" else pl.col("pos").max()
    repeated = ids.filter(pl.col("id").is_duplicated())
    kept = repeated.group_by("id").agg(keep.alias("pos"))
    dropped = repeated.join(kept, on=["id", "pos"], how="anti").select("pos").sort("pos")
    positions = dropped.collect(engine="streaming").get_column("pos").to_numpy()
    file_of, row_of = positions >> _ROW_BITS, positions & ((1 << _ROW_BITS) - 1)
    per_file = tuple(tuple(row_of[file_of == f].tolist()) for f in range(n_files))
    return Duplicates(policy, int(count), len(positions), per_file)


def check_ids(
    files: Sequence[InputFile],
    scans: Sequence[IdScan],
    id_column: str,
    id_type: pa.DataType,
    *,
    policy: str = "refuse",
    where: Where | None = None,
) -> Duplicates | None:
    """Scan only the id column of every file (Polars streaming): no nulls, and no duplicates
    (or, under a keep policy, the rows that repeat an id: not scored)."""
    as_string = id_type == pa.string()
    where = where or _row_where(files)
    try:
        ids = _id_frame(scans, as_string)
        _check_nulls(ids, where, id_column)
        return _check_unique(ids, where, id_column, policy, len(files))
    except pl.exceptions.PolarsError as exc:
        said = _unreadable_ids(files, scans, as_string)
        raise InputError(
            f"cannot read the id column `{id_column}` of {said} ({detail(exc)}); ids must be "
            "readable (string ids valid UTF-8): re-export the file, or map another column with "
            "--map id=COLUMN"
        ) from exc


def _unreadable_ids(files: Sequence[InputFile], scans: Sequence[IdScan], as_string: bool) -> str:
    """The first file whose id column cannot be read (only called once the scan failed)."""
    for path, scan in zip(files, scans, strict=True):
        try:
            _id_frame([scan], as_string).collect(engine="streaming")
        except pl.exceptions.PolarsError:
            return str(path)
    return "the input"
