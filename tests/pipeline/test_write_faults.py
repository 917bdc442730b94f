"""Faults while writing: a full disk or a read-only folder while writing a part, a commit record,
the summary, the memo, the verdict store or a sink. The run stops with a one-line message (exit
2; a sink's failure is exit 1 with the Parquet output complete), nothing half-written is taken for
done, and the same command finishes once there is room. Faults come from the operating system's
side: `os.replace`, the rename that makes each of ctxprec's writes visible, fails for the files a
test picks (product code has no test seam); and, where this machine allows mounting, from a real
small tmpfs.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.core.seams import Seams
from ctxprec.storage.files import layout
from ctxprec.storage.outdir.verdicts import VerdictStore
from tests.fakes.folders import assert_untouched, committed_files, plant, remount, tmpfs
from tests.fakes.inputs import write_input
from tests.fakes.judge_server import FakeJudgeServer
from tests.fakes.runs import score

HTTP = ("--model", "openai/judge-1", "--batch-rows", "4")
ROWS = 12


REAL_REPLACE = os.replace


def full_disk_on(
    match: Callable[[Path], bool], after: int = 0, code: int = errno.ENOSPC
) -> Callable[..., None]:
    """An `os.replace` failing like a full disk (or `code`) for the writes `match` picks, from the
    `after`-th one on; any other rename is done."""
    seen = [0]

    def replace(src: str | Path, dst: str | Path, **kw: object) -> None:
        if match(Path(dst)):
            seen[0] += 1
            if seen[0] > after:
                raise OSError(code, os.strerror(code), str(dst))
        REAL_REPLACE(src, dst, **kw)  # type: ignore[arg-type]

    return replace


def temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.startswith(".ctxprec-tmp-")]


def rows_of(out: Path) -> int:
    return int(json.loads((out / "summary.json").read_text())["rows"]["total"])


FAULTS: dict[str, tuple[Callable[[Path], bool], int]] = {
    "part": (lambda p: p.name.startswith("part-"), 1),
    "commit_record": (lambda p: p.parent.name == "parts" and p.suffix == ".json", 1),
    "summary": (lambda p: p.name == "summary.json", 0),
    "final_manifest": (lambda p: p.name == "manifest.json", 1),
}


@pytest.mark.parametrize("where", list(FAULTS))
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS], ids=["ENOSPC", "EROFS"])
def test_a_failed_write_stops_cleanly_and_the_same_command_finishes(
    where: str,
    code: int,
    tmp_path: Path,
    fake: FakeJudgeServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source, out = write_input(tmp_path / "in.parquet", range(ROWS)), tmp_path / "out"
    match, after = FAULTS[where]
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", full_disk_on(match, after, code))
        assert score(source, "-o", out, *HTTP) == 2
    err = capsys.readouterr().err
    reason = "no space left on the device" if code == errno.ENOSPC else "read-only"
    assert err.startswith("ctxprec: error: cannot write "), err
    assert reason in err, err
    assert "run the same command again" in err
    assert "Traceback" not in err
    assert err.count("\n") == 1
    assert temp_files(out) == []
    assert not (out / "_SUCCESS").exists()
    for rel in committed_files(out):  # what the records call done is complete and readable
        assert pq.read_table(out / rel).num_rows > 0
    paid = set(fake.stats.items)
    assert score(source, "-o", out, *HTTP) == 0
    assert rows_of(out) == ROWS
    assert (out / "_SUCCESS").exists()
    assert all(fake.stats.items[item] == 1 for item in paid)  # no finished call paid twice


def test_user_files_stay_byte_identical_through_a_failed_run(
    tmp_path: Path, fake: FakeJudgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, out = write_input(tmp_path / "in.parquet", range(ROWS)), tmp_path / "out"
    assert score(source, "-o", out, *HTTP) == 0
    before = plant(out, {"mine.parquet": b"PAR1 not really", "notes/a.txt": b"a"})
    source = write_input(tmp_path / "in2.parquet", range(ROWS, ROWS + 8))
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", full_disk_on(lambda p: "part-" in p.name))
        assert score(source, "-o", out, *HTTP, "--incremental") == 2
    assert_untouched(out, before)
    assert score(source, "-o", out, *HTTP, "--incremental") == 0
    assert_untouched(out, before)
    assert rows_of(out) == ROWS + 8


def test_the_verdict_store_keeps_no_torn_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = VerdictStore(tmp_path / "v", flush_s=0)
    monkeypatch.setattr(os, "replace", full_disk_on(lambda p: True))
    with pytest.raises(OutputError, match="no space left on the device"):
        store.append([("k1", (True, "r", 1, 1))])
    assert list((tmp_path / "v").iterdir()) == []
    monkeypatch.setattr(os, "replace", REAL_REPLACE)
    store.append([("k2", (False, "r", 1, 1))])
    assert sorted(k for k, _ in VerdictStore(tmp_path / "v").read()) == ["k1", "k2"]


# ---------------------------------------------------------------- a real small file system


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    try:
        with tmpfs(tmp_path / "mnt", size="1m") as where:
            yield where
    except OSError as exc:  # not root, or no mount rights in this container
        pytest.skip(f"cannot mount a tmpfs here ({exc}); the write seam covers these faults")


def fill(folder: Path, leave: int) -> Path:
    """A filler file taking all but about `leave` bytes of the file system."""
    free = shutil.disk_usage(folder).free
    filler = folder / "filler.bin"
    with filler.open("wb") as fh:
        fh.write(b"\0" * max(0, free - leave))
    return filler


def test_output_on_a_full_file_system(
    small_fs: Path, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = write_input(tmp_path / "in.parquet", range(40)), small_fs / "out"
    filler = fill(small_fs, leave=24 * 1024)
    assert score(source, "-o", out, *HTTP) == 2
    err = capsys.readouterr().err
    assert "no space left on the device" in err, err
    assert "Traceback" not in err, err
    assert temp_files(out) == []
    assert not (out / "_SUCCESS").exists()
    filler.unlink()
    assert score(source, "-o", out, *HTTP) == 0
    assert rows_of(out) == 40


def test_output_on_a_read_only_file_system(
    small_fs: Path, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = write_input(tmp_path / "in.parquet", range(8)), small_fs / "out"
    assert score(source, "-o", out, *HTTP) == 0
    more = write_input(tmp_path / "more.parquet", range(8, 12))
    remount(small_fs, "ro")
    try:
        assert score(more, "-o", out, *HTTP, "--incremental") == 2
    finally:
        remount(small_fs, "rw")
    err = capsys.readouterr().err
    assert "read-only" in err, err
    assert "Traceback" not in err, err
    assert fake.stats.total == 8 * 2  # refused before the first judge call of the second run
    assert score(more, "-o", out, *HTTP, "--incremental") == 0
    assert rows_of(out) == 12


def test_memo_on_a_full_file_system(
    small_fs: Path, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = write_input(tmp_path / "in.parquet", range(60)), tmp_path / "out"
    cache = small_fs / "memo"
    assert main(["estimate", str(source)]) == 0  # warm imports; no judge call
    cache.mkdir()
    filler = fill(small_fs, leave=160 * 1024)
    code = score(source, "-o", out, *HTTP, "--cache-dir", cache)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "cannot write the memo in" in err, err
    assert "Traceback" not in err, err
    filler.unlink()
    assert score(source, "-o", out, *HTTP, "--cache-dir", cache) == 0
    assert rows_of(out) == 60


def test_duckdb_sink_on_a_full_file_system(
    small_fs: Path, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = write_input(tmp_path / "in.parquet", range(ROWS)), tmp_path / "out"
    wh = small_fs / "wh.duckdb"
    filler = fill(small_fs, leave=4 * 1024)
    assert score(source, "-o", out, *HTTP, "--sink", f"duckdb:{wh}:scores") == 1
    err = capsys.readouterr().err
    assert "ctxprec: sink failed: duckdb:" in err, err
    assert "Traceback" not in err, err
    assert rows_of(out) == ROWS  # the Parquet output is complete
    filler.unlink()
    wh.unlink(missing_ok=True)
    calls = fake.stats.total
    assert score(source, "-o", out, *HTTP, "--sink", f"duckdb:{wh}:scores") == 0
    assert fake.stats.total == calls
    count = duckdb.connect(str(wh)).execute("SELECT count(*) FROM scores").fetchone()
    assert count == (ROWS,)


def test_a_writer_killed_during_the_run_leaves_nothing_in_the_finished_output(
    tmp_path: Path, fake: FakeJudgeServer
) -> None:
    """What a worker killed while writing a part leaves behind (its temp file, a pending record
    and a torn part no commit names; its task is done again elsewhere) is gone once the run is
    marked finished, so `OUTDIR/*.parquet` reads as the scored rows and nothing else."""
    source, out = write_input(tmp_path / "in.parquet", range(ROWS)), tmp_path / "out"
    assert score(source, "-o", out, *HTTP) == 0
    mine = plant(out, {"notes/a.txt": b"the user's"})
    source = write_input(tmp_path / "in2.parquet", range(ROWS, ROWS + 8))
    left: list[Path] = []

    def killed_beside(point: str, target: object) -> None:  # a dead writer's leftovers
        if point == "part_write" and not left and isinstance(target, Path):
            torn = out / "part-dead.parquet"
            layout.pending_record(out, "dead").write_text(
                json.dumps({"key": "dead", "files": [torn.name]})
            )
            torn.write_bytes(b"PAR1\x00\x00")
            left.extend([torn, target.with_name(f".ctxprec-tmp-4999999-0badf00d-{target.name}")])
            left[-1].write_bytes(b"PAR1\x15\x00")

    seams = Seams(fault=killed_beside)
    assert score(source, "-o", out, *HTTP, "--incremental", seams=seams) == 0
    assert left
    assert not any(p.exists() for p in left)
    assert temp_files(out) == []
    assert list((out / "_ctxprec" / "parts").glob(f"*{layout.PENDING}")) == []
    assert pl.read_parquet(out / "*.parquet").height == ROWS + 8
    assert_untouched(out, mine)
