"""A committed part is checked against its commit record (size, CRC-32, rows, schema) before
it is trusted. A part truncated, rewritten with random bytes, with another schema or with fewer
rows is scored again by a re-run (its rows are known from the input) and named in one line,
exit 2, by `summary`, `compare` and `view`, which change nothing. Records written before the
checks are checked by what they carry."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.outdir.dataset import drop_ids
from ctxprec.storage.outdir.ownership import incomplete_parts
from ctxprec.storage.report.table import RowTable
from tests.fakes.inputs import write_input
from tests.fakes.runs import score

ROWS = 40
RUN = ["--batch-rows", "20"]  # two parts of 20 rows


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("parts")
    source, out = write_input(root / "in.parquet", range(ROWS)), root / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CTXPREC_CACHE_DIR", str(root / "memo"))
        assert score(source, "-o", out, *RUN) == 0
    return source, out


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _random_same_size(path: Path) -> None:
    path.write_bytes(random.Random(1).randbytes(path.stat().st_size))


def _random_middle(path: Path) -> None:
    """Bytes changed inside the data pages: size and footer as they were."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = random.Random(2).randbytes(16)
    path.write_bytes(bytes(data))


def _other_schema(path: Path) -> None:
    """The same number of rows, other columns."""
    rows = pq.read_metadata(path).num_rows
    pq.write_table(pa.table({"id": [f"x{i}" for i in range(rows)], "n": list(range(rows))}), path)


def _fewer_rows(path: Path) -> None:
    """A real part of ctxprec's schema, with 5 of its 20 rows."""
    pl.read_parquet(path).head(5).write_parquet(path, compression="zstd")


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "empty": lambda p: p.write_bytes(b""),
    "random bytes": _random_same_size,
    "bytes changed inside": _random_middle,
    "other schema": _other_schema,
    "5 of 20 rows": _fewer_rows,
}


def _copy(original: Path, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(original, out)
    return out


def _damage(out: Path, name: str) -> Path:
    part = sorted(out.glob("part-*.parquet"))[1]
    DAMAGES[name](part)
    return part


def _tree(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _refused(code: int, err: str, *named: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("ctxprec: ")]
    assert len(lines) == 1, err
    assert lines[0].startswith("ctxprec: error: "), err
    assert "Traceback" not in err, err
    assert all(name in lines[0] for name in named), err


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_part_is_scored_again_by_a_rerun(
    damage: str,
    finished: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, original = finished
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "memo"))
    out = _copy(original, tmp_path)
    part = _damage(out, damage)
    capsys.readouterr()
    assert score(source, "-o", out, *RUN) == 0
    err = capsys.readouterr().err
    assert f"missing or damaged (first: {part}: " in err, err
    assert "with 20 row(s); they are scored again" in err, err
    assert (out / "_SUCCESS").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"]["total"] == ROWS
    assert pl.read_parquet(sorted(out.glob("part-*.parquet"))).height == ROWS
    assert incomplete_parts(out) == {}  # the part written again passes its record's checks
    assert main(["summary", str(out)]) == 0


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_summary_compare_and_view_name_a_damaged_part_and_change_nothing(
    damage: str,
    finished: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, original = finished
    out = _copy(original, tmp_path)
    part = _damage(out, damage)
    before = _tree(out)
    capsys.readouterr()
    _refused(main(["summary", str(out)]), capsys.readouterr().err, str(part), "20 row(s)")
    _refused(main(["compare", str(original), str(out)]), capsys.readouterr().err, str(part))
    _refused(main(["view", str(out), "--port", "0"]), capsys.readouterr().err, str(part))
    with pytest.raises(OutputError, match="missing or damaged"):
        RowTable(out)
    assert _tree(out) == before


def _strip_checks(out: Path) -> None:
    for record in (out / "_ctxprec" / "parts").glob("*.json"):
        body = json.loads(record.read_text())
        body.pop("checks")
        record.write_text(json.dumps(body))


@pytest.mark.parametrize("damage", ["truncated", "random bytes", "5 of 20 rows"])
def test_records_from_before_the_checks_are_checked_by_what_they_carry(
    damage: str, finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, original = finished
    out = _copy(original, tmp_path)
    _strip_checks(out)
    assert main(["summary", str(out)]) == 0  # intact parts under old records read as before
    part = _damage(out, damage)
    capsys.readouterr()
    _refused(main(["summary", str(out)]), capsys.readouterr().err, str(part))


def test_records_keep_what_each_file_is(finished: tuple[Path, Path]) -> None:
    _, out = finished
    for path in sorted((out / "_ctxprec" / "parts").glob("*.json")):
        record = json.loads(path.read_text())
        (rel,) = record["files"]
        checks = record["checks"][rel]
        data = (out / rel).read_bytes()
        assert checks["bytes"] == len(data)
        assert checks["rows"] == record["rows"] == 20
        assert int(checks["crc32"], 16) == __import__("zlib").crc32(data)
        assert len(checks["schema"]) == 16


def test_rows_dropped_for_a_rescore_update_their_record(
    finished: tuple[Path, Path], tmp_path: Path
) -> None:
    """An --incremental run drops the failed rows it scores again from their parts: their
    records then say what the parts hold, so the next check finds nothing wrong."""
    _, original = finished
    out = _copy(original, tmp_path)
    assert drop_ids(out, ["r3", "r25", "r26"]) == 3
    records = [json.loads(p.read_text()) for p in sorted((out / "_ctxprec/parts").glob("*.json"))]
    assert [r["rows"] for r in records] == [19, 18]
    assert incomplete_parts(out) == {}


def test_a_damaged_part_in_an_object_store_is_named(
    bucket: str, s3_server: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.fakes.s3_server import S3Server

    assert isinstance(s3_server, S3Server)
    source = write_input(tmp_path / "in.parquet", range(ROWS))
    out = f"s3://{bucket}/scores"
    assert score(source, "-o", out, *RUN) == 0
    fs = s3_server.filesystem()
    name = sorted(
        i.path
        for i in fs.get_file_info(pa.fs.FileSelector(f"{bucket}/scores"))
        if i.path.endswith(".parquet")
    )[1]
    with fs.open_input_stream(name) as stream:
        data = stream.read()
    s3_server.put(name, data[: len(data) // 2])
    capsys.readouterr()
    _refused(main(["summary", out]), capsys.readouterr().err, name.rsplit("/", 1)[-1])
    assert score(source, "-o", out, *RUN) == 0
    assert main(["summary", out]) == 0


def test_estimate_counts_the_rows_of_a_damaged_part_as_to_do(
    finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, original = finished
    out = _copy(original, tmp_path)
    part = _damage(out, "truncated")
    before = _tree(out)
    capsys.readouterr()
    assert main(["estimate", str(source), "-o", str(out), "--incremental", "--json"]) == 0
    captured = capsys.readouterr()
    assert f"missing or damaged (first: {part}: " in captured.err, captured.err
    est = json.loads(captured.out)
    assert est["rows_already_scored"] == ROWS - 20
    assert est["rows_to_judge"] == 20
    assert {k: v for k, v in _tree(out).items() if k != "_ctxprec/estimate.json"} == before
