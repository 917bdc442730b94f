"""`--sink iceberg:CATALOG/NAMESPACE.TABLE`: append a run's rows to an Apache Iceberg table through
pyiceberg, creating it on first use; each id at most once, in one snapshot.

The catalog is configured the pyiceberg way (`.pyiceberg.yaml`, `PYICEBERG_CATALOG__<NAME>__*`
variables); ctxprec names the catalog and holds none of its settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from ctxprec.connectors.sinks.base import (
    SinkResult,
    counted,
    error_summary,
    raise_append_error,
    read_parts,
    require_package,
    schema_one_hint,
)
from ctxprec.storage.core.errors import ConfigError, OutputError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.files.objpath import OutPath

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table, Transaction

__all__ = ["SNAPSHOT_PROPERTY", "IcebergSink"]

# recorded in the summary of every snapshot ctxprec commits: which tool wrote it
SNAPSHOT_PROPERTY = "ctxprec.sink"
# up to this many ids, the id filter is pushed into the scan (pruning files by their id bounds);
# more are matched in Arrow only, after reading the whole id column
# a commit that lost a race with another writer is redone on the new table state this often
_COMMIT_ATTEMPTS = 3
_FORM = "use iceberg:CATALOG/NAMESPACE.TABLE (e.g. iceberg:lake/analytics.ctxprec_scores)"


def parse_identifier(spec: str, rest: str) -> tuple[str, tuple[str, ...]]:
    """`CATALOG/NAMESPACE.TABLE` -> (catalog, (namespace..., table)); namespaces may nest."""
    catalog, sep, identifier = rest.partition("/")
    parts = tuple(identifier.split("."))
    if not sep or not catalog or len(parts) < 2 or not all(p.strip() for p in parts):
        raise ConfigError(f"sink {spec!r} names no Iceberg catalog, namespace and table; {_FORM}")
    return catalog, parts


def _iceberg_schema(schema: pa.Schema) -> Schema:
    """The Arrow schema as pyiceberg stores it, with fresh field ids (1, 2, ...)."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import assign_fresh_schema_ids

    try:
        return assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema))
    except Exception as exc:
        raise OutputError(
            f"the output schema cannot be stored in Iceberg: {error_summary(exc)}"
        ) from exc


def _problems(table: Schema, wanted: Schema) -> list[str]:
    """Why a table with schema `table` cannot take rows of schema `wanted` (empty: it can).
    Output columns the table lacks are not a problem: the table's schema is evolved to add them.
    """
    have = {f.name: f for f in table.fields}
    want = {f.name: f for f in wanted.fields}
    problems: list[str] = []
    unwritten = [n for n, f in have.items() if n not in want and f.required]
    if unwritten:
        problems.append(f"required column(s) ctxprec does not write: {', '.join(unwritten)}")
    changed = [
        f"{name} (table {have[name].field_type}, output {field.field_type})"
        for name, field in want.items()
        if name in have and str(have[name].field_type) != str(field.field_type)
    ]
    if changed:
        problems.append(f"type: {', '.join(changed)}")
    nulls = [n for n, f in want.items() if n in have and have[n].required and f.optional]
    if nulls:
        problems.append(f"required in the table, may be null in the output: {', '.join(nulls)}")
    return problems


def _id_in(ids: pa.Array) -> BooleanExpression:
    """`In("id", ids)`: pyiceberg's predicates take a column name, which their
    pydantic-generated signatures (all mypy sees) do not say."""
    from pyiceberg.expressions import In

    make: Any = In
    return cast("BooleanExpression", make("id", ids.to_pylist()))


def _first_per_id(rows: pa.Table) -> pa.Table:
    """Each id once (the first row), should the pending files hold an id twice."""
    import pyarrow.compute as pc  # here: importing it builds every kernel's wrapper (~25 ms)

    if pc.count_distinct(rows["id"]).as_py() == rows.num_rows:
        return rows
    index = pa.array(range(rows.num_rows), pa.int64())
    firsts = (
        pa.table({"id": rows["id"], "__row": index})
        .group_by("id", use_threads=False)
        .aggregate([("__row", "min")])
    )
    first_rows = firsts["__row_min"]
    return rows.take(pc.take(first_rows, pc.sort_indices(first_rows)))


class IcebergSink:
    """One table of a pyiceberg catalog.

    Dedup and atomicity: the run's pending rows are read whole (pyiceberg writes a partitioned
    table from an Arrow table); the ids the table already holds, in any partition, are dropped
    (its id column is read, as Delta's MERGE and DuckDB's anti join do; a row in the table is
    never updated); what is left is committed as one snapshot, together with any schema
    evolution (a column a newer ctxprec adds). On first use the table is created in that same
    commit. The commit asserts the table's current snapshot: if another writer committed in
    between, the commit fails and is redone on the new state, so no id is ever added twice; on
    any other error nothing is committed.
    """

    def __init__(self, catalog: str, identifier: tuple[str, ...], seams: Seams = DEFAULT) -> None:
        self.seams = seams
        self.catalog_name = catalog
        self.identifier = identifier
        self.namespace = identifier[:-1]
        self.name = f"iceberg:{catalog}/{'.'.join(identifier)}"

    def check(self, schema: pa.Schema) -> None:
        require_package("pyiceberg", self.name)
        wanted = _iceberg_schema(schema)
        table = self._open(self._catalog())
        if table is not None:
            self._raise_if_cannot_take(table, wanted)

    def append(
        self, outdir: OutPath, files: Sequence[str], schema: pa.Schema, partition_by: Sequence[str]
    ) -> SinkResult:
        from pyiceberg.exceptions import CommitFailedException

        self.check(schema)
        stream, counter = counted(read_parts(outdir, files, schema, partition_by, self.seams))
        try:
            rows = _first_per_id(stream.read_all())
        except Exception as exc:
            raise_append_error(self.name, exc, counter)
        catalog = self._catalog()
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            try:
                added = self._commit(catalog, rows, schema, partition_by, len(files))
                break
            except CommitFailedException as exc:
                if attempt == _COMMIT_ATTEMPTS:
                    raise_append_error(self.name, exc, counter)
            except OutputError:
                raise
            except Exception as exc:
                raise_append_error(self.name, exc, counter)
        return SinkResult(self.name, added, counter.rows - added)

    # -- the catalog ------------------------------------------------------------------------
    def _catalog(self) -> Catalog:
        """The catalog from its pyiceberg settings, connected: a catalog that is unknown or
        misconfigured, or needs a package that is missing -> ConfigError; unreachable ->
        OutputError."""
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NotInstalledError

        given = self._settings()
        try:
            return load_catalog(self.catalog_name, **_aws_environment(given), **given)
        except (ImportError, NotInstalledError) as exc:
            raise ConfigError(
                f"{self.name}: this catalog type needs a package that is not installed "
                f"({error_summary(exc)}): pip install 'ctxprec[warehouse]', or the pyiceberg "
                "extra of the catalog (e.g. 'pyiceberg[glue]', 'pyiceberg[hive]')"
            ) from None
        except ValueError as exc:  # settings pyiceberg cannot use: no uri, an unknown type, ...
            raise ConfigError(
                f"{self.name}: Iceberg catalog {self.catalog_name!r} is misconfigured: "
                f"{error_summary(exc)}"
            ) from exc
        except Exception as exc:
            raise OutputError(
                f"{self.name}: cannot reach Iceberg catalog {self.catalog_name!r}: "
                f"{error_summary(exc)}"
            ) from exc

    def _settings(self) -> dict[str, Any]:
        """The catalog's pyiceberg settings, read afresh (.pyiceberg.yaml and PYICEBERG_CATALOG__*
        variables as they are now); `my_lake` also finds PYICEBERG_CATALOG__MY_LAKE__*, which
        pyiceberg files under `my-lake`."""
        from pyiceberg.utils.config import Config

        try:
            config = Config()
            settings = config.get_catalog_config(self.catalog_name) or config.get_catalog_config(
                self.catalog_name.replace("_", "-")
            )
        except ValueError as exc:
            raise ConfigError(f"{self.name}: {error_summary(exc)}") from exc
        if not settings:
            raise ConfigError(
                f"{self.name}: Iceberg catalog {self.catalog_name!r} is not configured; configure "
                "it the pyiceberg way: a `catalog:` entry in .pyiceberg.yaml (in $PYICEBERG_HOME, "
                f"the home folder or the current folder) or PYICEBERG_CATALOG__"
                f"{self.catalog_name.upper().replace('-', '_')}__TYPE, __URI, __WAREHOUSE, ... "
                "variables"
            )
        return dict(settings)

    def _open(self, catalog: Catalog) -> Table | None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return catalog.load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        except Exception as exc:
            raise OutputError(
                f"{self.name}: cannot open the table in catalog {self.catalog_name!r}: "
                f"{error_summary(exc)}"
            ) from exc

    def _raise_if_cannot_take(self, table: Table, wanted: Schema) -> None:
        problems = _problems(table.schema(), wanted)
        if problems:
            hint = schema_one_hint(f.name for f in table.schema().fields)
            raise OutputError(
                f"{self.name}: the existing table cannot take ctxprec's output "
                f"({'; '.join(problems)}); append to a new table instead{hint}"
            )

    # -- one commit -------------------------------------------------------------------------
    def _commit(
        self,
        catalog: Catalog,
        rows: pa.Table,
        schema: pa.Schema,
        partition_by: Sequence[str],
        files: int,
    ) -> int:
        """Write the rows whose id the table lacks, in one snapshot; how many were written."""
        import pyarrow.compute as pc  # here: importing it builds every kernel's wrapper (~25 ms)

        if rows.num_rows == 0:
            return 0
        table = self._open(catalog)
        if table is not None:
            self._raise_if_cannot_take(table, _iceberg_schema(schema))
            held = self._held(table, rows)
            self.seams.at("sink_held", held)
            rows = rows.filter(pc.invert(pc.is_in(rows["id"], held)))
        if rows.num_rows == 0:
            return 0
        properties = {
            SNAPSHOT_PROPERTY: self.name,
            "ctxprec.part-files": str(files),
            "ctxprec.rows": str(rows.num_rows),
        }
        transaction = self._transaction(catalog, table, schema, partition_by)
        transaction.append(rows, snapshot_properties=properties)
        transaction.commit_transaction()
        return int(rows.num_rows)

    def _transaction(
        self,
        catalog: Catalog,
        table: Table | None,
        schema: pa.Schema,
        partition_by: Sequence[str],
    ) -> Transaction:
        """A transaction that creates the table (no table yet) or evolves its schema (a new
        output column): either lands with the rows, in the same commit."""
        if table is None:
            catalog.create_namespace_if_not_exists(self.namespace)
            fresh = _iceberg_schema(schema)
            return catalog.create_table_transaction(
                self.identifier,
                fresh,
                partition_spec=_partition_spec(fresh, partition_by),
                properties={"write.parquet.compression-codec": "zstd"},
            )
        transaction = _without_own_retries(table).transaction()
        if set(schema.names) - {f.name for f in table.schema().fields}:
            with transaction.update_schema() as update:
                update.union_by_name(schema)
        return transaction

    def _held(self, table: Table, rows: pa.Table) -> pa.Array:
        """The ids of `rows` that the table already holds, in any partition: the table's id
        column is read (up to `seams.sink_id_filter` ids, files whose id bounds exclude them all are
        skipped) and matched against the run's ids in Arrow."""
        import pyarrow.compute as pc
        from pyiceberg.expressions import AlwaysTrue

        ids = rows["id"].combine_chunks()
        where: BooleanExpression = AlwaysTrue()
        if rows.num_rows <= self.seams.sink_id_filter:
            where = _id_in(ids)
        held: list[pa.Array] = []
        for batch in table.scan(row_filter=where, selected_fields=("id",)).to_arrow_batch_reader():
            column = batch.column("id")
            held.append(column.filter(pc.is_in(column, ids)))
        return pa.concat_arrays(held) if held else pa.array([], rows["id"].type)


def _aws_environment(settings: Mapping[str, object]) -> dict[str, str]:
    """The S3 endpoint and region from the standard AWS_* variables, which AWS SDKs and the other
    sinks honour and pyiceberg's S3 file IO does not (without a region it asks AWS where a bucket
    is, which no endpoint of your own can answer); the catalog's own settings win. Keys come from
    the same environment through pyarrow's S3 client."""
    found: dict[str, str] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and "s3.endpoint" not in settings:
        found["s3.endpoint"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region and not {"s3.region", "client.region"} & set(settings):
        found["s3.region"] = region
    return found


def _without_own_retries(table: Table) -> Table:
    """The table, with pyiceberg's own commit retries off for this process's commits.

    pyiceberg redoes a commit that lost a race by re-applying the same rows on top of the new
    snapshot (appends commute), which would add ids the other writer added meanwhile; this sink
    redoes it itself, after looking at the table again. Only the in-memory copy of the table's
    properties changes: a commit sends its updates, never these properties.
    """
    properties = {**table.metadata.properties, "commit.retry.num-retries": "0"}
    table.metadata = table.metadata.model_copy(update={"properties": properties})
    return table


def _partition_spec(schema: Schema, partition_by: Sequence[str]) -> PartitionSpec:
    """Identity partitions on the `--partition-by` columns, as the Parquet parts are laid out."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    fields = [
        PartitionField(
            source_id=schema.find_field(name).field_id,
            field_id=1000 + i,
            transform=IdentityTransform(),
            name=name,
        )
        for i, name in enumerate(partition_by)
    ]
    return PartitionSpec(*fields)
