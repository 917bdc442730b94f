"""Output folders through the real CLI: a folder another tool wrote is refused whatever its file
names; files a user adds inside a ctxprec output survive the same command, --overwrite and
--incremental byte for byte; an interrupted folder is explained; checks that need no judge
(output URL scheme, sink extras) refuse before the first request."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.dataset as ds
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.core.seams import Seams
from ctxprec.storage.outdir.ownership import part_files
from tests.fakes.folders import (
    FOREIGN_LAYOUTS,
    USER_FILES_INSIDE,
    assert_untouched,
    checksums,
    committed_files,
    plant,
)
from tests.fakes.inputs import write_input
from tests.fakes.judge_server import FakeJudgeServer
from tests.fakes.runs import score

HTTP = ("--model", "openai/judge-1")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def rows_in_summary(out: Path) -> int:
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return int(summary["rows"]["total"])


# ---------------------------------------------------------------- folders other tools wrote


@pytest.mark.parametrize("flags", [[], ["--overwrite"], ["--incremental"]], ids=lambda f: f"{f}")
@pytest.mark.parametrize("layout", list(FOREIGN_LAYOUTS))
def test_folder_written_by_another_tool_is_refused(
    layout: str,
    flags: list[str],
    tmp_path: Path,
    fake: FakeJudgeServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, out = write_input(tmp_path / "in.parquet", range(3)), tmp_path / "out"
    before = plant(out, FOREIGN_LAYOUTS[layout])
    assert score(source, "-o", out, *HTTP, *flags) == 2
    err = capsys.readouterr().err
    assert f"output folder {out} holds files ctxprec did not write (" in err
    assert any(name in err for name in FOREIGN_LAYOUTS[layout]), err
    assert "choose a new or empty folder" in err
    assert "Traceback" not in err
    assert fake.stats.total == 0
    assert checksums(out) == before  # nothing changed, nothing added (no lock, no state)


def test_state_folder_of_a_saved_estimate_is_not_foreign(
    tmp_path: Path, fake: FakeJudgeServer
) -> None:
    source, out = write_input(tmp_path / "in.parquet", range(3)), tmp_path / "out"
    assert main(["estimate", str(source), *HTTP, "-o", str(out)]) == 0
    assert score(source, "-o", out, *HTTP) == 0
    assert rows_in_summary(out) == 3


# ---------------------------------------------------------------- user files inside an output


def _first_run(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    source, out = write_input(tmp_path / "in.parquet", range(6)), tmp_path / "out"
    args = [*HTTP, "--passthrough", "dt", "--partition-by", "dt"]
    assert score(source, "-o", out, *args) == 0
    return source, out, args


@pytest.mark.parametrize("flag", ["same", "--overwrite", "--incremental"])
def test_user_files_inside_an_output_survive_every_rerun(
    flag: str, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out, args = _first_run(tmp_path)
    ours_before = committed_files(out)
    user = {**USER_FILES_INSIDE, "dt=2024-01-01/notes.csv": b"inside a partition of ours\n"}
    before = plant(out, user)
    capsys.readouterr()
    extra = [] if flag == "same" else [flag]
    if flag == "--incremental":  # new ids, same configuration
        source = write_input(tmp_path / "more.parquet", range(6, 9))
    assert score(source, "-o", out, *args, *extra) == 0
    err = capsys.readouterr().err
    assert_untouched(out, before)
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1, err
    assert f"{len(user)} file(s) ctxprec did not write" in warnings[0]
    assert "Traceback" not in err
    total = 9 if flag == "--incremental" else 6
    assert rows_in_summary(out) == total  # the user's Parquet files are not counted as rows
    assert set(committed_files(out)) >= (ours_before if flag != "--overwrite" else set())
    ids = pl.read_parquet(part_files(out), hive_partitioning=True).get_column("id")
    assert sorted(ids) == sorted(f"r{i}" for i in range(total))


def test_overwrite_removes_exactly_the_recorded_files(
    tmp_path: Path, fake: FakeJudgeServer
) -> None:
    _, out, args = _first_run(tmp_path)
    ours = committed_files(out)
    before = plant(out, {"dt=2024-01-01/notes.csv": b"keep\n", "dt=2099-01-01/x.txt": b"k"})
    other = write_input(tmp_path / "other.parquet", range(100, 102), dt="2030-01-01")
    assert score(other, "-o", out, *args, "--overwrite") == 0
    assert_untouched(out, before)
    assert not any((out / rel).exists() for rel in ours)  # the old run's parts are gone
    assert (out / "dt=2024-01-01").is_dir()  # it still holds the user's notes.csv
    assert rows_in_summary(out) == 2


def test_readers_recommended_by_the_readme_beside_user_files(
    tmp_path: Path, fake: FakeJudgeServer
) -> None:
    """The README's glob readers read ctxprec's rows beside files that are not Parquet; with
    the user's own Parquet files inside OUTDIR, `part_files` reads exactly ctxprec's rows."""
    _, out, _ = _first_run(tmp_path)
    plant(out, {"notes.csv": b"a,b\n", "dt=2024-01-01/notes.txt": b"mine"})
    got = pl.read_parquet(f"{out}/**/*.parquet", hive_partitioning=True)
    assert got.height == 6
    con = duckdb.connect()
    count = con.execute(f"SELECT count(*) FROM read_parquet('{out}/**/*.parquet')").fetchone()
    assert count == (6,)
    table = ds.dataset(str(out), format="parquet", exclude_invalid_files=True).to_table()
    assert table.num_rows == 6
    plant(out, {k: v for k, v in USER_FILES_INSIDE.items() if k.endswith(".parquet")})
    exact = pl.read_parquet(part_files(out), hive_partitioning=True)
    assert exact.height == 6
    assert exact.get_column("dt").cast(pl.String).unique().to_list() == ["2024-01-01"]
    listed = ", ".join(f"'{p}'" for p in part_files(out))
    assert con.execute(f"SELECT count(*) FROM read_parquet([{listed}])").fetchone() == (6,)


def test_incremental_with_a_foreign_parquet_ignores_it(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = write_input(tmp_path / "in.parquet", range(4)), tmp_path / "out"
    assert score(source, "-o", out, *HTTP, "--incremental") == 0
    spark, hive = FOREIGN_LAYOUTS["spark"], FOREIGN_LAYOUTS["hive"]
    before = plant(out, {"theirs.parquet": spark["part-00000-abc.snappy.parquet"]})
    before |= plant(out, {"sub/events.parquet": hive["dt=2024-01-01/events.parquet"]})
    capsys.readouterr()
    more = write_input(tmp_path / "more.parquet", range(2, 7))
    assert score(more, "-o", out, *HTTP, "--incremental") == 0
    err = capsys.readouterr().err
    assert err.count("warning") == 1, err
    assert "ColumnNotFound" not in err, err
    assert_untouched(out, before)
    assert rows_in_summary(out) == 7


# ---------------------------------------------------------------- interrupted folders


def test_summary_of_an_interrupted_run_says_how_to_resume(
    tmp_path: Path,
    fake: FakeJudgeServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, out = write_input(tmp_path / "in.parquet", range(5)), tmp_path / "out"

    def interrupted(point: str, _: object) -> None:
        if point == "finish":  # Ctrl-C once every part is committed, before the summary
            raise KeyboardInterrupt

    seams = Seams(fault=interrupted)
    assert score(source, "-o", out, *HTTP, "--batch-rows", "2", seams=seams) == 130
    calls = fake.stats.total
    capsys.readouterr()
    assert main(["summary", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out} holds an interrupted ctxprec run" in err
    assert "5 rows in 3 committed parts" in err
    assert "run the same `ctxprec score` command again" in err
    assert "holds no ctxprec run" not in err
    assert "Traceback" not in err
    assert score(source, "-o", out, *HTTP, "--batch-rows", "2") == 0
    assert fake.stats.total == calls  # the resumed run judged nothing again
    assert main(["summary", str(out)]) == 0


# ---------------------------------------------------------------- checked before paying


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("s3://bucket/scores", "cannot access s3://bucket/scores"),
        ("hdfs://nn/x", "hdfs:// is not a storage ctxprec writes to"),
        ("http://host/x", "http:// is not a storage ctxprec writes to"),
    ],
)
def test_unreachable_or_unknown_output_url_is_refused_before_anything(
    url: str,
    says: str,
    tmp_path: Path,
    fake: FakeJudgeServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")  # nobody there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIATEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-secret")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    source = write_input(tmp_path / "in.parquet", range(3))
    assert score(source, "-o", url, *HTTP) == 2
    err = capsys.readouterr().err
    assert says in err
    assert fake.stats.total == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]  # no `s3:` folder


@pytest.mark.parametrize(
    ("module", "sink"),
    [("duckdb", "duckdb:{tmp}/wh.duckdb:scores"), ("deltalake", "delta:{tmp}/lake")],
)
def test_sink_without_its_extra_is_refused_before_any_judge_call(
    module: str,
    sink: str,
    tmp_path: Path,
    fake: FakeJudgeServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import duckdb` now raises ImportError
    source, out = write_input(tmp_path / "in.parquet", range(3)), tmp_path / "out"
    assert score(source, "-o", out, *HTTP, "--sink", sink.format(tmp=tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"needs the `{module}` package, which is not installed" in err
    assert "pip install 'ctxprec[warehouse]'" in err
    assert "internal error" not in err
    assert fake.stats.total == 0
    assert not out.exists()


def test_wait_lock_flag_forms() -> None:
    from ctxprec.cli.main import build_parser

    parse = build_parser().parse_args
    assert parse(["score", "in", "-o", "out"]).wait_lock == 0.0  # default: exit 2 at once
    assert parse(["score", "in", "-o", "out", "--wait-lock"]).wait_lock == 3600.0
    assert parse(["score", "in", "-o", "out", "--wait-lock", "90"]).wait_lock == 90.0
