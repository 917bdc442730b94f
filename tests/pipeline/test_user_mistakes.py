"""Mistakes on the command line are the user's to fix, not ctxprec's bugs: each is exit 2 with
one line, found before anything is written (no folder, no `_ctxprec/` left behind)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctxprec.cli.main import main
from tests.fakes.folders import checksums, remount, tmpfs
from tests.fakes.inputs import write_input
from tests.fakes.runs import score


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sides")
    sides = []
    for name in ("a", "b"):
        out = root / f"out-{name}"
        assert score(write_input(root / f"{name}.parquet", range(6)), "-o", out) == 0
        sides.append(out)
    return sides[0], sides[1]


def _one_line(code: int, err: str, *named: str) -> str:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("ctxprec: ")]
    assert len(lines) == 1, err
    assert lines[0].startswith("ctxprec: error: "), err
    assert "internal error" not in err, err
    assert "Traceback" not in err, err
    assert all(name in lines[0] for name in named), err
    return lines[0]


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


@pytest.mark.parametrize("target", ["afile", "afile/sub", "afile/sub/deeper"])
def test_compare_into_a_file_is_refused_in_one_line(
    target: str, outputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("mine\n")
    before = _tree(tmp_path)
    capsys.readouterr()
    code = main(["compare", *map(str, outputs), "-o", str(tmp_path / target)])
    _one_line(code, capsys.readouterr().err, str(tmp_path / target))
    assert _tree(tmp_path) == before
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_compare_where_no_folder_can_be_made_is_refused_in_one_line(
    outputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    capsys.readouterr()
    code = main(["compare", *map(str, outputs), "-o", "/proc/ctxprec-compare"])
    _one_line(code, capsys.readouterr().err, "/proc/ctxprec-compare")


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    try:
        with tmpfs(tmp_path / "ro", size="1m") as where:
            (where / "kept").mkdir()
            remount(where, "ro")
            yield where
    except OSError as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc})")


@pytest.mark.parametrize("target", ["kept", "new", "new/deeper"])
def test_compare_on_a_read_only_file_system_is_refused_in_one_line(
    target: str, read_only: Path, outputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = main(["compare", *map(str, outputs), "-o", str(read_only / target)])
    line = _one_line(code, capsys.readouterr().err, str(read_only / target))
    assert "read-only" in line
    assert _tree(read_only) == ["kept"]


def test_compare_makes_a_missing_folder_and_leaves_nothing_when_refused(
    outputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "reports" / "night"
    assert main(["compare", *map(str, outputs), "-o", str(target)]) == 0
    assert (target / "compare.json").is_file()
    # a folder that is a score output is refused before the probe leaves anything in it
    before = checksums(outputs[0])
    code = main(["compare", *map(str, outputs), "-o", str(outputs[0])])
    _one_line(code, capsys.readouterr().err, str(outputs[0]))
    assert checksums(outputs[0]) == before
    assert not [p for p in outputs[0].iterdir() if p.name.startswith(".ctxprec-tmp-")]


def test_a_partition_column_named_twice_is_refused_before_the_folder_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = write_input(tmp_path / "in.parquet", range(4)), tmp_path / "out"
    capsys.readouterr()
    code = score(source, "-o", out, "--passthrough", "dt", "--partition-by", "dt,dt")
    _one_line(code, capsys.readouterr().err, "--partition-by", "each named once")
    assert not out.exists()


def test_a_memo_folder_that_cannot_be_made_is_refused_before_the_output_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    source, out = write_input(tmp_path / "in.parquet", range(4)), tmp_path / "out"
    capsys.readouterr()
    code = score(source, "-o", out, "--cache-dir", "/proc/ctxprec-memo")
    line = _one_line(code, capsys.readouterr().err, "/proc/ctxprec-memo", "--no-memo")
    assert "free some space" not in line
    assert not out.exists()
