"""Planted state and symbolic links cannot lead ctxprec outside OUTDIR: a record naming a file
behind a link, a pending record doing the same, a planted manifest in the home folder, a
partition folder swapped for a link; each is refused in one line (exit 2), and nothing outside
OUTDIR (nor inside it) is changed. In an object store, records name only ctxprec's parts."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.fakes.folders import checksums
from tests.fakes.inputs import write_input
from tests.fakes.runs import score

PARTITIONED = ["--passthrough", "dt", "--partition-by", "dt"]


def _outside(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder outside OUTDIR (as $HOME would be) holding files of ctxprec's own names."""
    home = tmp_path / "home"
    files = {"x": b"mine", "part-k.parquet": b"mine too", ".bashrc": b"mine as well"}
    for name, data in files.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_bytes(data)
    return home, checksums(home)


def _finished(tmp_path: Path, *flags: str) -> tuple[Path, Path]:
    source, out = write_input(tmp_path / "in.parquet", range(4)), tmp_path / "out"
    assert score(source, "-o", out, *flags) == 0
    return source, out


def _plant_record(out: Path, suffix: str, files: list[str]) -> Path:
    record = {"key": "k", "files": files, "rows": 1, "failed": 0}
    path = out / "_ctxprec" / "parts" / f"k{suffix}"
    path.write_text(json.dumps(record))
    return path


def _refused(code: int, err: str, *named: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("ctxprec: error:")]
    assert len(lines) == 1, err
    assert all(name in lines[0] for name in named), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("suffix", "flags"), [(".json", ["--overwrite"]), (".pending", []), (".json", [])]
)
@pytest.mark.parametrize("entry", ["lnk/x", "lnk=1/part-k.parquet"])
def test_a_record_naming_a_file_behind_a_link_deletes_nothing(
    entry: str,
    suffix: str,
    flags: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home, before = _outside(tmp_path)
    source, out = _finished(tmp_path)
    (out / entry.split("/")[0]).symlink_to(home, target_is_directory=True)
    record = _plant_record(out, suffix, [entry])
    inside = checksums(out)
    capsys.readouterr()
    _refused(score(source, "-o", out, *flags), capsys.readouterr().err, str(record))
    assert checksums(home) == before
    assert checksums(out) == inside  # `_SUCCESS` too: a finished output stays finished


def test_a_planted_manifest_does_not_make_the_home_folder_overwritable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home, _ = _outside(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    state = home / "_ctxprec"
    (state / "parts").mkdir(parents=True)
    (state / "manifest.json").write_text(json.dumps({"status": "complete", "describe": {}}))
    _plant_record(home, ".json", ["part-k.parquet"])
    before = checksums(home)
    source = write_input(tmp_path / "in.parquet", range(2))
    capsys.readouterr()
    _refused(score(source, "-o", home, "--overwrite"), capsys.readouterr().err, "home folder")
    assert checksums(home) == before


@pytest.mark.parametrize("flags", [["--incremental"], [], ["--overwrite"]])
def test_a_partition_folder_swapped_for_a_link_is_never_written_through(
    flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home, before = _outside(tmp_path)
    _, out = _finished(tmp_path, *PARTITIONED)
    partition = out / "dt=2024-01-01"
    partition.rename(tmp_path / "moved-away")
    partition.symlink_to(home, target_is_directory=True)
    more = write_input(tmp_path / "more.parquet", range(4, 8))
    inside = checksums(out)
    capsys.readouterr()
    _refused(score(more, "-o", out, *PARTITIONED, *flags), capsys.readouterr().err, "link")
    assert checksums(home) == before
    assert checksums(out) == inside


@pytest.mark.parametrize("name", ["_ctxprec", "_ctxprec/parts", "charts", "_SUCCESS"])
def test_a_state_folder_or_fixed_file_that_is_a_link_is_refused(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home, before = _outside(tmp_path)
    source, out = _finished(tmp_path)
    target = out / name
    if target.is_dir():
        target.rename(tmp_path / "moved-away")
        target.symlink_to(home, target_is_directory=True)
    else:
        target.unlink(missing_ok=True)
        target.symlink_to(home / "x")
    capsys.readouterr()
    _refused(score(source, "-o", out), capsys.readouterr().err, str(target))
    assert checksums(home) == before


def test_a_record_whose_part_is_gone_scores_its_rows_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = _finished(tmp_path, "--batch-rows", "2")
    gone = sorted(out.glob("part-*.parquet"))[0]
    gone.unlink()
    capsys.readouterr()
    assert score(source, "-o", out, "--batch-rows", "2") == 0
    err = capsys.readouterr().err
    assert "1 part file(s)" in err, err
    assert "with 2 row(s); they are scored again" in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"]["total"] == 4
    assert gone.is_file()


def test_summary_names_the_rows_of_a_missing_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ctxprec.cli.main import main

    _, out = _finished(tmp_path, "--batch-rows", "2")
    sorted(out.glob("part-*.parquet"))[0].unlink()
    capsys.readouterr()
    code = main(["summary", str(out)])
    _refused(code, capsys.readouterr().err, "missing", "2 row(s)", "run the same `ctxprec score`")
    assert (out / "_SUCCESS").is_file()


@pytest.mark.parametrize("entry", ["../elsewhere/part-k.parquet", "notes.csv", "part-x.parquet"])
def test_object_store_records_name_only_their_parts_inside_the_prefix(
    entry: str, bucket: str, s3_server: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.fakes.s3_server import S3Server

    assert isinstance(s3_server, S3Server)
    source = write_input(tmp_path / "in.parquet", range(2))
    out = f"s3://{bucket}/scores"
    assert score(source, "-o", out) == 0
    s3_server.put(f"{bucket}/elsewhere/part-k.parquet", b"theirs")
    s3_server.put(f"{bucket}/scores/notes.csv", b"theirs")
    record = {"key": "k", "files": [entry], "rows": 1, "failed": 0}
    s3_server.put(f"{bucket}/scores/_ctxprec/parts/k.json", json.dumps(record).encode())
    capsys.readouterr()
    _refused(score(source, "-o", out, "--overwrite"), capsys.readouterr().err, "parts/k.json")
    fs = s3_server.filesystem()
    for key in ("elsewhere/part-k.parquet", "scores/notes.csv", "scores/_SUCCESS"):
        assert fs.get_file_info(f"{bucket}/{key}").is_file, key


def _snapshot(folder: Path) -> dict[str, str]:
    """Every entry below `folder` (never followed): a file's bytes, a link's target, a folder."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            out[rel] = f"link -> {os.readlink(path)}"
        elif path.is_dir():
            out[rel] = "folder"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _plant_temp_links(out: Path, home: Path) -> list[Path]:
    top = out / ".ctxprec-tmp-123-abcd-summary.json"
    top.symlink_to(home / "x")
    deep = out / "dt=2024-01-01" / ".ctxprec-tmp-9-ffff-part-k.parquet"
    deep.parent.mkdir(exist_ok=True)
    deep.symlink_to(home / ".bashrc")
    return [top, deep]


@pytest.mark.parametrize("flags", [[], ["--overwrite"], ["--incremental"]])
def test_a_planted_temp_file_link_stops_the_run_before_anything_changes(
    flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home, before = _outside(tmp_path)
    source, out = _finished(tmp_path, *PARTITIONED)
    links = _plant_temp_links(out, home)
    inside = _snapshot(out)
    capsys.readouterr()
    code = score(source, "-o", out, *PARTITIONED, *flags)
    err = capsys.readouterr().err
    _refused(code, err, str(links[0]), "1 more path(s) to fix", str(links[1]))
    assert _snapshot(out) == inside  # `_SUCCESS` and the manifest too: nothing changed
    assert checksums(home) == before


WRONG_KINDS = {
    "_SUCCESS": "folder",
    "summary.json": "folder",
    "_ctxprec/run.json": "folder",
    "_ctxprec/parts": "file",
    "charts": "file",
    "part": "folder",  # a part file a commit record names
}


@pytest.mark.parametrize("flags", [[], ["--overwrite"]])
@pytest.mark.parametrize("name", list(WRONG_KINDS))
def test_a_path_of_the_wrong_kind_stops_the_run_before_anything_changes(
    name: str, flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = _finished(tmp_path)
    target = sorted(out.glob("part-*.parquet"))[0] if name == "part" else out / name
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    if WRONG_KINDS[name] == "folder":
        (target / "inner").mkdir(parents=True)
    else:
        target.write_text("a file where ctxprec keeps a folder\n")
    inside = _snapshot(out)
    capsys.readouterr()
    _refused(score(source, "-o", out, *flags), capsys.readouterr().err, str(target))
    assert _snapshot(out) == inside


def test_summary_checks_the_tree_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ctxprec.cli.main import main

    home, before = _outside(tmp_path)
    _, out = _finished(tmp_path)
    (out / "summary.md").unlink()
    (out / "summary.md").mkdir()
    links = _plant_temp_links(out, home)
    inside = _snapshot(out)
    capsys.readouterr()
    _refused(main(["summary", str(out)]), capsys.readouterr().err, str(links[0]))
    assert _snapshot(out) == inside
    assert checksums(home) == before
