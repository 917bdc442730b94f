"""The one answer to "which files in OUTDIR are ctxprec's": only what its records name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.files.objpath import ObjPath, out_path
from ctxprec.storage.outdir import ownership
from tests.fakes.folders import (
    FOREIGN_LAYOUTS,
    USER_FILES_INSIDE,
    assert_untouched,
    checksums,
    plant,
)


def ctxprec_folder(out: Path) -> None:
    """A finished output: manifest, two committed parts (one partitioned), one pending part."""
    state = out / "_ctxprec"
    (state / "parts").mkdir(parents=True)
    (state / "manifest.json").write_text('{"status": "complete"}')
    (state / "run.json").write_text("{}")
    for key, files in {"a": ["part-a.parquet"], "b": ["dt=1/part-b.parquet"]}.items():
        record = {"key": key, "files": files, "rows": 1, "failed": 0}
        (state / "parts" / f"{key}.json").write_text(json.dumps(record))
    (state / "parts" / "c.pending").write_text(
        json.dumps({"key": "c", "files": ["part-c.parquet"]})
    )
    plant(out, {"part-a.parquet": b"a", "dt=1/part-b.parquet": b"b", "part-c.parquet": b"torn"})
    plant(out, {"summary.json": b"{}", "_SUCCESS": b"", ".ctxprec-tmp-1-x-part-a.parquet": b"t"})


def test_only_recorded_files_are_data_and_everything_else_is_foreign(tmp_path: Path) -> None:
    ctxprec_folder(tmp_path)
    plant(tmp_path, USER_FILES_INSIDE)
    assert [p.relative_to(tmp_path).as_posix() for p in ownership.part_files(tmp_path)] == [
        "dt=1/part-b.parquet",
        "part-a.parquet",
    ]
    assert ownership.foreign_files(tmp_path) == sorted(USER_FILES_INSIDE)


def test_torn_parts_and_temp_files_are_removed_nothing_else(tmp_path: Path) -> None:
    ctxprec_folder(tmp_path)
    user = plant(tmp_path, USER_FILES_INSIDE)
    ownership.remove_torn(tmp_path)
    assert not (tmp_path / "part-c.parquet").exists()
    assert not (tmp_path / ".ctxprec-tmp-1-x-part-a.parquet").exists()
    assert (tmp_path / "part-a.parquet").exists()
    assert_untouched(tmp_path, user)


def test_overwrite_removes_exactly_the_recorded_files(tmp_path: Path) -> None:
    ctxprec_folder(tmp_path)
    user = plant(tmp_path, {**USER_FILES_INSIDE, "dt=1/notes.csv": b"mine"})
    ownership.remove_owned(tmp_path)
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(user)
    assert_untouched(tmp_path, user)


@pytest.mark.parametrize("layout", list(FOREIGN_LAYOUTS))
def test_a_folder_without_the_manifest_is_not_claimable(layout: str, tmp_path: Path) -> None:
    plant(tmp_path, FOREIGN_LAYOUTS[layout])
    with pytest.raises(OutputError, match="holds files ctxprec did not write"):
        ownership.check_claimable(tmp_path)


def test_empty_folders_and_bare_state_are_claimable(tmp_path: Path) -> None:
    ownership.check_claimable(tmp_path / "new")
    ownership.check_claimable(tmp_path)
    plant(tmp_path, {"_ctxprec/estimate.json": b"{}", "_ctxprec/lock": b"{}"})
    ownership.check_claimable(tmp_path)


@pytest.mark.parametrize("url", ["hdfs://nn/x", "http://h/x", "hf://datasets/x"])
def test_unknown_urls_are_refused(url: str) -> None:
    with pytest.raises(OutputError, match="is not a storage ctxprec writes to"):
        out_path(url)


@pytest.mark.parametrize("url", ["s3://bkt/k/out", "s3:/bkt/k/out"])
def test_object_store_urls_are_object_paths(url: str) -> None:
    got = out_path(url)
    assert isinstance(got, ObjPath)
    assert got.path == "bkt/k/out"
    assert str(got) == "s3://bkt/k/out"
    assert str(got / "_ctxprec" / "manifest.json") == "s3://bkt/k/out/_ctxprec/manifest.json"


def test_local_paths_pass() -> None:
    assert out_path("out/x") == Path("out/x")
    assert out_path("file:///data/out") == Path("/data/out")
    assert out_path(Path("file:///data/out")) == Path("/data/out")


@pytest.mark.parametrize("suffix", [".pending", ".json"])
@pytest.mark.parametrize("entry", ["../victim.parquet", "ABS", "notes.csv", "part-other.parquet"])
def test_a_record_naming_a_file_that_is_not_its_part_is_refused_and_touches_nothing(
    entry: str, suffix: str, tmp_path: Path
) -> None:
    """A hand-edited or planted record cannot make ctxprec delete or claim a file outside
    OUTDIR, an absolute path or a file not of its part's name: the record is refused, naming
    it, before anything is removed."""
    out = tmp_path / "out"
    ctxprec_folder(out)
    victim = plant(tmp_path, {"victim.parquet": b"user"})
    inside = checksums(out)
    absolute = tmp_path / "victim.parquet"
    bad = {"key": "d", "files": [str(absolute) if entry == "ABS" else entry]}
    (out / "_ctxprec" / "parts" / f"d{suffix}").write_text(
        json.dumps({**bad, "rows": 1, "failed": 0})
    )
    steps = [ownership.remove_torn, ownership.remove_owned, ownership.foreign_files]
    for step in steps + ([ownership.part_files] if suffix == ".json" else []):
        with pytest.raises(OutputError, match=r"parts/d\.(pending|json) names .*not a file"):
            step(out)
    assert_untouched(tmp_path, victim)
    assert_untouched(out, inside)
