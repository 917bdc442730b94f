"""Decompression bombs in Parquet inputs: a 7.7 KB file holding one 200 MB string used 1.1 GB
before the row failed as over the item limit. The column chunks' decompressed sizes in the
footer are checked before a page is read: a chunk that expands past 32 MiB and 1,000 times
its stored size is refused (exit 2, one line naming the file and column), before any judge
call, whichever row group holds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.connectors.sources.files import InputFile
from ctxprec.connectors.sources.formats import check_expansion
from ctxprec.storage.core.errors import InputError
from tests.fakes.inputs import REPO
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeThread
from tests.fakes.runs import high_water_kib, score

BIG = 100 << 20  # one string of 100 MiB: a few KB once zstd-compressed


def bomb_file(path: Path, *, groups: int = 1) -> Path:
    """`groups` row groups of two plain rows, then one row whose only item is BIG bytes."""
    bomb = pa.table({"id": ["x"], "query": ["q"], "contexts": [["x" * BIG]]})
    with pq.ParquetWriter(path, bomb.schema, compression="zstd") as writer:
        for g in range(groups):
            ids = [f"a{g}", f"b{g}"]
            writer.write_table(
                pa.table({"id": ids, "query": ["q", "q"], "contexts": [["c1"], ["c2"]]})
            )
        writer.write_table(bomb)
    assert path.stat().st_size < 64 << 10
    return path


@pytest.mark.parametrize("groups", [0, 3], ids=["first-row-group", "fourth-row-group"])
def test_a_parquet_bomb_is_refused_before_any_judge_call(
    groups: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = bomb_file(tmp_path / "bomb.parquet", groups=groups)
    with FakeJudgeThread(FakeJudgeConfig()) as judge:
        monkeypatch.setenv("OPENAI_BASE_URL", judge.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-bomb-0123456789")
        code = score(
            source, "-o", tmp_path / "out", "--model", "openai/judge-1", "--batch-rows", "2"
        )
        asked = judge.stats.total
    err = capsys.readouterr().err
    assert code == 2, err
    assert asked == 0
    assert "bomb.parquet" in err
    assert "column `contexts.list.element`" in err
    assert "once decompressed" in err
    assert len(err.strip().splitlines()) == 1


def peak_of_a_refused_run(source: Path, tmp_path: Path) -> int:
    """`ctxprec score SOURCE` in its own process, refused (exit 2): its peak memory in KiB."""
    tmp_path.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPREC_")}
    env["CTXPREC_CACHE_DIR"] = str(tmp_path / "memo")
    argv = [sys.executable, "-m", "ctxprec", "score", str(source), "-o", str(tmp_path / "out")]
    with open(tmp_path / "stderr", "w+") as log:
        child = subprocess.Popen([*argv, "--progress", "off"], cwd=REPO, env=env, stderr=log,
                                 stdout=subprocess.DEVNULL, text=True)  # fmt: skip
        peak_kib = high_water_kib(child)
        log.seek(0)
        err = log.read()
    assert child.returncode == 2, err
    return peak_kib


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")
def test_refusing_a_bomb_reads_none_of_it(tmp_path: Path) -> None:
    """The real command in its own process: refusing the bomb peaks as high as refusing a
    small file for a missing column does, not one copy of the 100 MiB value higher."""
    small = tmp_path / "small.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["q"]}), small)
    baseline = peak_of_a_refused_run(small, tmp_path / "small")
    bomb = peak_of_a_refused_run(bomb_file(tmp_path / "bomb.parquet"), tmp_path / "bomb")
    assert bomb - baseline < (BIG >> 10) // 2, f"peak {bomb >> 10} MiB, baseline {baseline >> 10}"


def test_a_bomb_in_a_column_not_read_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "wide.parquet"
    pq.write_table(
        pa.table({"id": ["a"], "query": ["q"], "contexts": [["c"]], "blob": ["y" * BIG]}),
        path,
        compression="zstd",
    )
    file = InputFile(str(path), "parquet", None, path.stat().st_size, 0)
    with pq.ParquetFile(path) as pf:
        check_expansion(pf, file, ["id", "query", "contexts"])
        with pytest.raises(InputError, match="column `blob`"):
            check_expansion(pf, file, None)


def test_compressible_real_data_is_read(tmp_path: Path) -> None:
    """Rows that repeat the same passages (a retriever's usual top-k) compress well, far below
    the bound: the file is scored as usual."""
    passages = [f"Passage {i}: " + "the same background sentence again. " * 40 for i in range(5)]
    rows = 4_000
    source = tmp_path / "repeats.parquet"
    pl.DataFrame(
        {"id": [f"r{i}" for i in range(rows)], "query": ["q"] * rows, "contexts": [passages] * rows}
    ).write_parquet(source, compression="zstd", row_group_size=rows)
    with pq.ParquetFile(source) as pf:
        chunk = pf.metadata.row_group(0).column(2)
        assert chunk.total_uncompressed_size > chunk.total_compressed_size  # it compresses
        check_expansion(pf, InputFile(str(source), "parquet", None, 1, 0), None)
    assert score(source, "-o", tmp_path / "out", "--batch-rows", "2000") == 0
