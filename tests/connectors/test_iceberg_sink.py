"""The Iceberg sink against real pyiceberg: a SQL catalog on SQLite, configured the pyiceberg way
(PYICEBERG_CATALOG__<NAME>__* variables), with the warehouse in a local folder or in the loopback
S3 bucket; part files written the way a run writes them (plain, and Hive-partitioned by `dt`)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from ctxprec.connectors.sinks import SinkResult, parse_sink
from ctxprec.connectors.sinks.iceberg import SNAPSHOT_PROPERTY, IcebergSink
from ctxprec.storage.core.errors import ConfigError, OutputError
from ctxprec.storage.core.seams import Seams
from ctxprec.storage.outdir.schema import output_schema
from tests.connectors.test_sinks import DAYS, SCHEMA, scored, vanishing, write_run
from tests.fakes.inputs import REPO
from tests.fakes.s3_server import S3Server

TABLE = ("analytics", "ctxprec_scores")
# pyiceberg reads its variables once, when first imported: each test configures a catalog of its
# own name, so no test sees another's settings
_NAMES = itertools.count()


class Lake:
    """A configured catalog: the sink's spec, and pyiceberg's own view of the table."""

    def __init__(self, name: str, properties: dict[str, str]) -> None:
        self.name = name
        self.properties = properties
        self.spec = f"iceberg:{name}/{'.'.join(TABLE)}"

    def catalog(self) -> SqlCatalog:
        return SqlCatalog(self.name, **self.properties)

    def table(self) -> Table:
        return self.catalog().load_table(TABLE)

    def exists(self) -> bool:
        try:
            self.table()
        except NoSuchTableError:
            return False
        return True

    def read_back(self, names: list[str] = SCHEMA.names) -> pa.Table:
        """The whole table in `names` order, sorted by id (pyiceberg's reader)."""
        return self.table().scan().to_arrow().select(names).sort_by("id")

    def ids(self) -> list[str]:
        return [str(i) for i in self.table().scan(selected_fields=("id",)).to_arrow()["id"]]


def configure(monkeypatch: pytest.MonkeyPatch, properties: dict[str, str], name: str = "") -> Lake:
    name = name or f"lake{next(_NAMES)}"
    for key, value in properties.items():
        var = key.upper().replace(".", "__").replace("-", "_")
        monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper()}__{var}", value)
    return Lake(name, properties)


@pytest.fixture
def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lake:
    return configure(
        monkeypatch,
        {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"file://{tmp_path}/warehouse",
        },
    )


@pytest.fixture(params=[(), ("dt",)], ids=["plain", "hive"])
def partition_by(request: pytest.FixtureRequest) -> tuple[str, ...]:
    return tuple(request.param)


def rows_equal(got: pa.Table, want: pa.Table) -> None:
    """Same rows, value for value (pyiceberg names a list's child `element`, Parquet `item`)."""
    assert got.column_names == want.column_names
    assert got.to_pylist() == want.to_pylist()


# -- parsing -------------------------------------------------------------------------------------
def test_parse_iceberg_specs() -> None:
    sink = parse_sink("iceberg:lake/analytics.ctxprec_scores")
    assert isinstance(sink, IcebergSink)
    assert sink.name == "iceberg:lake/analytics.ctxprec_scores"
    assert (sink.catalog_name, sink.identifier) == ("lake", TABLE)
    nested = parse_sink("iceberg:prod/a.b.scores")
    assert isinstance(nested, IcebergSink)
    assert nested.namespace == ("a", "b")


@pytest.mark.parametrize(
    "spec",
    ["iceberg:", "iceberg:lake", "iceberg:lake/scores", "iceberg:/ns.scores", "iceberg:lake/ns."],
)
def test_bad_iceberg_specs_are_config_errors(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"iceberg:CATALOG/NAMESPACE\.TABLE|delta:PATH"):
        parse_sink(spec)


def test_import_does_not_load_pyiceberg() -> None:
    code = (
        "import sys, ctxprec.connectors.sinks, ctxprec.cli.main; print('pyiceberg' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


# -- appends -------------------------------------------------------------------------------------
def test_first_append_creates_the_table(
    lake: Lake, partition_by: tuple[str, ...], tmp_path: Path
) -> None:
    sink = parse_sink(lake.spec)
    sink.check(SCHEMA)
    assert not lake.exists()  # check() creates no table
    rows = scored(range(40), 0.25)
    files = write_run(tmp_path / "run1", rows, partition_by)

    result = sink.append(tmp_path / "run1", files, SCHEMA, partition_by)

    assert result == SinkResult(sink.name, rows_added=40, rows_skipped=0)
    rows_equal(lake.read_back(), rows)
    table = lake.table()
    assert [f.name for f in table.spec().fields] == list(partition_by)
    assert all(str(f.transform) == "identity" for f in table.spec().fields)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert snapshot.summary is not None
    assert snapshot.summary[SNAPSHOT_PROPERTY] == sink.name
    assert snapshot.summary["ctxprec.rows"] == "40"
    assert len(table.snapshots()) == 1  # the table and its rows: one commit
    sink.check(SCHEMA)  # the table it made passes its own check


def test_table_types_follow_the_parquet_parts(lake: Lake, tmp_path: Path) -> None:
    sink = parse_sink(lake.spec)
    sink.append(
        tmp_path / "run",
        write_run(tmp_path / "run", scored(range(9), 0.5), ("dt",)),
        SCHEMA,
        ["dt"],
    )

    schema = lake.table().schema()
    types = {f.name: str(f.field_type) for f in schema.fields}
    assert [f.name for f in schema.fields] == SCHEMA.names
    assert types["id"] == "string"
    assert types["dt"] == "string"  # the folder's value as written, like the Parquet parts
    assert types["verdicts"] == "list<boolean>"
    assert types["scored_at"] == "timestamptz"
    assert (types["score"], types["context_count"], types["hit_at_1"]) == (
        "double",
        "long",
        "boolean",
    )
    assert schema.find_field("id").required
    assert not schema.find_field("error").required
    arrow = lake.table().scan().to_arrow()
    for field in SCHEMA:
        assert arrow.schema.field(field.name).type.equals(field.type, check_metadata=False) or (
            pa.types.is_list(field.type)  # same list type, child named `element`
        ), field.name
    per_day = arrow.group_by("dt").aggregate([("id", "count")]).to_pylist()
    assert sorted((r["dt"] or "", r["id_count"]) for r in per_day) == sorted(
        (d or "", 3) for d in DAYS
    )


def test_overlapping_runs_keep_every_id_once(
    lake: Lake, partition_by: tuple[str, ...], tmp_path: Path
) -> None:
    sink = parse_sink(lake.spec)
    first, second = scored(range(40), 0.25), scored(range(30, 70), 0.75)
    sink.append(
        tmp_path / "run1", write_run(tmp_path / "run1", first, partition_by), SCHEMA, partition_by
    )

    result = sink.append(
        tmp_path / "run2",
        write_run(tmp_path / "run2", second, partition_by, parts=3),
        SCHEMA,
        partition_by,
    )

    assert (result.rows_added, result.rows_skipped) == (30, 10)
    table = lake.read_back()
    assert table["id"].to_pylist() == [f"q{i:04d}" for i in range(70)]
    # rows already in the table are kept as they were, never updated
    assert table.to_pylist() == first.to_pylist() + second.slice(10).to_pylist()
    snapshots = len(lake.table().snapshots())
    again = sink.append(
        tmp_path / "run3", write_run(tmp_path / "run3", second, partition_by), SCHEMA, partition_by
    )
    assert (again.rows_added, again.rows_skipped) == (0, 40)
    assert len(lake.ids()) == 70
    assert len(lake.table().snapshots()) == snapshots  # nothing new: no empty snapshot


def test_an_id_in_another_partition_is_not_added_again(lake: Lake, tmp_path: Path) -> None:
    """The same ids scored again under another night (another OUTDIR): each id stays once."""
    first = scored(range(12), 0.25)
    moved = first.set_column(
        first.schema.get_field_index("dt"), "dt", pa.array(["2026-12-01"] * 12)
    )
    sink = parse_sink(lake.spec)
    sink.append(tmp_path / "a", write_run(tmp_path / "a", first, ["dt"]), SCHEMA, ["dt"])

    again = sink.append(tmp_path / "b", write_run(tmp_path / "b", moved, ["dt"]), SCHEMA, ["dt"])

    assert (again.rows_added, again.rows_skipped) == (0, 12)
    rows_equal(lake.read_back(), first)


def test_an_id_twice_in_the_pending_files_is_loaded_once(lake: Lake, tmp_path: Path) -> None:
    rows = scored(range(8), 0.25)
    files = write_run(tmp_path / "a", rows, [], parts=1)
    files += write_run(tmp_path / "b", scored(range(4, 10), 0.75), [], parts=1)
    (tmp_path / "a" / "part-x.parquet").write_bytes((tmp_path / "b" / files[1]).read_bytes())
    files[1] = "part-x.parquet"

    result = parse_sink(lake.spec).append(tmp_path / "a", files, SCHEMA, [])

    assert (result.rows_added, result.rows_skipped) == (10, 4)
    back = lake.read_back()
    assert back["id"].to_pylist() == [f"q{i:04d}" for i in range(10)]
    assert back["score"].to_pylist() == [0.25] * 8 + [0.75] * 2  # the first file's rows won


def test_failed_rows_are_held_back_until_scored(lake: Lake, tmp_path: Path) -> None:
    rows = scored(range(10), 0.5)
    status = pa.array(["failed" if i < 3 else "ok" for i in range(10)])
    with_failed = rows.set_column(rows.schema.get_field_index("status"), "status", status)
    sink = parse_sink(lake.spec)

    first = sink.append(
        tmp_path / "a", write_run(tmp_path / "a", with_failed, ["dt"]), SCHEMA, ["dt"]
    )
    retried = sink.append(tmp_path / "b", write_run(tmp_path / "b", rows, ["dt"]), SCHEMA, ["dt"])

    assert (first.rows_added, retried.rows_added, retried.rows_skipped) == (7, 3, 7)
    rows_equal(lake.read_back(), rows)


@pytest.mark.parametrize("existing", [True, False], ids=["existing-table", "first-use"])
def test_failed_append_leaves_the_table_as_it_was(
    lake: Lake, existing: bool, tmp_path: Path
) -> None:
    sink = parse_sink(lake.spec)
    if existing:
        sink.append(
            tmp_path / "run1", write_run(tmp_path / "run1", scored(range(20), 0.25), ()), SCHEMA, []
        )
        before = lake.table().metadata.current_snapshot_id
    files = write_run(tmp_path / "run2", scored(range(10, 60), 0.75), ("dt",), parts=4)
    pulled: list[int] = []

    with pytest.raises(OutputError, match="vanished mid-load") as info:
        parse_sink(lake.spec, vanishing(pulled)).append(tmp_path / "run2", files, SCHEMA, ["dt"])

    assert pulled == [0, 1]  # one batch was taken before the stream failed
    assert "as it was" in str(info.value)
    if existing:
        assert lake.table().metadata.current_snapshot_id == before
        assert len(lake.ids()) == 20
    else:
        assert not lake.exists()
    # the rerun, files intact, loads all once
    rerun = sink.append(tmp_path / "run2", files, SCHEMA, ["dt"])
    assert rerun.rows_added == (40 if existing else 50)
    assert len(lake.ids()) == (60 if existing else 50)


def test_a_commit_that_loses_a_race_is_redone_without_duplicates(
    lake: Lake, tmp_path: Path
) -> None:
    """Another writer commits ids 30..39 after this append looked at the table and before it
    commits: its commit fails on the stale snapshot, is redone, and skips those ids."""
    sink = parse_sink(lake.spec)
    sink.append(
        tmp_path / "run1", write_run(tmp_path / "run1", scored(range(30), 0.25), ()), SCHEMA, []
    )
    rival = scored(range(30, 40), 0.5)
    calls: list[int] = []

    def rival_commits_first(point: str, held: Any) -> None:
        if point == "sink_held":  # this append has read the ids the table holds
            if not calls:
                lake.table().append(rival)  # another process, committing first
            calls.append(len(held))

    files = write_run(tmp_path / "run2", scored(range(30, 70), 0.75), ())
    racing = parse_sink(lake.spec, Seams(fault=rival_commits_first))

    result = racing.append(tmp_path / "run2", files, SCHEMA, [])

    assert calls == [0, 10]  # looked twice: the second time it saw the rival's ids
    assert (result.rows_added, result.rows_skipped) == (30, 10)
    ids = lake.ids()
    assert sorted(ids) == [f"q{i:04d}" for i in range(70)]
    scores = lake.read_back().filter(pc.field("id") == "q0035")["score"].to_pylist()
    assert scores == [0.5]  # the rival's row stays


def test_a_new_column_evolves_the_table(lake: Lake, tmp_path: Path) -> None:
    """A table written by an older ctxprec (no label columns) takes a newer run's rows: the
    columns are added in the append's commit; the old rows read them as null."""
    old_schema = SCHEMA
    new_schema = output_schema(pa.string(), [pa.field("dt", pa.string())], labels=True)
    sink = parse_sink(lake.spec)
    old = scored(range(5), 0.25)
    sink.append(tmp_path / "old", write_run(tmp_path / "old", old, ["dt"]), old_schema, ["dt"])
    later = scored(range(5, 10), 0.75)
    new = pa.table(
        {
            f.name: (
                pa.array([[True, False]] * 5, f.type)
                if f.name == "label_verdicts"
                else pa.array([0.5] * 5, f.type)
                if f.name == "label_score"
                else later[f.name]
            )
            for f in new_schema
        },
        schema=new_schema,
    )

    sink.check(new_schema)  # no refusal up front
    result = sink.append(
        tmp_path / "new", write_run(tmp_path / "new", new, ["dt"]), new_schema, ["dt"]
    )

    assert result.rows_added == 5
    back = lake.read_back(new_schema.names)
    assert back.slice(0, 5)["label_score"].to_pylist() == [None] * 5
    assert back.slice(5)["label_score"].to_pylist() == [0.5] * 5
    rows_equal(back.slice(5), new)
    types = {f.name: str(f.field_type) for f in lake.table().schema().fields}
    assert (types["label_verdicts"], types["label_score"]) == ("list<boolean>", "double")
    # and the older version still appends to the evolved table (the new columns stay null)
    sink.check(old_schema)
    oldest = scored(range(10, 12), 0.5)
    files = write_run(tmp_path / "older", oldest, ["dt"], parts=1)
    assert sink.append(tmp_path / "older", files, old_schema, ["dt"]).rows_added == 2
    assert lake.read_back(new_schema.names).slice(10)["label_score"].to_pylist() == [None] * 2


def test_many_ids_are_matched_after_the_scan(lake: Lake, tmp_path: Path) -> None:
    """Past the limit of ids pushed into the scan, the run's partitions are scanned and the ids
    matched in Arrow: the same result."""
    sink = parse_sink(lake.spec, Seams(sink_id_filter=5))
    sink.append(
        tmp_path / "a", write_run(tmp_path / "a", scored(range(40), 0.25), ["dt"]), SCHEMA, ["dt"]
    )
    again = sink.append(
        tmp_path / "b",
        write_run(tmp_path / "b", scored(range(30, 70), 0.75), ["dt"]),
        SCHEMA,
        ["dt"],
    )
    assert (again.rows_added, again.rows_skipped) == (30, 10)
    assert sorted(lake.ids()) == [f"q{i:04d}" for i in range(70)]


# -- the warehouse in the object store -------------------------------------------------------
@pytest.mark.parametrize("settings", ["catalog", "environment"])
def test_warehouse_in_the_s3_bucket(
    s3_server: S3Server,
    bucket: str,
    settings: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The object store named by the catalog's s3.* properties, or by the AWS_* environment
    alone (`bucket` points it at the loopback server; its region keeps pyiceberg from asking
    AWS where the bucket is)."""
    env = s3_server.env()
    s3 = {
        "s3.endpoint": env["AWS_ENDPOINT_URL"],
        "s3.access-key-id": env["AWS_ACCESS_KEY_ID"],
        "s3.secret-access-key": env["AWS_SECRET_ACCESS_KEY"],
        "s3.region": env["AWS_REGION"],
    }
    lake = configure(
        monkeypatch,
        {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"s3://{bucket}/warehouse",
            **(s3 if settings == "catalog" else {}),
        },
    )
    lake.properties |= s3  # the test's own reader, as a pyiceberg user would configure it
    sink = parse_sink(lake.spec)
    first, second = scored(range(30), 0.25), scored(range(20, 50), 0.75)
    sink.check(SCHEMA)
    sink.append(tmp_path / "r1", write_run(tmp_path / "r1", first, ["dt"]), SCHEMA, ["dt"])
    again = sink.append(tmp_path / "r2", write_run(tmp_path / "r2", second, ["dt"]), SCHEMA, ["dt"])

    assert (again.rows_added, again.rows_skipped) == (20, 10)
    rows_equal(lake.read_back(), pa.concat_tables([first, second.slice(10)]))
    assert lake.table().location().startswith(f"s3://{bucket}/warehouse/")
    keys = list(_object_keys(s3_server, bucket))
    assert any(k.endswith(".parquet") and "/data/dt=" in k for k in keys)
    assert any(k.endswith(".metadata.json") for k in keys)
    assert "resolve region" not in caplog.text  # nothing asked beyond the loopback server


def _object_keys(s3_server: S3Server, bucket: str) -> Iterator[str]:
    from pyarrow import fs

    selector = fs.FileSelector(f"{bucket}/warehouse", recursive=True)
    for info in s3_server.filesystem().get_file_info(selector):
        if info.type == fs.FileType.File:
            yield info.path


# -- where the catalog's settings come from --------------------------------------------------
def test_catalog_from_pyiceberg_yaml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name = f"yaml{next(_NAMES)}"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".pyiceberg.yaml").write_text(
        f"catalog:\n  {name}:\n    type: sql\n    uri: sqlite:///{tmp_path}/catalog.db\n"
        f"    warehouse: file://{tmp_path}/warehouse\n"
    )
    monkeypatch.setenv("PYICEBERG_HOME", str(home))
    lake = Lake(
        name,
        {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"},
    )
    rows = scored(range(6), 0.5)

    parse_sink(lake.spec).append(tmp_path / "r", write_run(tmp_path / "r", rows, []), SCHEMA, [])

    rows_equal(lake.read_back(), rows)
    assert (tmp_path / "warehouse" / "analytics" / "ctxprec_scores").is_dir()


def test_catalog_name_with_an_underscore(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PYICEBERG_CATALOG__NIGHT_LAKE__* names the catalog `night-lake` (pyiceberg reads `_` as
    `-`): the sink finds it under either spelling."""
    lake = configure(
        monkeypatch,
        {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/w"},
        name=f"night_lake{next(_NAMES)}",
    )
    rows = scored(range(6), 0.5)
    for spelling in (lake.name, lake.name.replace("_", "-")):
        sink = parse_sink(f"iceberg:{spelling}/{'.'.join(TABLE)}")
        sink.append(tmp_path / spelling, write_run(tmp_path / spelling, rows, []), SCHEMA, [])
    rows_equal(lake.read_back(), rows)


# -- check: refused before the run ---------------------------------------------------------------
def test_unknown_catalog_is_a_config_error() -> None:
    sink = parse_sink(f"iceberg:nowhere{next(_NAMES)}/ns.scores")
    with pytest.raises(ConfigError, match="is not configured") as info:
        sink.check(SCHEMA)
    assert "PYICEBERG_CATALOG__NOWHERE" in str(info.value)


def test_misconfigured_and_unreachable_catalogs_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    no_uri = configure(monkeypatch, {"type": "sql"})
    with pytest.raises(ConfigError, match="misconfigured: URI missing"):
        parse_sink(no_uri.spec).check(SCHEMA)
    unreachable = configure(
        monkeypatch, {"type": "sql", "uri": f"sqlite:///{tmp_path}/no/such/folder/catalog.db"}
    )
    with pytest.raises(OutputError, match="cannot reach Iceberg catalog"):
        parse_sink(unreachable.spec).check(SCHEMA)
    closed_port = configure(monkeypatch, {"type": "rest", "uri": "http://127.0.0.1:9"})
    with pytest.raises(OutputError, match="cannot reach Iceberg catalog"):
        parse_sink(closed_port.spec).check(SCHEMA)


def test_pyiceberg_missing_is_a_config_error(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyiceberg", None)
    with pytest.raises(ConfigError, match="needs the `pyiceberg` package"):
        parse_sink(lake.spec).check(SCHEMA)


def test_existing_table_that_cannot_take_the_rows_is_refused(lake: Lake, tmp_path: Path) -> None:
    catalog = lake.catalog()
    catalog.create_namespace(TABLE[0])
    foreign = pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("score", pa.string()),  # another tool's idea of a score
            pa.field("owner", pa.string(), nullable=False),  # required, ctxprec never writes it
        ]
    )
    catalog.create_table(TABLE, foreign).append(
        pa.table({"id": ["x"], "score": ["high"], "owner": ["ml"]}, schema=foreign)
    )
    sink = parse_sink(lake.spec)

    with pytest.raises(OutputError) as info:
        sink.check(SCHEMA)

    message = str(info.value)
    assert "required column(s) ctxprec does not write: owner" in message
    assert "score (table string, output double)" in message
    assert "new table" in message
    files = write_run(tmp_path / "run", scored(range(5), 0.5), ())
    with pytest.raises(OutputError, match="owner"):
        sink.append(tmp_path / "run", files, SCHEMA, [])
    assert lake.ids() == ["x"]
